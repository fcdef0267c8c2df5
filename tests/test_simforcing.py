"""SimForcing core: conditioning, objective, scheduler, guidance, data, checkpoints, tiny train +
infer, DDP."""

import copy
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from sim_video_world_model import metrics
from sim_video_world_model.backbones import build_backbone
from sim_video_world_model.checkpoint import ModelBundle, load_bundle, save_bundle
from sim_video_world_model.config import (
    LADDER,
    BackboneConfig,
    ObjectiveConfig,
    Variant,
)
from sim_video_world_model.evaluate import (
    EvalConfig,
    Protocol,
    Scorer,
    baseline_predictions,
    check_protocol_splits,
    choose,
    motion_gap,
    predict,
    protocol_data,
    score_test,
    validate,
    verdict,
)
from sim_video_world_model.evaluate import main as eval_main
from sim_video_world_model.metrics import frechet_distance
from sim_video_world_model.objective import StudentObjective, corrupt_sim_latent, latent_motion
from sim_video_world_model.paired_data import (
    PairedVideoDataset,
    PairedWindows,
    SyntheticWorldConfig,
    check_disjoint,
    normalize_actions,
    synthetic_pairs,
)
from sim_video_world_model.pipeline import SimForcingPipeline
from sim_video_world_model.scheduler import FlowMatchScheduler, warmup_cosine
from sim_video_world_model.train import (
    LOSS_LOG,
    RunConfig,
    ScarceRealDataset,
    make_student,
    record_train_episodes,
    run,
)
from simforcing_helpers import TINY, tiny_run_config


def tiny_backbone(seed=0):
    torch.manual_seed(seed)
    ae, den = build_backbone(BackboneConfig(kind="tiny", action_dim=7, tiny=TINY))
    with torch.no_grad():  # a "trained" teacher: non-zero output layer
        den.proj_out.weight.normal_(0, 0.2)
    return ae.eval(), den.eval()


def inputs(batch=2, frames=3, size=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, frames, size, size, generator=g)
    t = torch.tensor([300.0, 800.0][:batch])
    a = torch.rand(batch, 8, 7, generator=g) * 2 - 1
    s = torch.randn(batch, 4, frames, size, size, generator=g)
    return x, t, a, s


def test_zero_init_conditioning_leaves_student_identical_to_teacher():
    _, teacher = tiny_backbone()
    student = make_student(teacher, Variant.FULL)
    assert student.sim_conditioning is not None and teacher.sim_conditioning is None
    x, t, a, s = inputs()
    with torch.no_grad():
        ref = teacher(x, t, a)
        out = student(x, t, a, sim_latent=s, gate=torch.ones(2))
    assert ref.abs().max() > 0
    assert torch.equal(out, ref)


def test_gate_zero_disables_conditioning_and_its_gradient():
    _, teacher = tiny_backbone()
    student = make_student(teacher, Variant.FULL)
    with torch.no_grad():
        for conv in student.sim_conditioning.projections:
            conv.weight.normal_()
            conv.bias.fill_(0.3)
    x, t, a, s = inputs()
    plain = student(x, t, a)
    gated_off = student(x, t, a, sim_latent=s, gate=torch.zeros(2))
    assert torch.equal(plain, gated_off)
    gated_off.sum().backward()
    for conv in student.sim_conditioning.projections:
        assert conv.weight.grad.abs().sum() == 0 and conv.bias.grad.abs().sum() == 0
    # The gate is per sample: switching it on for sample 1 only changes sample 1.
    mixed = student(x, t, a, sim_latent=s, gate=torch.tensor([0.0, 1.0]))
    assert torch.equal(mixed[0], plain[0]) and not torch.allclose(mixed[1], plain[1])


def test_motion_is_adjacent_differences_with_first_frame_excluded():
    x0_hat = torch.arange(2 * 1 * 4 * 1 * 1, dtype=torch.float32).view(2, 1, 4, 1, 1) ** 2
    clean = torch.full_like(x0_hat, -5.0)
    m = latent_motion(x0_hat, clean)
    assert m.shape[2] == 3
    assert torch.equal(m[:, :, 0], x0_hat[:, :, 1] - clean[:, :, 0])
    assert torch.equal(m[:, :, 1:], x0_hat[:, :, 2:] - x0_hat[:, :, 1:-1])
    changed = x0_hat.clone()
    changed[:, :, 0] = 123.0  # the model's frame-0 estimate never enters the target
    assert torch.equal(latent_motion(changed, clean), m)


def test_a_static_scene_has_zero_latent_motion_whatever_it_looks_like():
    # Frame 0 goes through the group encoder too: a static video has one latent in every latent
    # frame, so latent motion (the distillation target) is zero for a black sim background and a
    # textured real table alike, not an encoder offset that depends on the content.
    ae, _ = tiny_backbone()
    ae.requires_grad_(False)
    torch.manual_seed(3)
    scenes = [torch.full((1, 3, 1, 16, 16), -1.0), torch.rand(1, 3, 1, 16, 16) * 2 - 1]
    for scene in scenes:
        z = ae.encode(scene.expand(-1, -1, 9, -1, -1))
        assert z.shape[2] == 3
        torch.testing.assert_close(latent_motion(z, z), torch.zeros_like(z[:, :, 1:]))
    moving = scenes[1].expand(-1, -1, 9, -1, -1).clone()
    moving[:, :, 5:, :4, :4] = 1.0  # something moves in the second group: motion there only
    m = latent_motion(ae.encode(moving), ae.encode(moving))
    assert float(m[:, :, 0].abs().max()) < 1e-5 and float(m[:, :, 1].abs().max()) > 1e-3


def test_motion_gap_is_zero_on_static_cells_and_measures_the_moving_ones():
    ae, _ = tiny_backbone()
    ae.requires_grad_(False)
    torch.manual_seed(4)
    sim = torch.full((2, 3, 9, 32, 32), -1.0)  # the robot over black
    real = (torch.rand(2, 3, 1, 32, 32) * 2 - 1).expand(-1, -1, 9, -1, -1).clone()  # a table
    for t in range(9):  # the same square moves right in both; the real one lags a pixel behind
        sim[:, :, t, :4, t : t + 4] = 1.0
        real[:, :, t, :4, max(t - 1, 0) : max(t - 1, 0) + 4] = 1.0
    rows = motion_gap(ae, sim, real)
    assert [(r["step"], r["cells"]) for r in rows] == [
        (1, "moving"),
        (1, "static"),
        (2, "moving"),
        (2, "static"),
    ]
    for moving, static in (rows[:2], rows[2:]):
        # latent rows 0..3 and columns 0..5 are within 3 cells of the square's path (8 x 8 cells)
        assert static["gap"] < 1e-14 and static["fraction"] == pytest.approx(1 - 24 / 64)
        # the lag and the backgrounds under the square differ: a gap where both streams move
        assert moving["gap"] > 1e-8 and moving["real"] > 1e-8 and moving["sim"] > 1e-8
    same = motion_gap(ae, real, real)
    assert all(r["gap"] == 0.0 for r in same)


def test_a_checkpoint_of_another_format_is_refused_with_what_to_do(tmp_path):
    ae, den = tiny_backbone()
    path = str(tmp_path / "ck")
    save_bundle(path, ModelBundle(ae, den, BackboneConfig(kind="tiny", tiny=TINY), {}))
    assert load_bundle(path).backbone.tiny == TINY
    cfg_file = os.path.join(path, "config.json")
    with open(cfg_file) as f:
        config = json.load(f)
    config["format_version"] = 1  # the tiny autoencoder had a separate first-frame encoder
    with open(cfg_file, "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="format 1, expected 2; train it again"):
        load_bundle(path)


def test_student_objective_shares_noise_and_time_across_domains():
    # With identical latents in both domains and the student equal to the teacher (zero-init
    # projections), both motion terms vanish exactly only if noise and flow time are shared.
    _, teacher = tiny_backbone()
    student = make_student(teacher, Variant.FULL)
    z = torch.randn(3, 4, 3, 8, 8)
    a = torch.rand(3, 8, 7)
    obj = StudentObjective(ObjectiveConfig(variant=Variant.FULL))
    loss, m = obj(student, teacher, z, z.clone(), a, torch.Generator().manual_seed(0))
    assert (
        m["motion_real"] < 1e-9 and m["motion_sim"] < 1e-9
    )  # batched [real; sim]: float round-off only
    assert m["fm_real"] == pytest.approx(m["fm_sim"], rel=1e-6)
    loss.backward()
    assert (
        student.sim_conditioning.projections[0].weight.grad.abs().sum() > 0
    )  # the gated path learns
    # the SFT rung uses neither the sim stream nor the teacher
    loss_sft, m_sft = StudentObjective(ObjectiveConfig(variant=Variant.SFT))(
        make_student(teacher, Variant.SFT),
        None,
        z,
        torch.zeros_like(z),
        a,
        torch.Generator().manual_seed(0),
    )
    assert m_sft["fm_sim"] == 0.0 and m_sft["motion_real"] == 0.0
    with pytest.raises(ValueError, match="teacher"):
        obj(student, None, z, z, a)
    # the off-ladder row: the full student without motion distillation needs no teacher, keeps
    # joint FM and the gated conditioning
    no_motion = make_student(teacher, Variant.NO_MOTION)
    loss_nm, m_nm = StudentObjective(ObjectiveConfig(variant=Variant.NO_MOTION))(
        no_motion, None, z, z.clone(), a, torch.Generator().manual_seed(0)
    )
    assert m_nm["motion_real"] == 0.0 and m_nm["motion_sim"] == 0.0 and m_nm["fm_sim"] > 0
    assert 0.0 <= m_nm["frac_cond_on"] <= 1.0 and no_motion.sim_conditioning is not None
    assert [v.value for v in LADDER] == ["sft", "joint_fm", "motion", "full"]


def test_corruption_probability_and_range():
    z = torch.ones(200, 2, 2, 2, 2)
    cfg = ObjectiveConfig(corrupt_prob=0.0)
    assert torch.equal(corrupt_sim_latent(z, cfg), z)
    out = corrupt_sim_latent(z, ObjectiveConfig(corrupt_prob=1.0), torch.Generator().manual_seed(0))
    # alpha in [0.5, 0.9] and |(1 - alpha) sigma eta| small: every sample is changed, mean near
    # alpha
    per_sample_mean = out.mean(dim=(1, 2, 3, 4))
    assert (out != z).all()
    assert per_sample_mean.min() > 0.35 and per_sample_mean.max() < 1.05
    with pytest.raises(ValueError, match="corrupt_alpha"):
        ObjectiveConfig(corrupt_alpha=(0.9, 0.5))


def test_scheduler_shift_weight_and_exact_euler():
    sch = FlowMatchScheduler(shift=5.0)
    u = torch.tensor([0.0, 0.5, 1.0])
    assert torch.allclose(sch.shift_sigma(u), torch.tensor([0.0, 2.5 / 3.0, 1.0]))
    table = sch.shift_sigma(torch.linspace(1, 0, 1000))
    assert sch.loss_weight(table).mean() == pytest.approx(1.0, abs=1e-4)
    assert sch.loss_weight(torch.tensor([0.5])) > sch.loss_weight(torch.tensor([0.0]))
    x0, noise = torch.randn(2, 3), torch.randn(2, 3)
    x = noise.clone()
    sigmas = sch.inference_sigmas(4)
    for i in range(4):  # the exact velocity of the straight path recovers x0 with any step count
        x = sch.step(x, sch.velocity_target(x0, noise), float(sigmas[i]), float(sigmas[i + 1]))
    assert torch.allclose(x, x0, atol=1e-6)
    assert warmup_cosine(0, 100, 0.05) == pytest.approx(0.2) and warmup_cosine(99, 100, 0.05) < 0.01


class CallCounter:
    def __init__(self, module):
        self.calls = []
        module.register_forward_pre_hook(
            lambda m, args, kwargs: self.calls.append(kwargs.get("sim_latent") is not None),
            with_kwargs=True,
        )


def test_guidance_w0_w1_equal_the_branches_and_pass_counts():
    ae, teacher = tiny_backbone()
    student = make_student(teacher, Variant.FULL)
    with torch.no_grad():
        for conv in student.sim_conditioning.projections:
            conv.weight.normal_(0, 0.5)
    pipe = SimForcingPipeline(ae, student, FlowMatchScheduler())
    x, t, a, s = inputs()
    with torch.no_grad():
        uncond, cond = student(x, t, a), student(x, t, a, sim_latent=s, gate=torch.ones(2))
        assert torch.equal(pipe.guided_velocity(x, t, a, s, 0.0), uncond)
        assert torch.equal(pipe.guided_velocity(x, t, a, None, 0.0), uncond)
        assert torch.equal(pipe.guided_velocity(x, t, a, s, 1.0), cond)
        assert torch.allclose(pipe.guided_velocity(x, t, a, s, 0.3), uncond + 0.3 * (cond - uncond))
        assert torch.allclose(pipe.guided_velocity(x, t, a, s, 2.0), 2 * cond - uncond)
    counter = CallCounter(student)
    frame = torch.rand(1, 3, 16, 16) * 2 - 1
    acts = torch.rand(1, 4, 7)
    mask = torch.zeros(1, 16, 16, dtype=torch.bool)
    pipe(frame, acts, 5, robot_mask=mask, sim_steps=2, real_steps=3, guidance=1.0)
    assert counter.calls == [
        False,
        False,
        True,
        True,
        True,
    ]  # N_s sim passes, then ONE pass per real step
    counter.calls.clear()
    out = pipe(
        frame, acts, 5, sim_steps=2, real_steps=3, guidance=0.0
    )  # no mask needed: no sim stage
    assert counter.calls == [False, False, False] and out.sim_latents is None
    counter.calls.clear()
    pipe(frame, acts, 5, robot_mask=mask, sim_steps=1, real_steps=2, guidance=0.6)
    assert counter.calls == [False, True, False, True, False]
    assert out.video.shape == (1, 3, 5, 16, 16)
    with pytest.raises(ValueError, match="robot_mask"):
        pipe(frame, acts, 5, guidance=0.6)
    with pytest.raises(ValueError, match="actions"):
        pipe(frame, torch.rand(1, 3, 7), 5, guidance=0.0)
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="finite and >= 0"):
            pipe(frame, acts, 5, robot_mask=mask, guidance=bad)


def test_paired_windows_roundtrip_and_normalisation(tmp_path):
    w = synthetic_pairs(
        2, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=3
    )
    assert (
        w.sim.shape == (4, 5, 16, 16, 3)
        and w.actions.shape == (4, 4, 7)
        and w.mask.shape == (4, 16, 16)
    )
    assert w.mask.any(axis=(1, 2)).all()
    # the sim stream is the robot-only rendering: black outside the robot
    assert (w.sim[:, 0][~w.mask] == 0).mean() > 0.9
    path = str(tmp_path / "pairs.h5")
    w.save(path)
    back = PairedWindows.load(path)
    assert np.array_equal(back.real, w.real) and back.meta["source"] == "synthetic"
    item = PairedVideoDataset(back)[0]
    assert (
        item["real"].shape == (3, 5, 16, 16)
        and -1.0 <= item["real"].min()
        and item["real"].max() <= 1.0
    )
    assert item["actions"].abs().max() <= 1.0
    assert np.allclose(normalize_actions(w.action_low, w.action_low, w.action_high), -1.0)
    with pytest.raises(ValueError, match="one per transition"):
        PairedWindows(
            w.sim, w.real, w.actions[:, :3], w.mask, w.action_low, w.action_high, w.episodes
        )
    with pytest.raises(ValueError, match="episode seeds"):
        PairedWindows(w.sim, w.real, w.actions, w.mask, w.action_low, w.action_high, w.episodes[:1])
    assert np.array_equal(back.episodes, w.episodes) and len(set(w.episodes.tolist())) == 2


def small_pairs(episodes: int, seed: int) -> PairedWindows:
    return synthetic_pairs(
        episodes, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=seed
    )


def test_an_episode_is_a_function_of_its_seed_and_splits_must_not_share_one(tmp_path):
    one, three = small_pairs(1, seed=0), small_pairs(3, seed=0)
    # the first episode of a generation seed is the same however many follow it
    n = len(one)
    assert np.array_equal(three.real[:n], one.real) and np.array_equal(
        three.episodes[:n], one.episodes
    )
    other = small_pairs(2, seed=1)
    check_disjoint({"train": three, "test": other})  # different generation seeds: disjoint
    with pytest.raises(ValueError, match=r"train and validation share 1 episode\(s\)") as err:
        check_disjoint({"train": three, "validation": one, "test": other})
    assert str(int(one.episodes[0])) in str(err.value) and "test" not in str(err.value)
    # recorded seeds (a run's training episodes) check the same way
    with pytest.raises(ValueError, match="run and test share 2"):
        check_disjoint({"run": other.episodes.tolist(), "test": other})
    # the data command refuses to write a split that repeats an episode of another
    first = str(tmp_path / "train.h5")
    three.save(first)
    from sim_video_world_model.paired_data import main as data_main  # noqa: PLC0415

    args = ["--source", "synthetic", "--episodes", "1", "--steps", "8", "--size", "16"]
    with pytest.raises(ValueError, match="share 1 episode"):
        data_main([*args, "--seed", "0", "--out", str(tmp_path / "v.h5"), "--disjoint-from", first])
    assert not (tmp_path / "v.h5").exists()
    data_main([*args, "--seed", "7", "--out", str(tmp_path / "v.h5"), "--disjoint-from", first])
    assert len(PairedWindows.load_episodes(str(tmp_path / "v.h5"))) > 0
    # a file without episode seeds (version 1) is refused with what to do
    import h5py  # noqa: PLC0415

    with h5py.File(tmp_path / "v.h5", "r+") as f:
        f.attrs["version"] = 1
    for load in (PairedWindows.load, PairedWindows.load_episodes):
        with pytest.raises(ValueError, match="version 1, expected 2.*generate it again"):
            load(str(tmp_path / "v.h5"))


def test_a_run_keeps_the_episodes_it_trained_on_and_refuses_others(tmp_path):
    out = str(tmp_path / "run")
    os.makedirs(out)
    a, b = small_pairs(2, seed=0), small_pairs(2, seed=1)
    record_train_episodes(out, a, "a.h5")
    record_train_episodes(out, a, "a.h5")  # the same episodes again (a resumed run): fine
    with pytest.raises(ValueError, match="trained on other episodes"):
        record_train_episodes(out, b, "b.h5")


def read_losses(stage_dir: str) -> list[dict]:
    with open(os.path.join(stage_dir, LOSS_LOG)) as f:
        return [json.loads(line) for line in f]


def test_concat_keeps_windows_in_order_and_widens_action_statistics():
    a = synthetic_pairs(
        2, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=0
    )
    b = synthetic_pairs(
        2, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=1
    )
    both = PairedWindows.concat([a, b])
    assert len(both) == len(a) + len(b)
    assert np.array_equal(both.real[: len(a)], a.real) and np.array_equal(both.sim[len(a) :], b.sim)
    assert np.array_equal(both.actions[len(a) :], b.actions)
    assert np.array_equal(both.action_low, np.minimum(a.action_low, b.action_low))
    assert np.array_equal(both.action_high, np.maximum(a.action_high, b.action_high))
    with pytest.raises(ValueError, match="nothing"):
        PairedWindows.concat([])


def test_heldout_actions_scale_with_the_models_statistics():
    w = synthetic_pairs(
        2, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=0
    )
    low, high = w.action_low - 1.0, w.action_high + 1.0  # a training file's wider range
    own, model = PairedVideoDataset(w), PairedVideoDataset(w, (low, high))
    expected = normalize_actions(w.actions[0], low, high)
    assert np.allclose(model[0]["actions"].numpy(), expected)
    assert not torch.allclose(own[0]["actions"], model[0]["actions"])


def test_scarce_real_dataset_cycles_the_few_real_windows_under_every_sim_window():
    w = synthetic_pairs(
        3, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=0
    )
    data, real = PairedVideoDataset(w), PairedVideoDataset(w.subset(slice(0, 2)))
    mixed = ScarceRealDataset(data, real)
    assert len(mixed) == len(w) > 2
    for i in range(len(w)):
        assert torch.equal(mixed[i]["sim"], data[i]["sim"])
        assert torch.equal(mixed[i]["real"], data[i % 2]["real"])


def test_verdict_needs_the_full_student_above_every_baseline_and_sft_row():
    def row(variant, psnr, moving, w=0.0, method=None):
        return {
            "method": method or variant,
            "variant": variant,
            "student": None if variant == "baseline" else f"student_{variant}",
            "w": None if variant == "baseline" else w,
            "psnr": psnr,
            "psnr_moving": moving,
        }

    table = [
        row("baseline", 24.0, 12.7, method="copy"),
        row("sft", 23.0, 13.0, method="sft base"),
        row("sft", 24.5, 13.5, method="sft teacher"),
        row("full", 24.0, 14.0, w=0.6),
        row("full", 25.0, 13.2, w=1.0),
    ]
    v = verdict(table, 0.6)
    assert v["full_beats_baselines_moving"] is True
    # whole-frame AND moving-pixel PSNR: 24.0 < 24.5 loses to the teacher-started SFT
    assert v["full_beats_sft"] == {"sft base": True, "sft teacher": False}
    assert "winner" not in v  # the verdict reports; choosing is `choose`'s, on validation
    assert verdict(table, 1.0)["full_beats_sft"] == {"sft base": True, "sft teacher": False}
    assert verdict(table, 1.0)["full_beats_baselines_moving"] is True
    table[0]["psnr_moving"] = 14.5  # a baseline above the full student on the moving pixels
    assert verdict(table, 0.6)["full_beats_baselines_moving"] is False
    assert "full_beats_sft" not in verdict(table[:3], 0.6)  # no full row: no verdict


def test_the_served_row_balances_the_moving_and_the_static_pixels():
    def row(method, variant, moving, static, w=0.0):
        return {
            "method": method,
            "variant": variant,
            "student": None if variant == "baseline" else f"student_{variant}",
            "w": w,
            "psnr_moving": moving,
            "psnr_static": static,
        }

    table = [
        row("copy", "baseline", 13.0, 40.0),  # baselines are never served
        row("full w=0.6", "full", 15.4, 27.0, 0.6),  # best on the moving pixels alone
        row("no motion w=0.3", "no_motion", 15.3, 27.4, 0.3),  # best on both together
        row("sft", "sft", None, 30.0),
    ]
    served = choose(table)
    assert served == {
        "method": "no motion w=0.3",
        "student": "student_no_motion",
        "variant": "no_motion",
        "w": 0.3,
        "selection_score": pytest.approx((15.3 + 27.4) / 2),
    }
    assert choose(table[:1]) is None and choose(table[3:]) is None


@pytest.mark.e2e
def test_scarce_real_protocol_trains_the_teacher_on_all_sim_and_students_on_the_real_few(
    tmp_path,
):
    data = str(tmp_path / "pairs.h5")
    w = synthetic_pairs(
        4, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=0
    )
    w.save(data)
    cfg = tiny_run_config(steps=2, batch_size=4, real_windows=4)
    out = str(tmp_path / "run")
    run(
        cfg,
        data,
        out,
        ["autoencoder", "teacher", "student"],
        [Variant.SFT],
        resume=False,
        sft_inits=("base", "teacher"),
    )
    base = load_bundle(os.path.join(out, "student_sft"))
    from_teacher = load_bundle(os.path.join(out, "student_sft_teacher"))
    assert base.info["init"] == "base" and from_teacher.info["init"] == "teacher"
    assert base.info["real_windows"] == 4 and base.info["sim_windows"] == len(w) > 4
    with open(os.path.join(out, "run_config.json")) as f:
        assert RunConfig.from_json(json.load(f)).real_windows == 4
    with pytest.raises(ValueError, match="real_windows"):
        run(
            RunConfig(backbone=BackboneConfig(tiny=TINY), real_windows=len(w) + 1),
            data,
            str(tmp_path / "bad"),
            ["autoencoder"],
            [],
            resume=False,
        )


@pytest.mark.e2e
def test_tiny_train_then_infer_and_resume(tmp_path):
    data = str(tmp_path / "pairs.h5")
    synthetic_pairs(
        4, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=0
    ).save(data)
    cfg = tiny_run_config(steps=3, batch_size=4, save_every=2)
    out = str(tmp_path / "run")
    run(cfg, data, out, ["autoencoder", "teacher", "student"], [Variant.FULL], resume=False)
    teacher = load_bundle(os.path.join(out, "teacher"))
    student = load_bundle(os.path.join(out, "student_full"))
    assert student.info["variant"] == "full" and student.denoiser.sim_conditioning is not None
    # the student moved away from the teacher, its projections away from zero
    assert any(p.abs().sum() > 0 for p in student.denoiser.sim_conditioning.parameters())
    with open(os.path.join(out, "student_full", "train_state.json")) as f:
        state = json.load(f)
    assert state["step"] == 3 and state["complete"]
    # the per-term loss log: one record per log step, each term separately, and the terms
    # recompose the logged loss with the objective's weights
    records = read_losses(os.path.join(out, "student_full"))
    assert [r["step"] for r in records] == [1, 2, 3]
    o = cfg.objective
    for r in records:
        assert all(r[k] > 0 for k in ("fm_real", "fm_sim", "motion_real"))
        # the student starts as the teacher: no sim->sim motion gap before its first update
        assert (r["motion_sim"] < 1e-9) == (r["step"] == 1)
        recomposed = o.lambda_video * 0.5 * (
            o.lambda_real * r["fm_real"] + o.lambda_sim * r["fm_sim"]
        ) + o.lambda_delta * 0.5 * (
            o.lambda_real * r["motion_real"] + o.lambda_sim * r["motion_sim"]
        )
        assert r["loss"] == pytest.approx(recomposed, rel=1e-5)
    assert all(r["loss"] == r["fm_sim"] for r in read_losses(os.path.join(out, "teacher")))
    # the real-only baseline starts from the base backbone, not from the teacher
    run(cfg, data, out, ["student"], [Variant.SFT], resume=False)
    sft = load_bundle(os.path.join(out, "student_sft"))
    assert (
        sft.info["init"] == "base"
        and student.info["init"] == "teacher"
        and sft.denoiser.sim_conditioning is None
    )
    w = PairedWindows.load(data)
    item = PairedVideoDataset(w)[0]
    pipe = SimForcingPipeline(student.autoencoder, student.denoiser, FlowMatchScheduler())
    video = pipe(
        item["real"][:, 0][None],
        item["actions"][None],
        5,
        robot_mask=item["mask"][None],
        sim_steps=1,
        real_steps=2,
        guidance=0.6,
    ).video
    assert video.shape == (1, 3, 5, 16, 16) and torch.isfinite(video).all()
    # evaluation: table rows for both students, the w sweep, the latency grid and the PNG

    ecfg = EvalConfig(
        sim_steps=1,
        real_steps=2,
        sweep=(0.0, 1.0),
        latency_sim_steps=(1,),
        latency_real_steps=(1, 2),
        latency_guidance=(0.0, 1.0),
        latency_reps=1,
        guidance=1.0,
    )
    val, test = str(tmp_path / "validation.h5"), str(tmp_path / "test.h5")
    small_pairs(2, seed=5).save(val)
    small_pairs(2, seed=6).save(test)
    # the run's own training file is no validation split, and nothing is scored before a choice
    with pytest.raises(ValueError, match="disjoint by episode seed"):
        validate(out, data, test, ecfg, Scorer())
    with pytest.raises(ValueError, match="validation and test share"):
        validate(out, val, val, ecfg, Scorer())
    with pytest.raises(FileNotFoundError, match="no frozen choice"):
        score_test(out, Scorer())
    result = validate(out, val, test, ecfg, Scorer())
    assert [(r["variant"], r["w"]) for r in result["table"]] == [
        ("baseline", None),
        ("baseline", None),
        ("baseline", None),
        ("sft", 0.0),
        ("full", 0.0),
        ("full", 1.0),
    ]
    for r in result["table"]:  # the motion-aware and static columns beside the whole-frame ones
        assert {"psnr", "ssim", "psnr_moving", "ssim_moving", "centroid_px"} <= set(r)
        assert {"psnr_static", "static_changed"} <= set(r)
        assert r["centroid_px"] >= 0.0 and 0.0 <= r["robot_found"] <= 1.0
    assert 0.0 < result["moving_pixel_fraction"] < 1.0
    assert result["scored_frames"] == [2, 4]  # the frames no row, baselines included, was given
    assert [r["method"] for r in result["table"][:3]] == list(
        baseline_predictions(torch.zeros(1, 3, 5, 2, 2), 2)
    )
    # the motion threshold was measured on the validation split's camera noise
    assert result["motion_threshold"] == pytest.approx(
        metrics.NOISE_SIGMAS * result["noise"]["sigma"]
    )
    assert result["table"][0]["static_changed"] == 0.0  # a copy invents no motion
    md = (tmp_path / "run" / "validation" / "results.md").read_text()
    assert "baseline: copy first frame" in md and "Latent motion, sim vs real" in md
    # 5 frames: one latent step; 16 x 16 frames: 4 x 4 latent cells, all within reach of the arm
    assert [(r["step"], r["cells"], r["fraction"]) for r in result["motion_gap"]] == [
        (1, "moving", 1.0)
    ]
    assert result["motion_gap"][0]["gap"] > 0
    assert result["table"][0]["robot_found"] == 1.0  # a copy keeps the first frame's robot
    assert len(result["latency"]) == 4 and all(r["seconds"] > 0 for r in result["latency"])
    # the verdict: the full student (headline w) against every baseline and every SFT row
    assert set(result["full_beats_sft"]) == {"real-only SFT from the base backbone"}
    assert isinstance(result["full_beats_baselines_moving"], bool)
    # the choice: frozen in <run>/choice.json with the test file and the checkpoints, linked
    with open(os.path.join(out, "choice.json")) as f:
        choice = json.load(f)
    assert choice["served"] == result["served"] == choose(result["table"])
    assert os.readlink(os.path.join(out, "winner")) == result["served"]["student"]
    assert choice["motion_threshold"] == result["motion_threshold"]
    assert choice["test"]["file"] == test and set(choice["students"]) == {
        "student_sft",
        "student_full",
    }
    assert choice["students"]["student_full"]["step"] == 3
    assert (tmp_path / "run" / "validation" / "qualitative.png").is_file()
    # the guidance sweep from the command line: one row per listed w, on the same windows (the
    # choice may be made again on validation as long as the test split is unscored)
    sweep_args = ["--run", out, "--validation", val, "--test", test, "--sim-steps", "1"]
    eval_main([*sweep_args, "--real-steps", "1", "--guidance", "0,1,2"])
    with open(tmp_path / "run" / "validation" / "results.json") as f:
        swept = json.load(f)
    full_rows = [r for r in swept["table"] if r["variant"] == "full"]
    assert [r["w"] for r in full_rows] == [0.0, 1.0, 2.0]
    assert [r["w"] for r in swept["table"] if r["variant"] == "sft"] == [0.0]
    assert swept["headline_guidance"] == 1.0  # the listed w nearest to the default 0.6
    # w changes the prediction (the 3-step models' scores can agree to the last digit)
    scaled = PairedVideoDataset(
        PairedWindows.load(val), (student.info["action_low"], student.info["action_high"])
    )
    at = {w: predict(student, scaled, 1, 1, w, EvalConfig())[0] for w in (0.0, 2.0)}
    assert not torch.equal(at[0.0], at[2.0])
    # the test command chooses nothing: no settings, no threshold, the frozen checkpoints only
    for extra in (["--guidance", "0"], ["--motion-threshold", "0.1"], ["--validation", val]):
        with pytest.raises(SystemExit):
            eval_main(["--score-test", "--run", out, *extra])
    with pytest.raises(ValueError, match="frozen motion threshold"):
        score_test(out, Scorer(motion_threshold=0.1))
    state_file = os.path.join(out, "student_sft", "train_state.json")
    original = open(state_file).read()
    with open(state_file, "w") as f:
        json.dump(dict(json.loads(original), step=2), f)
    with pytest.raises(ValueError, match="changed since the choice was frozen"):
        score_test(out, Scorer())
    with open(state_file, "w") as f:
        f.write(original)
    assert not (tmp_path / "run" / "test").exists()  # a refusal burns no scoring
    eval_main(["--score-test", "--run", out])
    with open(tmp_path / "run" / "test" / "results.json") as f:
        scored = json.load(f)
    assert scored["split"] == "test" and scored["windows"] == len(PairedWindows.load(test))
    assert [(r["method"], r["w"]) for r in scored["table"]] == [
        (r["method"], r["w"]) for r in swept["table"]
    ]
    assert (
        scored["served"] == swept["served"]
        and scored["motion_threshold"] == swept["motion_threshold"]
    )
    both = (tmp_path / "run" / "results.md").read_text()
    assert "val PSNR" in both and "test PSNR" in both and "(served)" in both
    # once: neither the test nor a new choice after it
    with pytest.raises(RuntimeError, match="scored already"):
        score_test(out, Scorer())
    with pytest.raises(RuntimeError, match="has been scored"):
        validate(out, val, test, ecfg, Scorer())
    # resume: a finished run is skipped (weights unchanged), a longer one continues from its last
    # step
    before = {k: v.clone() for k, v in teacher.denoiser.state_dict().items()}
    run(cfg, data, out, ["autoencoder", "teacher"], [], resume=True)
    after = load_bundle(os.path.join(out, "teacher")).denoiser.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # an interrupted stage (not marked complete) continues from its step with its optimizer state
    state_file = os.path.join(out, "teacher", "train_state.json")
    with open(state_file) as f:
        state = json.load(f)
    state["complete"] = False
    with open(state_file, "w") as f:
        json.dump(state, f)
    cfg.teacher_train.steps = 5
    run(cfg, data, out, ["teacher"], [], resume=True)
    with open(state_file) as f:
        state = json.load(f)
    assert state["step"] == 5 and state["complete"]
    # the resumed stage's loss log continues from its step: no record twice
    assert [r["step"] for r in read_losses(os.path.join(out, "teacher"))] == [1, 2, 3, 4, 5]
    resumed = load_bundle(os.path.join(out, "teacher")).denoiser.state_dict()
    assert any(not torch.equal(before[k], resumed[k]) for k in before)


# sim_video_world_model.train under torchrun; after each stage every rank writes the digest of the
# weights it holds to $DIGEST_DIR/<stage>-rank<RANK>.txt (the training itself is untouched)
DDP_ENTRY = """
import hashlib, os, sys
from sim_video_world_model import train

fit = train.fit


def fit_then_digest(name, module, *args, **kwargs):
    fit(name, module, *args, **kwargs)
    path = os.path.join(os.environ["DIGEST_DIR"], f"{name}-rank{os.environ['RANK']}.txt")
    with open(path, "w") as f:
        f.write(weights_digest(module.parameters()))


def weights_digest(params):
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


train.fit = fit_then_digest
train.main(sys.argv[1:])
"""


def weights_digest(params) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def joint_batch_autoencoder(cfg: RunConfig, data: str, world: int = 2):
    """(trained, untrained) autoencoder of the DDP run's stage, computed in one process: each step
    averages the reconstruction loss over the batches all ranks draw (DistributedSampler's epoch-0
    permutation, rank r taking every world-th index), then AdamW with the run's schedule."""
    t = cfg.autoencoder_train
    torch.manual_seed(cfg.teacher_train.seed)  # run() seeds before building the backbone
    autoencoder, _ = build_backbone(cfg.backbone)
    untrained = copy.deepcopy(autoencoder)
    dataset = PairedVideoDataset(PairedWindows.load(data))
    perm = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(t.seed)).tolist()
    per_rank = [perm[r::world] for r in range(world)]
    params = list(autoencoder.parameters())
    opt = torch.optim.AdamW(params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_cosine(s, t.steps, t.warmup_frac)
    )
    autoencoder.train()
    for step in range(t.steps):
        batch = [
            i for ids in per_rank for i in ids[step * t.batch_size : (step + 1) * t.batch_size]
        ]
        items = [dataset[i] for i in batch]
        video = torch.stack([x["sim"] for x in items] + [x["real"] for x in items])
        loss = torch.nn.functional.mse_loss(autoencoder.reconstruct(video), video)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        opt.step()
        sched.step()
    return autoencoder, untrained


@pytest.mark.slow  # torchrun with two gloo ranks
@pytest.mark.e2e
def test_torchrun_ddp_ranks_agree_and_equal_one_process_with_their_joint_batch(tmp_path):
    """Two gloo ranks, every stage: both ranks end each stage with identical weights, rank 0 saves
    those, and the autoencoder (a deterministic loss: 5-frame windows leave one crop) equals a
    one-process run whose batch joins the two ranks' batches (DDP averages the gradients)."""
    data = str(tmp_path / "pairs.h5")
    synthetic_pairs(
        4, num_frames=5, steps=8, stride=4, cfg=SyntheticWorldConfig(size=16), seed=0
    ).save(data)  # 8 windows: 2 steps of 2 per rank are one epoch
    config = tmp_path / "run.json"
    tiny = {k: (list(v) if isinstance(v, tuple) else v) for k, v in TINY.__dict__.items()}
    small = {"steps": 2, "batch_size": 2, "log_every": 1}
    config.write_text(
        json.dumps(
            {
                "backbone": {"tiny": tiny},
                "autoencoder_train": small,
                "teacher_train": small,
                "student_train": small,
            }
        )
    )
    out, digests = tmp_path / "run", tmp_path / "digests"
    digests.mkdir()
    entry = tmp_path / "ddp_entry.py"
    entry.write_text(DDP_ENTRY)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(entry),
        "--data",
        data,
        "--out",
        str(out),
        "--config",
        str(config),
        "--variant",
        "full",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DIGEST_DIR": str(digests)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "student_full" / "train_state.json") as f:
        assert json.load(f)["complete"]

    saved = {
        "autoencoder": load_bundle(str(out / "autoencoder")).autoencoder,
        "teacher": load_bundle(str(out / "teacher")).denoiser,
        "student_full": load_bundle(str(out / "student_full")).denoiser,
    }
    for stage, module in saved.items():
        rank0, rank1 = ((digests / f"{stage}-rank{r}.txt").read_text() for r in (0, 1))
        assert rank0 == rank1, f"{stage}: the ranks end with different weights"
        assert weights_digest(module.parameters()) == rank0, f"{stage}: rank 0 saved others"

    expected, untrained = joint_batch_autoencoder(
        RunConfig.from_json(json.loads(config.read_text())), data
    )
    moved = 0.0
    for a, b, c in zip(
        saved["autoencoder"].parameters(), expected.parameters(), untrained.parameters()
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        moved = max(moved, float((b - c).detach().abs().max()))
    assert moved > 1e-5  # two steps of training moved the weights


def test_metrics_zero_for_identical_and_growing_with_corruption(tmp_path):

    torch.manual_seed(0)
    video = torch.rand(3, 3, 2, 32, 32) * 2 - 1
    noise = torch.randn_like(video)
    light, heavy = (video + 0.1 * noise).clamp(-1, 1), (video + 0.5 * noise).clamp(-1, 1)
    assert metrics.psnr(video, video) == 100.0 and metrics.psnr(light, video) > metrics.psnr(
        heavy, video
    )
    assert metrics.ssim(video, video) == pytest.approx(1.0) and metrics.ssim(
        light, video
    ) > metrics.ssim(heavy, video)
    for metric in (
        metrics.LPIPS(),
        metrics.FrechetInceptionDistance(size=75),
        metrics.FrechetVideoDistance(size=32),
    ):
        same, low, high = metric(video, video), metric(light, video), metric(heavy, video)
        assert same == pytest.approx(0.0, abs=1e-9) and 0 < low < high, (
            type(metric).__name__,
            same,
            low,
            high,
        )
    # real loading code: weights written to a local file come back; a wrong file is refused
    lpips = metrics.LPIPS()
    path = str(tmp_path / "heads.safetensors")
    save_file({k: v.contiguous() for k, v in lpips.heads.state_dict().items()}, path)
    feats = str(tmp_path / "alexnet.safetensors")
    save_file(
        {f"features.{k}": v.contiguous() for k, v in lpips.features.state_dict().items()}, feats
    )
    assert metrics.LPIPS(feats, path)(light, video) == pytest.approx(lpips(light, video))
    with pytest.raises(ValueError, match="does not fit"):
        metrics.FrechetVideoDistance(weights=path)
    with pytest.raises(FileNotFoundError):
        metrics.LPIPS(str(tmp_path / "missing.safetensors"), path)


def test_frechet_distance_matches_the_covariance_formula():
    def reference(a, b):
        a, b = a.double(), b.double()
        s_a, s_b = torch.cov(a.T), torch.cov(b.T)
        ev, vecs = torch.linalg.eigh(s_a)
        root = vecs @ torch.diag(ev.clamp_min(0).sqrt()) @ vecs.T
        cross = torch.linalg.eigvalsh(root @ s_b @ root).clamp_min(0).sqrt().sum()
        return float((a.mean(0) - b.mean(0)).pow(2).sum() + s_a.trace() + s_b.trace() - 2 * cross)

    g = torch.Generator().manual_seed(0)
    many = (
        torch.randn(40, 6, generator=g),
        torch.randn(30, 6, generator=g) * 2 + 1,
    )  # N > D: eigen path
    few = torch.randn(5, 64, generator=g), torch.randn(6, 64, generator=g) + 0.5  # N < D: SVD path
    for a, b in (many, few):
        assert frechet_distance(a, b) == pytest.approx(reference(a, b), rel=1e-6)


@pytest.mark.slow  # MuJoCo episodes of the peg task in two parts
def test_protocol_data_concatenates_its_parts_and_keeps_finished_files(tmp_path):
    proto = Protocol(
        "t", train_parts=((1, 0), (1, 1)), validation=(1, 2), test=(1, 4), episode_steps=8
    )
    out = tmp_path / "new"  # made by protocol_data
    protocol_data(proto, str(out), "peg")
    train, validation, test = (
        PairedWindows.load(str(out / f)) for f in ("train.h5", "validation.h5", "test.h5")
    )
    parts = [PairedWindows.load(str(out / f"train_part{i}.h5")) for i in (0, 1)]
    assert len(train) == sum(len(p) for p in parts) > 0 and len(validation) > 0 and len(test) > 0
    assert np.array_equal(train.real, np.concatenate([p.real for p in parts]))
    assert np.array_equal(train.episodes, np.concatenate([p.episodes for p in parts]))
    assert not np.array_equal(parts[0].real, parts[1].real)  # the parts' seeds differ
    assert [p["seed"] for p in train.meta["parts"]] == [0, 1]
    check_protocol_splits(str(out))  # disjoint by episode seed
    stamp = os.path.getmtime(out / "train.h5")
    protocol_data(proto, str(out), "peg", workers=2)  # nothing left to generate
    assert os.path.getmtime(out / "train.h5") == stamp  # finished data is kept
    # a test split generated with a training part's seed repeats its episodes: refused
    os.replace(out / "train_part0.h5", out / "test.h5")
    with pytest.raises(ValueError, match="train and test share"):
        check_protocol_splits(str(out))
