"""Observation -> model-input conversion, the history buffer, the Agent and the evaluation table."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from robot_drivers.interface import Observation, ProprioTerm, RobotSpec
from robot_drivers.registry import make_task
from simdist_planner.cli.common import planner_overrides
from simdist_planner.cli.evaluate import main, parse_args
from simdist_planner.evaluation.ablation import (
    ROWS,
    AblationScale,
    format_ablation_table,
    generate_data,
    pretrain_config,
    selected_dataset,
)
from simdist_planner.evaluation.agents import Agent, build_agents
from simdist_planner.evaluation.evaluate import evaluate, format_table, task_overrides
from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.config import ImageEncoderConfig, go2_config, ur5e_small_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning.observation import (
    ObservationError,
    ObservationHistory,
    observation_to_inputs,
)

ARM = RobotSpec(
    name="arm",
    action_dim=3,
    control_rate_hz=5.0,
    proprio_terms=(ProprioTerm("q", 2),),
    cameras=("wrist", "side"),
    image_shape=(4, 6),
    action_low=(-1.0, -1.0, 0.0),
    action_high=(1.0, 1.0, 1.0),
)
DOG = RobotSpec(
    name="dog",
    action_dim=2,
    control_rate_hz=50.0,
    proprio_terms=(ProprioTerm("q", 3),),
    height_map_shape=(3, 2),
    command_dim=3,
    action_low=(-2.0, -2.0),
    action_high=(2.0, 2.0),
)


def arm_obs(k: float = 0.0) -> Observation:
    return Observation(
        stamp=k,
        proprio=np.array([k, -k], np.float32),
        images={
            "side": np.full((4, 6, 3), 200, np.uint8),
            "wrist": np.arange(72, dtype=np.uint8).reshape(4, 6, 3),
        },
    )


def dog_obs(k: float = 0.0) -> Observation:
    return Observation(
        stamp=k,
        proprio=np.array([k, 1.0, 2.0], np.float32),
        height_map=np.full((3, 2), 0.5, np.float32),
        command=np.array([0.3, 0.0, 0.1], np.float32),
    )


def test_images_stack_in_spec_camera_order_as_uint8_chw():
    inputs = observation_to_inputs(arm_obs(1.0), ARM)
    assert set(inputs) == {"proprio", "images"}
    assert inputs["proprio"].shape == (1, 2) and inputs["proprio"].dtype == torch.float32
    images = inputs["images"]
    assert images.shape == (1, 2, 3, 4, 6) and images.dtype == torch.uint8
    wrist = arm_obs().images["wrist"]
    torch.testing.assert_close(images[0, 0], torch.from_numpy(wrist).permute(2, 0, 1))
    assert torch.all(images[0, 1] == 200)


def test_height_map_and_command_keys():
    inputs = observation_to_inputs(dog_obs(), DOG)
    assert set(inputs) == {"proprio", "height_map", "command"}
    assert inputs["height_map"].shape == (1, 3, 2) and inputs["command"].shape == (1, 3)


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda o: setattr(o, "proprio", np.array([np.nan, 1.0, 2.0])), "proprio contains NaN"),
        (lambda o: setattr(o, "proprio", np.zeros(4)), r"proprio has shape \(4,\)"),
        (lambda o: setattr(o, "height_map", None), "height_map missing"),
        (lambda o: setattr(o, "command", np.array([np.inf, 0, 0])), "command contains NaN"),
    ],
)
def test_bad_observations_raise(spoil, message):
    obs = dog_obs()
    spoil(obs)
    with pytest.raises(ObservationError, match=message):
        observation_to_inputs(obs, DOG)


def test_missing_or_misshapen_camera_raises():
    obs = arm_obs()
    del obs.images["side"]
    with pytest.raises(ObservationError, match="camera 'side' missing"):
        observation_to_inputs(obs, ARM)
    obs = arm_obs()
    obs.images["side"] = np.zeros((4, 6, 3), np.float32)
    with pytest.raises(ObservationError, match="expected uint8"):
        observation_to_inputs(obs, ARM)


def test_history_repeats_first_observation_then_rolls():
    history = ObservationHistory(DOG, history=3)
    history.reset(dog_obs(0.0))
    proprio, actions = history.tensors()
    assert proprio.shape == (1, 3, 3) and actions.shape == (1, 3, 2)
    assert torch.all(proprio[0, :, 0] == 0.0) and torch.all(actions == 0)
    history.push(dog_obs(0.0), np.array([0.1, 0.2]))
    history.push(dog_obs(1.0), np.array([0.3, 0.4]))
    proprio, actions = history.tensors()
    np.testing.assert_allclose(proprio[0, :, 0], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(actions[0], [[0.0, 0.0], [0.1, 0.2], [0.3, 0.4]], rtol=1e-6)
    with pytest.raises(ObservationError, match="action contains NaN"):
        history.push(dog_obs(2.0), np.array([np.nan, 0.0]))


# ---------------------------------------------------------------- Agent and evaluation on tasks
def _tiny_model(robot: str, spec: RobotSpec):
    torch.manual_seed(0)
    if robot == "go2":
        cfg = go2_config(latent_dim=16, history=3, horizon=3)
    else:
        image = ImageEncoderConfig(
            spec.cameras,
            32,
            32,
            backbone="small_cnn",
            small_cnn_channels=(8, 8),
            small_cnn_features=16,
        )
        cfg = ur5e_small_config(
            latent_dim=16, proprio_dim=spec.proprio_dim, history=3, horizon=3, image=image
        )
    return WorldModel(cfg).eval()


SMALL_PLANNER = dict(num_samples=24, num_elites=6, iterations=2)


def test_agent_rejects_a_model_for_another_robot():
    model = _tiny_model("go2", DOG)
    with pytest.raises(ValueError, match="proprio_dim 35 != robot 3"):
        Agent(model, DOG)


@pytest.mark.parametrize("task_name", ["peg", "go2_flat"])
def test_evaluation_table_has_a_row_per_agent(task_name):
    probe = make_task(task_name, **task_overrides(task_name, max_steps=3))
    model = _tiny_model("go2" if task_name.startswith("go2") else "ur5e", probe.spec)
    probe.close()
    task = make_task(task_name, **task_overrides(task_name, max_steps=3, model=model))
    try:
        agents = build_agents(("expert", "policy", "planner"), task, model, **SMALL_PLANNER)
        summaries = evaluate(task, agents, episodes=1, seed=5, progress=False)
    finally:
        task.close()
    assert [s.agent for s in summaries] == ["expert", "policy", "planner"]
    for s in summaries:
        assert s.episodes == 1 and s.errors == 0 and 1 <= s.mean_steps <= 3
        assert (
            0.0 <= s.success_rate <= 1.0
            and np.isfinite(s.mean_return)
            and s.episodes_per_minute > 0
        )
        assert np.isfinite(s.mean_distance) == task_name.startswith("go2")
    plan = agents["planner"].last_plan
    assert plan is not None and plan.mean.shape == (3, task.spec.action_dim)
    table = format_table(summaries, "t")
    assert [line.split()[0] for line in table.splitlines()[3:]] == ["expert", "policy", "planner"]


def test_planner_error_ends_the_episode_as_a_counted_failure():
    task = make_task("go2_flat", **task_overrides("go2_flat", max_steps=3))
    model = _tiny_model("go2", task.spec)
    with torch.no_grad():
        model.value_head.out.bias.fill_(float("nan"))  # a broken checkpoint
    try:
        agents = build_agents(("planner",), task, model, **SMALL_PLANNER)
        (summary,) = evaluate(task, agents, episodes=1, progress=False)
    finally:
        task.close()
    assert summary.errors == 1 and summary.success_rate == 0.0 and summary.mean_steps == 0


def test_cli_prints_the_table(tmp_path, capsys):
    task = make_task("go2_flat")
    save_checkpoint(_tiny_model("go2", task.spec), tmp_path / "ckpt")
    task.close()
    assert (
        main(
            [
                "--task",
                "go2_flat",
                "--checkpoint",
                str(tmp_path / "ckpt"),
                "--episodes",
                "2",
                "--seed",
                "3",
                "--max-steps",
                "2",
                "--agents",
                "policy,planner",
                "--samples",
                "24",
                "--elites",
                "6",
                "--iterations",
                "1",
                "--no-progress",
                "--episodes-out",
                str(tmp_path / "episodes.jsonl"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "go2_flat sim: 2 episodes per agent, seeds 3..4" in out
    assert [line.split()[0] for line in out.strip().splitlines()[-2:]] == ["policy", "planner"]
    # one line per episode, with the task's report of the episode's last step
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert [(e["agent"], e["seed"], e["steps"]) for e in episodes] == [
        ("policy", 3, 2),
        ("policy", 4, 2),
        ("planner", 3, 2),
        ("planner", 4, 2),
    ]
    assert all(e["end"]["distance"] == e["distance"] and "fallen" in e["end"] for e in episodes)


def test_cli_planner_overrides_reach_the_planner():
    """--samples/--elites/--temperature/--mixture-coef/--policy-noise/--init-std/--warm-start/
    --policy-prior replace the robot's defaults, nothing else."""

    args = parse_args(
        [
            "--samples",
            "24",
            "--elites",
            "6",
            "--temperature",
            "7.5",
            "--mixture-coef",
            "0.25",
            "--policy-noise",
            "0.02",
            "--init-std",
            "0.3",
            "--warm-start",
            "policy",
            "--policy-prior",
            "20",
        ]
    )
    overrides = planner_overrides(args)
    assert overrides == {
        "num_samples": 24,
        "num_elites": 6,
        "temperature": 7.5,
        "mixture_coef": 0.25,
        "policy_noise_std": 0.02,
        "init_std": 0.3,
        "warm_start": "policy",
        "policy_prior": 20.0,
    }
    task = make_task("go2_flat")
    planner = build_agents(["planner"], task, _tiny_model("go2", task.spec), **overrides)[
        "planner"
    ].planner
    task.close()
    c = planner.config
    assert (
        c.num_samples,
        c.num_elites,
        c.temperature,
        c.num_policy_samples,
        c.policy_noise_std,
    ) == (24, 6, 7.5, 6, 0.02)
    assert (c.init_std, c.warm_start, c.policy_prior) == (0.3, "policy", 20.0)
    assert planner.config.iterations == 8  # not overridden: the robot's default


def test_cli_evaluates_the_hardware_stand_in(tmp_path, capsys):
    task = make_task("slippery_slope", "real")
    save_checkpoint(_tiny_model("go2", task.spec), tmp_path / "ckpt")
    task.close()
    assert (
        main(
            [
                "--task",
                "slippery_slope",
                "--variant",
                "real",
                "--checkpoint",
                str(tmp_path / "ckpt"),
                "--episodes",
                "1",
                "--max-steps",
                "2",
                "--agents",
                "expert,policy",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "slippery_slope real: 1 episodes per agent" in out
    assert [line.split()[0] for line in out.strip().splitlines()[-2:]] == ["expert", "policy"]
    with pytest.raises(ValueError, match="no 'real' variant"):
        main(["--task", "go2_slope", "--variant", "real", "--episodes", "1", "--no-progress"])


# ---------------------------------------------------------------- ablation harness pieces
def test_ablation_table_prints_paper_figures_beside_ours():
    table = format_ablation_table(
        {"full data": {"peg": 0.5, "go2_flat": 3.25}}, ("peg", "go2_flat"), "T"
    )
    lines = table.splitlines()
    assert [line[:20].strip() for line in lines[3:]] == [r.name for r in ROWS]
    full = lines[3]
    assert "0.50 (0.90)" in full and "- (0.85)" in full and "3.25 (22.78)" in full
    assert "- (0.72)" in lines[4]


def test_ablation_data_selection_nests_and_matches_volume(tmp_path):
    scale = AblationScale(
        name="test",
        tasks=("go2_flat",),
        episodes={"go2_flat": 10},
        max_steps={"go2_flat": 12},
        train_steps=1,
        batch_size=2,
        eval_episodes=1,
    )
    mixed, expert = generate_data("go2_flat", scale, tmp_path)
    assert generate_data("go2_flat", scale, tmp_path) == (mixed, expert)  # second call reuses
    configs = {r.name: pretrain_config(r, "go2_flat", mixed, expert, scale) for r in ROWS}
    assert configs["MLP reward/value"].model_overrides == {"head_kind": "mlp"}
    assert configs["+ reconstruction"].model_overrides == {"loss": {"reconstruction": 1.0}}
    by_name = {name: selected_dataset(cfg) for name, cfg in configs.items()}
    full = by_name["full data"]
    assert (
        full.num_episodes == 10
        and by_name["50% data"].num_episodes == 5
        and by_name["10% data"].num_episodes == 1
    )
    assert by_name["expert-only data"].num_steps >= full.num_steps
    ids = {k: {d.episode_info(i)["id"] for i in range(d.num_episodes)} for k, d in by_name.items()}
    assert ids["10% data"] <= ids["50% data"] <= ids["full data"]
    info = [
        by_name["expert-only data"].episode_info(i)
        for i in range(by_name["expert-only data"].num_episodes)
    ]
    assert all(i["policy"] == 0 and i["never_noised"] for i in info)
