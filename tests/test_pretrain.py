"""simdist-pretrain: schedule, real shards, augmentation, DDP with 2 CPU ranks, exact resume."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from robot_drivers.tasks.ur5e_tasks import STATE_SLICES, STATE_TERMS
from simdist_planner.cli.pretrain import parse_args
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.schema import EpisodeRecord, StepLayout, shard_name
from simdist_planner.data.writer import ShardWriter
from simdist_planner.model.checkpoint import load_checkpoint
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.augment import augment
from simdist_planner.training.config import (
    PEG_NEAR_FIELD,
    PRETRAIN_PRESETS,
    AugmentationConfig,
    CheckpointSelection,
    DataConfig,
    EncoderStage,
    OptimiserConfig,
    PretrainConfig,
)
from simdist_planner.training.loop import lr_at, pretrain
from simdist_planner.training.sampler import WindowSource
from simdist_planner.training.scaler_fit import fit_scaler
from simdist_planner.training.train_state import weights_sha256

TINY = {"latent_dim": 16, "history": 3, "horizon": 4}


def synthetic_cfg(**kw) -> PretrainConfig:
    base = dict(
        model="go2",
        synthetic=True,
        model_overrides=TINY,
        steps=12,
        batch_size=4,
        warmup_steps=3,
        checkpoint_every=4,
        log_every=4,
        workers=0,
    )
    return PretrainConfig.from_flat({**base, **kw})


def cli_args(cfg: PretrainConfig, out) -> list[str]:
    return [
        "--synthetic",
        "true",
        "--model",
        cfg.model,
        "--model-overrides",
        json.dumps(cfg.model_overrides),
        "--steps",
        str(cfg.steps),
        "--batch-size",
        str(cfg.batch_size),
        "--warmup-steps",
        str(cfg.optimiser.warmup_steps),
        "--checkpoint-every",
        str(cfg.checkpoint_every),
        "--log-every",
        str(cfg.log_every),
        "--workers",
        "0",
        "--out",
        str(out),
        "--no-progress",
    ]


def test_learning_rate_schedule():
    cfg = PretrainConfig.from_flat(dict(synthetic=True, steps=1000, warmup_steps=100))
    assert lr_at(cfg, 0) == 0.0
    assert lr_at(cfg, 50) == pytest.approx(1e-4)
    assert lr_at(cfg, 100) == pytest.approx(2e-4)
    assert lr_at(cfg, 550) == pytest.approx(1.5e-4)
    assert lr_at(cfg, 1000) == pytest.approx(1e-4)
    assert lr_at(cfg, 5000) == pytest.approx(1e-4)


def _write_ur5e_like_shard(
    path, state_terms=(("tcp_to_grasp", 3),), action=None, task="peg", state=None
):
    """Three 12-row episodes of random rows; `action` (12, A) replaces the random 2-d actions,
    `state` (12, S) or one per episode (3, 12, S) the random task state."""

    layout = StepLayout(
        proprio_terms=(("joint_pos", 3), ("gripper", 1)),
        action_dim=2 if action is None else action.shape[1],
        cameras=("wrist",),
        image_shape=(16, 16),
        state_terms=state_terms,
    )
    attrs = {
        "task": task,
        "config": json.dumps({"robot": {"obs_noise": {"joint_pos": 0.5, "gripper": 0.0}}}),
    }
    rng = np.random.default_rng(0)
    with ShardWriter(path / shard_name(0), layout, attrs) as w:
        for ep in range(3):
            rows = 12
            steps = {
                "proprio": rng.normal(size=(rows, 4)).astype(np.float32),
                "images/wrist": rng.integers(0, 255, (rows, 16, 16, 3), dtype=np.uint8),
                "action": rng.normal(size=(rows, 2)).astype(np.float32)
                if action is None
                else action,
                "reward": rng.normal(size=rows).astype(np.float32),
                "value": rng.normal(size=rows).astype(np.float32),
                "expert": (rng.random(rows) > 0.3).astype(np.uint8),
                "noised": np.zeros(rows, np.uint8),
            }
            if state_terms:
                steps["state"] = (
                    rng.normal(size=(rows, layout.state_dim)).astype(np.float32)
                    if state is None
                    else state[ep]
                    if state.ndim == 3
                    else state
                )
            w.append(
                EpisodeRecord(
                    id=ep,
                    steps=steps,
                    policy=0,
                    seed=ep,
                    noise_scale=np.zeros(layout.action_dim),
                    never_noised=False,
                    success=False,
                    terminated=False,
                    truncated=True,
                )
            )


def test_pretrain_on_shards_sizes_the_model_from_the_dataset(tmp_path):
    _write_ur5e_like_shard(tmp_path / "data")
    cfg = PretrainConfig.from_flat(
        dict(
            model="ur5e_small",
            data=(str(tmp_path / "data"),),
            steps=3,
            batch_size=4,
            warmup_steps=1,
            checkpoint_every=3,
            workers=0,
            model_overrides={"latent_dim": 16, "history": 2, "horizon": 3},
        )
    )
    final = pretrain(cfg, tmp_path / "run", progress=False)
    model = load_checkpoint(final)
    c = model.config
    assert (c.proprio_dim, c.action_dim, c.image.cameras, c.image.height) == (4, 2, ("wrist",), 16)
    assert c.state_dim == 3 and c.loss.state > 0  # the small UR5e model reads the task state from z
    metrics = json.loads((final / "metrics.json").read_text())
    assert metrics["step"] == 3 and metrics["loss/state"] > 0
    assert not torch.allclose(model.scaler.state_std, torch.ones(3))
    assert any((tmp_path / "run" / "tb").iterdir())
    # the scaler was fitted on the shard, not left at identity
    assert not torch.allclose(model.scaler.proprio_std, torch.ones(4))

    source = WindowSource(cfg, 0, 1)
    torch.testing.assert_close(source.proprio_noise(), torch.tensor([0.5, 0.5, 0.5, 0.0]))
    batch = source[0]
    mc = source.model_config
    aug = augment(
        batch, cfg.augmentation, source.proprio_noise(), 0.0, mc, torch.Generator().manual_seed(0)
    )
    h = 2
    assert not torch.equal(aug["proprio"][:, : h + 1, :3], batch["proprio"][:, : h + 1, :3])
    assert torch.equal(aug["proprio"][:, :, 3], batch["proprio"][:, :, 3])  # gripper noise 0
    assert torch.equal(aug["proprio"][:, h + 1 :], batch["proprio"][:, h + 1 :])  # targets clean
    clean = batch["images"]
    assert (
        clean.dtype == torch.uint8 and aug["images"].dtype == torch.uint8
    )  # camera frames stay bytes
    assert not torch.equal(aug["images"][:, h], clean[:, h])

    # photometric change on o_t only; one shift per (window, camera) on o_t and the targets alike
    photometric = augment(
        batch,
        cfg.replace(image_shift=0).augmentation,
        source.proprio_noise(),
        0.0,
        mc,
        torch.Generator().manual_seed(0),
    )["images"]
    assert not torch.equal(photometric[:, h], clean[:, h])
    assert torch.equal(photometric[:, h + 1 :], clean[:, h + 1 :])
    assert torch.equal(photometric[:, :h], clean[:, :h])  # history frames: E never reads them
    s = 2
    geometric = dataclasses.replace(
        cfg.augmentation, image_shift=s, image_brightness=0.0, image_contrast=0.0
    )
    # the wrist camera is fixed by default (its view of the hand is the mount's): never shifted
    assert mc.image.cameras == ("wrist",) and cfg.augmentation.fixed_cameras == ("wrist",)
    fixed = augment(
        batch, geometric, source.proprio_noise(), 0.0, mc, torch.Generator().manual_seed(0)
    )["images"]
    assert torch.equal(fixed, clean)
    shifted = augment(
        batch,
        dataclasses.replace(geometric, fixed_cameras=()),
        source.proprio_noise(),
        0.0,
        mc,
        torch.Generator().manual_seed(0),
    )["images"]
    assert torch.equal(shifted[:, :h], clean[:, :h])
    # the reference: replicate padding by s pixels, then a crop at one of (2 s + 1)^2 offsets
    ref = clean.float()
    padded = torch.nn.functional.pad(ref.flatten(0, 2), (s, s, s, s), mode="replicate").view(
        *ref.shape[:4], ref.shape[4] + 2 * s, ref.shape[5] + 2 * s
    )
    hh, ww = ref.shape[-2:]
    offsets = set()
    for b in range(ref.shape[0]):
        for c in range(ref.shape[2]):
            crops = {
                (dy, dx): padded[b, h:, c, :, dy : dy + hh, dx : dx + ww]
                for dy in range(2 * s + 1)
                for dx in range(2 * s + 1)
            }
            match = [
                k for k, crop in crops.items() if torch.equal(crop[0], shifted[b, h, c].float())
            ]
            assert match, "o_t is not a shifted crop"
            # the same offset moved every target frame of this window and camera
            assert any(torch.equal(crops[k], shifted[b, h:, c].float()) for k in match)
            offsets.add(match[0])
    assert len(offsets) > 1  # the shift is random


def test_the_scaler_sees_a_rare_flag_as_often_as_the_data_holds_it(tmp_path, monkeypatch):
    # a flag set on 2 rows of one episode in three: fitted on a sample without those rows its
    # std would be tiny and its normalised 1 would dominate the state loss
    state = np.zeros((3, 12, 1), np.float32)
    state[1, 10:, 0] = 1.0
    _write_ur5e_like_shard(tmp_path / "data", state_terms=(("seated", 1),), state=state)
    cfg = PretrainConfig.from_flat(
        dict(
            model="ur5e_small",
            data=(str(tmp_path / "data"),),
            workers=0,
            model_overrides={"latent_dim": 16, "history": 2, "horizon": 3},
        )
    )

    read_names = []
    real_read = ShardedDataset.read
    monkeypatch.setattr(
        ShardedDataset,
        "read",
        lambda self, i, a, b, names=None: (
            read_names.append(names),
            real_read(self, i, a, b, names),
        )[1],
    )
    source = WindowSource(cfg, 0, 1)
    model = WorldModel(source.model_config)
    read_names.clear()
    fit_scaler(model, cfg, source)
    assert read_names and all(
        n is not None and not any("images" in k for k in n) for n in read_names
    )
    flag = state.reshape(-1)
    assert float(model.scaler.state_std) == pytest.approx(flag.std(ddof=1), rel=1e-5)
    assert float(model.scaler.state_mean) == pytest.approx(2 / 36, rel=1e-5)
    # a cap of one episode fits on the first episode of the selection order only
    first = ShardedDataset(cfg.data.paths, **WindowSource.selection(cfg)).episode_info(0)["id"]
    model = WorldModel(source.model_config)
    fit_scaler(model, cfg.replace(scaler_rows=12), source)
    assert float(model.scaler.state_mean) == pytest.approx(state[first].mean(), abs=1e-7)


def test_a_dataset_without_the_task_state_is_refused_unless_the_state_loss_is_off(tmp_path):
    _write_ur5e_like_shard(tmp_path / "data", state_terms=())
    cfg = PretrainConfig.from_flat(
        dict(
            model="ur5e_small",
            data=(str(tmp_path / "data"),),
            steps=1,
            batch_size=2,
            warmup_steps=1,
            workers=0,
            model_overrides={"latent_dim": 16, "history": 2, "horizon": 3},
        )
    )
    with pytest.raises(ValueError, match="holds no task state"):
        pretrain(cfg, tmp_path / "run", progress=False)
    off = dataclasses.replace(cfg, model_overrides={**cfg.model_overrides, "loss": {"state": 0.0}})
    model = load_checkpoint(pretrain(off, tmp_path / "run_off", progress=False))
    assert model.config.state_dim == 0 and model.state_head is None


def test_phase_weights_draw_the_named_phase_that_much_more_often(tmp_path):
    # every episode: open for rows 0-5, closes at 6, holds at 7-8, lifts at 9, carries at 10-11
    action = np.zeros((12, 7), np.float32)
    action[6:, 6] = 1.0
    action[9:, 2] = 0.02
    _write_ur5e_like_shard(tmp_path / "data", action=action)
    # H = 2, T = 3: windows t = 0..8 per episode, of which t = 6, 7, 8 are closing (a_t closed)
    cfg = PretrainConfig.from_flat(
        dict(
            model="ur5e_small",
            data=(str(tmp_path / "data"),),
            steps=200,
            batch_size=4,
            workers=0,
            model_overrides={"latent_dim": 16, "history": 2, "horizon": 3},
        )
    )

    def closing_share(c: PretrainConfig) -> float:
        source = WindowSource(c, 0, 1)
        closed = torch.cat([source[step]["actions"][:, 2, 6] for step in range(c.steps)])
        return float((closed > 0.5).float().mean())

    assert closing_share(cfg) == pytest.approx(3 / 9, abs=0.06)  # uniform over windows
    weighted = cfg.replace(phase_weights={"closing": 4})
    assert closing_share(weighted) == pytest.approx(12 / 18, abs=0.06)  # 3 x 4 against 6 x 1
    assert (
        WindowSource(weighted, 0, 1).weighting
        == "9 of 27 windows in the phases {'closing': 4}, 66.7% of draws"
    )
    assert closing_share(cfg.replace(phase_weights={"closing": 0.25})) == pytest.approx(
        0.75 / 6.75, abs=0.06
    )

    with pytest.raises(
        ValueError, match=r"names \['lift'\], but task 'peg' defines the phases \['closing'\]"
    ):
        WindowSource(cfg.replace(phase_weights={"lift": 2}), 0, 1)
    for bad in (0, -1, float("nan"), True, "2"):
        with pytest.raises(ValueError, match="must be a positive number"):
            cfg.replace(phase_weights={"closing": bad})
    with pytest.raises(ValueError, match="must map phase names to weights"):
        cfg.replace(phase_weights=[4])
    with pytest.raises(SystemExit):  # the CLI reports it as a usage error
        parse_args(["--data", "d", "--out", "o", "--phase-weights", "[4]"])
    with pytest.raises(ValueError, match="need a dataset"):
        synthetic_cfg(phase_weights={"closing": 2})
    # with the peg's own task state logged, the last centimetre above the hole can be weighted too

    state = np.zeros((12, sum(n for _, n in STATE_TERMS)), np.float32)
    state[:, STATE_SLICES["bottom_to_hole"]] = [0.0, 0.0, 0.1]
    state[:, STATE_SLICES["grasped"]] = 1.0
    state[2:5, STATE_SLICES["bottom_to_hole"]] = [0.005, 0.0, 0.004]  # windows t = 2, 3, 4
    _write_ur5e_like_shard(
        tmp_path / "with_state", state_terms=STATE_TERMS, action=action, state=state
    )
    at_hole = cfg.replace(data=(str(tmp_path / "with_state"),), phase_weights={"at_hole": 2})
    assert (
        WindowSource(at_hole, 0, 1).weighting
        == "9 of 27 windows in the phases {'at_hole': 2}, 50.0% of draws"
    )
    args_cfg, _ = parse_args(
        ["--preset", "ur5e_peg", "--data", "d", "--out", "o", "--phase-weights", '{"closing": 3}']
    )
    assert (
        args_cfg.data.phase_weights == {"closing": 3}
        and args_cfg.steps == PRETRAIN_PRESETS["ur5e_peg"]["steps"]
    )

    _write_ur5e_like_shard(tmp_path / "go2", action=action, task="go2_flat")
    with pytest.raises(ValueError, match="task 'go2_flat' defines the phases none"):
        WindowSource(weighted.replace(data=(str(tmp_path / "go2"),)), 0, 1)
    never = action.copy()
    never[:, 6] = 0.0  # no grasp at all: nothing to weight
    _write_ur5e_like_shard(tmp_path / "open", action=never)
    with pytest.raises(
        ValueError, match=r"no window of the selection lies in the phases \['closing'\]"
    ):
        WindowSource(weighted.replace(data=(str(tmp_path / "open"),)), 0, 1)


@pytest.mark.slow  # two gloo ranks; the kill-and-resume run stays in make test
def test_two_cpu_ranks_end_with_identical_weights(tmp_path):
    cfg = synthetic_cfg(steps=4, checkpoint_every=2, log_every=2)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "simdist_planner.cli.pretrain",
        *cli_args(cfg, tmp_path / "ddp"),
    ]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((tmp_path / "ddp" / "model" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["step"] == 4
    a, b = metrics["rank_weights_sha256"]
    assert a == b
    # and training moved the weights: a single-rank run of 0 steps differs
    untrained = pretrain(
        synthetic_cfg(steps=1, checkpoint_every=1), tmp_path / "zero", progress=False
    )
    assert weights_sha256(load_checkpoint(untrained)) != a


def test_kill_and_resume_gives_the_weights_of_an_uninterrupted_run(tmp_path):
    cfg = synthetic_cfg(steps=40, checkpoint_every=2, log_every=2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "simdist_planner.cli.pretrain", *cli_args(cfg, tmp_path / "killed")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    state = tmp_path / "killed" / "train_state" / "state.json"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if state.is_file() and json.loads(state.read_text())["step"] >= 4:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be interrupted"
    killed_at = json.loads(state.read_text())["step"]
    assert 4 <= killed_at < 40 and not (tmp_path / "killed" / "model").exists()

    resumed = pretrain(cfg, tmp_path / "killed", progress=False)
    assert json.loads((resumed / "metrics.json").read_text())["steps_this_run"] == 40 - killed_at
    straight = pretrain(cfg, tmp_path / "straight", progress=False)
    a, b = load_checkpoint(resumed).state_dict(), load_checkpoint(straight).state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_time_limit_stops_saves_and_resumes_to_the_uninterrupted_weights(tmp_path):
    cfg = synthetic_cfg(steps=12, checkpoint_every=100, log_every=100)
    stopped = pretrain(
        dataclasses.replace(cfg, time_limit_s=1e-9), tmp_path / "run", progress=False
    )
    metrics = json.loads((stopped / "metrics.json").read_text())
    assert (
        metrics["stopped_at_time_limit"] and metrics["step"] == 1 and metrics["steps_this_run"] == 1
    )
    assert json.loads((tmp_path / "run" / "train_state" / "state.json").read_text())["step"] == 1

    resumed = pretrain(cfg, tmp_path / "run", progress=False)  # the budget may change on resume
    metrics = json.loads((resumed / "metrics.json").read_text())
    assert metrics["step"] == 12 and not metrics["stopped_at_time_limit"]
    straight = pretrain(cfg, tmp_path / "straight", progress=False)
    a, b = load_checkpoint(resumed).state_dict(), load_checkpoint(straight).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_init_from_starts_from_the_checkpoint_weights(tmp_path):
    first = pretrain(synthetic_cfg(steps=4), tmp_path / "first", progress=False)
    # one step at the warm-up's first learning rate (0) leaves the loaded weights as they were
    warm = pretrain(
        synthetic_cfg(steps=1, warmup_steps=1, seed=7, init_from=str(first)),
        tmp_path / "warm",
        progress=False,
    )
    a, b = load_checkpoint(first).state_dict(), load_checkpoint(warm).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    cold = load_checkpoint(
        pretrain(synthetic_cfg(steps=1, warmup_steps=1, seed=7), tmp_path / "cold", progress=False)
    ).state_dict()
    assert not all(torch.equal(a[k], cold[k]) for k in a)
    # a zero-initialised addition (WARM_START_ADDED) may be switched on; it starts at zero
    gained = load_checkpoint(
        pretrain(
            synthetic_cfg(
                steps=1,
                warmup_steps=1,
                seed=7,
                init_from=str(first),
                model_overrides={**TINY, "policy_proprio_skip": True},
            ),
            tmp_path / "gained",
            progress=False,
        )
    )
    assert gained.config.policy_proprio_skip
    assert all(torch.equal(a[k], gained.state_dict()[k]) for k in a)
    assert not gained.policy_head.proprio_skip.weight.any()
    other = {**TINY, "latent_dim": 8}
    with pytest.raises(ValueError, match="latent_dim"):
        pretrain(
            synthetic_cfg(steps=1, init_from=str(first), model_overrides=other),
            tmp_path / "bad",
            progress=False,
        )


def test_resume_refuses_different_settings(tmp_path):
    pretrain(synthetic_cfg(steps=2, checkpoint_every=2), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match=r"cannot resume .*batch_size: run has 4, now 8"):
        pretrain(synthetic_cfg(steps=4, batch_size=8), tmp_path / "run", progress=False)


# pretrain.json of the ur5e_peg preset as the flat PretrainConfig of earlier versions wrote it
OLD_FLAT_PEG_JSON = {
    "model": "ur5e_small", "model_overrides": {}, "data": ["peg400v", "startsv"],
    "synthetic": False, "fraction": 1.0, "expert_only": False, "max_data_steps": 0,
    "selection_seed": 0, "preload": "all", "phase_weights": {"at_hole": 4}, "steps": 9000,
    "batch_size": 32, "learning_rate": 0.0002, "end_learning_rate": 0.0001, "warmup_steps": 60,
    "decay_steps": 0, "grad_clip": 0.0, "augment": True, "image_brightness": 0.2,
    "image_contrast": 0.2, "image_shift": 4, "fixed_cameras": ["wrist"], "scaler_rows": 500000,
    "seed": 42, "checkpoint_every": 250, "keep_checkpoints": 8, "log_every": 10, "workers": 1,
    "threads": 2, "precision": "auto", "compile": False, "time_limit_s": 0.0, "init_from": "",
    "encoder_steps": 12000, "encoder_learning_rate": 0.001,
    "encoder_near_field": {"bottom_to_hole": 0.005, "tcp_to_grasp": 0.005},
    "state_near_field": {"bottom_to_hole": 0.005, "tcp_to_grasp": 0.005},
    "freeze_image_backbone": True, "ema_decay": 0.0,
    "checkpoint_selection": {"task": "peg", "region": "wide", "variant": "sim", "episodes": 20,
                             "seed": 1000, "max_steps": 0, "workers": 2},
}  # fmt: skip


def test_the_config_is_nested_and_round_trips_and_the_flags_fill_its_groups():
    cfg, _ = parse_args(
        ["--preset", "ur5e_peg", "--data", "a", "b", "--out", "o", "--learning-rate", "1e-3",
         "--image-shift", "2", "--encoder-steps", "50", "--fixed-cameras"]
    )  # fmt: skip
    assert cfg.data == DataConfig(paths=("a", "b"), preload="all", phase_weights={"at_hole": 4})
    assert cfg.optimiser == OptimiserConfig(learning_rate=1e-3, warmup_steps=60)
    assert cfg.augmentation == AugmentationConfig(image_shift=2, fixed_cameras=())
    assert cfg.encoder_stage == EncoderStage(
        steps=50, near_field=PEG_NEAR_FIELD, freeze_backbone=True
    )
    assert cfg.checkpoint_selection == CheckpointSelection(task="peg", region="wide", workers=2)
    assert (cfg.steps, cfg.keep_checkpoints, cfg.threads) == (9000, 8, 2)
    assert PretrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert PretrainConfig.from_flat(cfg.to_flat()) == cfg
    # the paper's optimiser and augmentation by default; no stage, no selection
    plain = PretrainConfig(data=DataConfig(synthetic=True))
    assert (plain.optimiser.learning_rate, plain.optimiser.end_learning_rate) == (2e-4, 1e-4)
    assert plain.encoder_stage is None and plain.checkpoint_selection is None
    assert plain.replace(encoder_steps=0, steps=3) == dataclasses.replace(plain, steps=3)
    with pytest.raises(TypeError, match="unknown settings"):
        plain.replace(learning_rat=1.0)
    no_stage = PretrainConfig.from_flat({"data": ("d",), "encoder_learning_rate": 0.01})
    assert no_stage.encoder_stage is None
    with pytest.raises(ValueError, match="steps must be >= 1"):
        EncoderStage(steps=0)


def test_a_flat_pretrain_json_of_earlier_versions_loads_into_the_nested_config():
    cfg = PretrainConfig.from_dict(json.loads(json.dumps(OLD_FLAT_PEG_JSON)))
    assert cfg == PretrainConfig.from_flat(
        {**PRETRAIN_PRESETS["ur5e_peg"], "data": ("peg400v", "startsv")}
    )
    # without the encoder stage it is None; the removed settings only with their "off" value
    no_stage = {**OLD_FLAT_PEG_JSON, "encoder_steps": 0, "encoder_near_field": {},
                "freeze_image_backbone": False}  # fmt: skip
    assert PretrainConfig.from_dict(no_stage).encoder_stage is None
    for removed, value in (("ema_decay", 0.999), ("grad_clip", 1.0)):
        with pytest.raises(ValueError, match=f"{removed}={value} is a removed setting"):
            PretrainConfig.from_dict({**OLD_FLAT_PEG_JSON, removed: value})
    with pytest.raises(ValueError, match="unknown keys"):
        PretrainConfig.from_dict({**OLD_FLAT_PEG_JSON, "policy_lr": 1.0})
    with pytest.raises(ValueError, match="freeze_image_backbone keeps a trained backbone"):
        PretrainConfig.from_dict({**no_stage, "freeze_image_backbone": True})


def test_a_run_whose_pretrain_json_is_in_the_flat_form_resumes_exactly(tmp_path):
    cfg = synthetic_cfg(steps=12, checkpoint_every=100, log_every=100)
    pretrain(cfg.replace(time_limit_s=1e-9), tmp_path / "run", progress=False)
    # the file as an earlier version wrote it for this run
    flat = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_flat().items()}
    flat.update(grad_clip=0.0, ema_decay=0.0, time_limit_s=1e-9)
    (tmp_path / "run" / "pretrain.json").write_text(json.dumps(flat))
    with pytest.raises(ValueError, match=r"cannot resume .*batch_size: run has 4, now 8"):
        pretrain(cfg.replace(batch_size=8), tmp_path / "run", progress=False)
    resumed = load_checkpoint(pretrain(cfg, tmp_path / "run", progress=False)).state_dict()
    straight = load_checkpoint(pretrain(cfg, tmp_path / "straight", progress=False)).state_dict()
    assert all(torch.equal(resumed[k], v) for k, v in straight.items())
    assert json.loads((tmp_path / "run" / "pretrain.json").read_text()) == cfg.to_dict()
