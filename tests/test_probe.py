"""The chunk-ranking probe: its look-aheads run on copies, its truth is the real continuation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from robot_drivers.registry import expert_ladder, expert_value, make_task
from simdist_planner.cli.probe import main
from simdist_planner.evaluation.agents import Agent, policy_chunk
from simdist_planner.evaluation.evaluate import task_overrides
from simdist_planner.evaluation.probe import (
    EXPERT,
    PI,
    STAND,
    ChunkProbe,
    ProbeConfig,
    rank_correlation,
)
from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.config import ImageEncoderConfig, go2_config, ur5e_small_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning.observation import observation_to_inputs

SMALL_PLANNER = dict(num_samples=24, num_elites=6, iterations=2)


def tiny_go2_model(history: int = 3, seed: int = 0):
    torch.manual_seed(seed)
    return WorldModel(go2_config(latent_dim=16, history=history, horizon=3)).eval()


def go2_flat(max_steps: int):
    return make_task("go2_flat", **task_overrides("go2_flat", max_steps=max_steps))


def test_rank_correlation():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their mean rank: ranks (0, 1.5, 1.5, 3) against (0, 1, 2, 3)
    expected = np.corrcoef([0, 1.5, 1.5, 3], [0, 1, 2, 3])[0, 1]
    assert rank_correlation([0, 5, 5, 9], [1, 2, 3, 4]) == pytest.approx(expected)
    assert np.isnan(rank_correlation([1, 1, 1], [1, 2, 3]))


def test_config_is_validated():
    with pytest.raises(ValueError, match="driver must be one of"):
        ProbeConfig(driver="planner")
    with pytest.raises(ValueError, match="noise_stds must be > 0"):
        ProbeConfig(noise_stds=(0.0,))


def test_probing_leaves_the_rollout_alone_and_its_truth_is_the_real_continuation():
    model = tiny_go2_model()
    task = go2_flat(20)
    config = ProbeConfig(start=5, every=5, noise_stds=(0.1,), per_noise=2)
    probe = ChunkProbe(task, {"m": model}, config, **SMALL_PLANNER)
    points = probe.run(seed=3, max_steps=12)
    probed_qpos = task.backend.data.qpos.copy()
    assert [p.step for p in points] == [5, 10]
    for p in points:
        # expert, pi, stand, 2 noised
        assert len(p.truth) == len(p.model["m"]) == len(p.oracle["m"]) == 5
        assert np.all(np.isfinite(p.truth + p.model["m"] + p.oracle["m"])) and not any(p.failed)

    # The same episode without the probe: the expert drives 12 steps.
    ref = go2_flat(20)
    expert, critic = expert_ladder(ref)[0], expert_value(ref)
    obs = ref.reset(3)
    for _ in range(5):
        obs = ref.step(expert.act(obs)).obs
    # At step 5 the expert candidate is the expert's next 3 actions, executed for real here.
    planner = probe.planners["m"]
    gamma, seen, ret = planner.config.discount, [obs], 0.0
    low, high = np.asarray(ref.spec.action_low), np.asarray(ref.spec.action_high)
    chunk = []
    for i in range(3):
        chunk.append(np.clip(np.asarray(expert.act(obs), np.float32), low, high).astype(np.float32))
        r = ref.step(chunk[-1])
        obs, ret = r.obs, ret + gamma**i * r.reward
        seen.append(obs)
    ret += gamma**3 * critic(obs)
    assert points[0].truth[EXPERT] == pytest.approx(ret, rel=1e-6)
    with torch.no_grad():  # the oracle scores the chunk over the latents of what it produced
        z = torch.cat([model.encode(observation_to_inputs(o, ref.spec)) for o in seen])
        oracle, _, _ = planner.objective(
            z[None],
            torch.as_tensor(np.stack(chunk))[None],
            observation_to_inputs(seen[0], ref.spec)["command"],
        )
    assert points[0].oracle["m"][EXPERT] == pytest.approx(float(oracle[0]), rel=1e-5)
    # The stand candidate: the zero chunk (the default stance held) from the same state.
    still = go2_flat(20)
    obs, walker = still.reset(3), expert_ladder(still)[0]
    for _ in range(5):
        obs = still.step(walker.act(obs)).obs
    ret = 0.0
    for i in range(3):
        r = still.step(np.zeros(still.spec.action_dim, np.float32))
        ret += gamma**i * r.reward
    ret += gamma**3 * critic(r.obs)
    assert points[0].truth[STAND] == pytest.approx(ret, rel=1e-6)
    still.close()
    # ... and the driven episode is exactly the unprobed one.
    ref2 = go2_flat(20)
    obs = ref2.reset(3)
    for _ in range(12):
        obs = ref2.step(np.asarray(expert.act(obs), np.float32)).obs
    np.testing.assert_array_equal(probed_qpos, ref2.backend.data.qpos)
    for t in (task, ref, ref2):
        t.close()


def test_the_policy_driver_runs_pi_as_the_agent_does():
    model = tiny_go2_model()
    task = go2_flat(20)
    probe = ChunkProbe(
        task,
        {"m": model},
        ProbeConfig(driver="policy", start=2, every=4, per_noise=1),
        **SMALL_PLANNER,
    )
    points = probe.run(seed=1, max_steps=8)
    assert [p.step for p in points] == [2, 6] and len(points[0].truth) == 3 + 3
    ref = go2_flat(20)
    agent = Agent(model, ref.spec)
    obs = ref.reset(1)
    agent.reset(1)
    for k in range(8):
        if k == 2:  # candidate PI is pi's clipped chunk here, scored by the planner's objective
            inputs, (proprio, actions) = (
                observation_to_inputs(obs, ref.spec),
                agent.history.tensors(),
            )
            chunk = np.clip(
                policy_chunk(model, inputs, proprio, actions),
                ref.spec.action_low,
                ref.spec.action_high,
            ).astype(np.float32)
            score = probe.planners["m"].score(
                inputs, proprio, actions, torch.as_tensor(chunk)[None]
            )
            assert points[0].model["m"][PI] == pytest.approx(float(score[0]), rel=1e-5)
        obs = ref.step(agent.act(obs)).obs
    np.testing.assert_array_equal(task.backend.data.qpos, ref.backend.data.qpos)
    for t in (task, ref):
        t.close()


def test_models_must_share_history_and_horizon():
    task = go2_flat(5)
    with pytest.raises(ValueError, match="must share history and horizon"):
        ChunkProbe(task, {"a": tiny_go2_model(3), "b": tiny_go2_model(2)}, **SMALL_PLANNER)
    task.close()


def test_cli_prints_a_row_per_model_and_writes_every_state(tmp_path, capsys):
    save_checkpoint(tiny_go2_model(seed=0), tmp_path / "a")
    save_checkpoint(tiny_go2_model(seed=1), tmp_path / "b")
    out = tmp_path / "probe.json"
    assert (
        main(
            [
                "--task",
                "go2_flat",
                "--checkpoint",
                f"pre={tmp_path / 'a'}",
                "--checkpoint",
                f"adapted={tmp_path / 'b'}",
                "--seeds",
                "0,1",
                "--max-steps",
                "6",
                "--start",
                "2",
                "--every",
                "3",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "go2_flat sim: 4 states along the expert's rollouts, seeds 0,1; 18 candidates" in text
    assert [line.split()[0] for line in text.strip().splitlines()[-2:]] == ["pre", "adapted"]
    data = json.loads(out.read_text())
    assert [s["model"] for s in data["summaries"]] == ["pre", "adapted"]
    assert [(p["episode_seed"], p["step"]) for p in data["points"]] == [
        (0, 2),
        (0, 5),
        (1, 2),
        (1, 5),
    ]
    for s in data["summaries"]:
        assert (
            s["points"] == 4 and -1.0 <= s["rank_corr"] <= 1.0 and 0.0 <= s["pick_quantile"] <= 1.0
        )


def test_a_task_that_cannot_be_copied_needs_a_twin():
    task = make_task("peg")  # holds an MjSpec, which MuJoCo cannot copy
    with pytest.raises(ValueError, match="peg cannot be copied: pass a twin task"):
        ChunkProbe(task, {"m": tiny_go2_model()}, **SMALL_PLANNER)
    task.close()


def tiny_ur5e_model(spec):
    torch.manual_seed(0)
    image = ImageEncoderConfig(
        spec.cameras, 32, 32, backbone="small_cnn", small_cnn_channels=(8, 8), small_cnn_features=16
    )
    return WorldModel(
        ur5e_small_config(
            latent_dim=16, proprio_dim=spec.proprio_dim, history=3, horizon=3, image=image
        )
    ).eval()


@pytest.mark.slow  # replays a whole episode in the twin
def test_the_twin_replays_the_episode_to_look_ahead_in_a_task_that_cannot_be_copied():
    """UR5e peg: the truth of the expert's chunk is its real continuation, the driven episode
    is the unprobed one, and noised pi chunks are in half action ranges (the planner's unit)."""
    peg = make_task("peg")
    model = tiny_ur5e_model(peg.spec)
    peg.close()
    overrides = task_overrides("peg", "wide", 12, model)
    task, twin = make_task("peg", **overrides), make_task("peg", **overrides)
    probe = ChunkProbe(
        task,
        {"m": model},
        ProbeConfig(start=4, every=6, noise_stds=(0.1,), per_noise=2),
        twin=twin,
        **SMALL_PLANNER,
    )
    points = probe.run(seed=2, max_steps=9)
    driven = task.backend.data.qpos.copy()
    assert [p.step for p in points] == [4] and len(points[0].truth) == 5

    ref = make_task("peg", **overrides)
    expert, critic = expert_ladder(ref)[0], expert_value(ref)
    obs = ref.reset(2)
    for _ in range(4):
        obs = ref.step(expert.act(obs)).obs
    gamma, ret = probe.planners["m"].config.discount, 0.0
    for i in range(3):
        r = ref.step(np.asarray(expert.act(obs), np.float32))
        obs, ret = r.obs, ret + gamma**i * r.reward
    ret += gamma**3 * critic(obs)
    assert points[0].truth[EXPERT] == pytest.approx(ret, rel=1e-6)
    ref.close()
    ref = make_task("peg", **overrides)  # the probed episode is the unprobed one
    obs, expert = ref.reset(2), expert_ladder(ref)[0]
    for _ in range(9):
        obs = ref.step(np.asarray(expert.act(obs), np.float32)).obs
    np.testing.assert_array_equal(driven, ref.backend.data.qpos)
    assert probe._noise_unit[0] == pytest.approx(0.05)  # +-5 cm per step: half range 5 cm
    for t in (task, twin, ref):
        t.close()


def test_a_twin_that_does_not_replay_the_episode_raises():
    peg = make_task("peg")
    model = tiny_ur5e_model(peg.spec)
    peg.close()
    overrides = task_overrides("peg", "wide", 12, model)
    task = make_task("peg", **overrides)
    twin = make_task("peg", **dict(overrides, region="narrow"))  # another start: not a twin
    probe = ChunkProbe(
        task, {"m": model}, ProbeConfig(start=1, per_noise=0), twin=twin, **SMALL_PLANNER
    )
    with pytest.raises(RuntimeError, match="did not reproduce the driver's observation"):
        probe.run(seed=0, max_steps=3)
    for t in (task, twin):
        t.close()
