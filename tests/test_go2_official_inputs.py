"""The Go2 inputs that reach the world model are the official deployment's, term by term.

The official controller (`go2_ros2_ws/.../simdist_controller_node.py`, `simdist/control/
controller_base.py`) keeps a ring buffer of H + 1 items {proprio_obs, extero_obs, prev_action},
filled with the first item at reset, and feeds the model proprio_obs[-(H+1):], extero_obs[-1],
prev_action[-H:] and the command tiled over T + 1 steps. Its proprio_obs is the expert
observation's entries 0:9, 12:36 and 363:365 (base linear and angular velocity, projected
gravity, joint positions relative to the default pose, joint velocities, cos / sin of the gait
phase with period 0.5 s), extero_obs its height scan 48:363, and prev_action the raw action it
sent last (../shared/simdist_go2_world_model/README.md, ../shared/simdist_go2_experts/
OBSERVATION.md). The tests build those inputs from the simulator's expert observation and check
that the project's path gives the model the same: in-process (simdist-eval's agent) and through
the ROS messages and the ingestion core (the driver -> ingestion -> planner node path).
"""

from __future__ import annotations

import collections
import os
import pathlib

import numpy as np
import pytest

from conftest import ROOT
from robot_drivers import ros_msgs
from robot_drivers.go2.config import DEFAULT_POSE_UNITREE
from robot_drivers.go2.observation import EXPERT_OBS_SLICES, grid_to_scan
from robot_drivers.ingestion import Ingestion, IngestionConfig
from robot_drivers.registry import make_task
from simdist_planner.evaluation.agents import Agent
from simdist_planner.model.official import load_official, reference_outputs
from simdist_planner.planning.observation import ObservationHistory, observation_arrays

H, T = 25, 25  # the official model's history and horizon
STEPS = 40  # > H + 1, so the history fills with real steps
PHASE_PERIOD_S, CONTROL_DT = 0.5, 0.02
EXPORT = pathlib.Path(
    os.environ.get("SIMDIST_GO2_WORLD_MODEL", ROOT.parent / "shared" / "simdist_go2_world_model")
)


def official_item(expert_obs: np.ndarray, prev_action: np.ndarray) -> dict[str, np.ndarray]:
    """One item of the official controller's buffer, from the 433-dim expert observation."""
    e, s = expert_obs, EXPERT_OBS_SLICES
    proprio = np.concatenate(
        [
            e[s["base_lin_vel"]],
            e[s["base_ang_vel"]],
            e[s["projected_gravity"]],
            e[s["joint_pos_rel"]],
            e[s["joint_vel_rel"]],
            e[s["cos_sin_phase"]],
        ]
    )
    assert (s["base_lin_vel"].start, s["joint_pos_rel"].start, s["cos_sin_phase"].start) == (
        0,
        12,
        363,
    )
    assert s["height_scan"] == slice(48, 363)
    return {
        "proprio_obs": proprio,
        "extero_obs": e[s["height_scan"]].copy(),
        "prev_action": np.asarray(prev_action, np.float32),
        "command": e[s["velocity_commands"]].copy(),
    }


class OfficialBuffer:
    """controller_base.ControllerBase's buffer and MppiController._make_model_inputs."""

    def __init__(self, first: dict):
        self.items = collections.deque([first] * (H + 1), maxlen=H + 1)

    def update(self, item: dict) -> None:
        self.items.append(item)

    def inputs(self) -> dict[str, np.ndarray]:
        items = list(self.items)
        return {
            "in/proprio_obs_hist": np.stack([i["proprio_obs"] for i in items])[-(H + 1) :],
            "in/extero_obs": items[-1]["extero_obs"],
            "in/acts_hist": np.stack([i["prev_action"] for i in items])[-H:],
            "in/fut_acts": np.zeros((T, 12), np.float32),
            "in/fut_cmds": np.tile(items[-1]["command"], (T + 1, 1)),
        }


def _rollout(seed: int = 2):
    """go2_flat driven by small random raw actions: (observations o_0..o_n, actions a_0..a_n-1)."""
    task = make_task("go2_flat")
    obs = task.reset(seed)
    rng = np.random.default_rng(seed)
    observations, actions = [obs], []
    for _ in range(STEPS):
        action = rng.normal(0.0, 0.3, 12).astype(np.float32)
        observations.append(task.step(action).obs)
        actions.append(action)
    return task, observations, actions


@pytest.fixture(scope="module")
def rollout():
    return _rollout()


def _ros_round_trip(observations, spec):
    """Each driver observation through the ROS path: the MuJoCo driver's messages, the ingestion
    node's decoding, alignment and republishing, and the planner node's ObservationAssembler."""
    core = Ingestion(
        IngestionConfig(height_map_shape=tuple(spec.height_map_shape), proprio_dim=spec.proprio_dim)
    )
    assembler = ros_msgs.ObservationAssembler((), has_height_map=True, spec=spec)
    received = []
    for k, obs in enumerate(observations):
        stamp = 1_000_000_000 + k * 20_000_000
        proprio_msg = ros_msgs.proprio_to_msg(obs, spec, stamp)  # mujoco_driver_node
        height_msg = ros_msgs.height_map_to_msg(obs.height_map, stamp)
        proprio, command = ros_msgs.split_proprio_msg(proprio_msg)  # ingestion_node
        core.add_proprio(stamp, proprio, command, list(proprio_msg.name))
        core.add_height_map(stamp, ros_msgs.height_map_from_msg(height_msg))
        (aligned,) = core.pop_aligned()
        out = [
            ros_msgs.height_map_to_msg(aligned.height_map, aligned.stamp_ns),
            ros_msgs.pack_proprio(
                aligned.proprio_names, aligned.proprio, aligned.command, aligned.stamp_ns, "go2"
            ),
        ]
        assert assembler.add_height_map(out[0]) is None  # planner_node
        received.append(assembler.add_proprio(out[1]))
    return received


def _check_official_inputs(observations, actions, spec):
    """Step through the episode as the planner does; at each step the project's model inputs
    must equal the official controller's, term by term."""
    history = ObservationHistory(spec, H)
    history.reset(observations[0])
    prev = np.zeros(12, np.float32)
    buffer = OfficialBuffer(official_item(observations[0].privileged["expert_obs"], prev))
    for k, obs in enumerate(observations[:-1]):
        expert = obs.privileged["expert_obs"]
        if k:
            buffer.update(official_item(expert, prev))
        official = buffer.inputs()
        arrays = observation_arrays(obs, spec)
        # o_t and the H pairs (o_{t-H+i}, a_{t-H+i}) before it
        proprio_hist = np.concatenate([history.proprio, arrays["proprio"][None]])
        np.testing.assert_array_equal(proprio_hist, official["in/proprio_obs_hist"])
        np.testing.assert_array_equal(history.actions, official["in/acts_hist"])
        np.testing.assert_array_equal(grid_to_scan(arrays["height_map"]), official["in/extero_obs"])
        np.testing.assert_array_equal(arrays["command"], official["in/fut_cmds"][0])
        # the raw action (before the 0.25 scale) is what the expert observation reports
        np.testing.assert_array_equal(expert[EXPERT_OBS_SLICES["actions"]], prev)
        history.push(obs, actions[k])
        prev = actions[k]
    return official


def _check_terms(observations, task):
    """The proprio terms that the expert-observation tests do not pin for the model's input."""
    for k, obs in enumerate(observations):
        p = obs.proprio
        phi = 2.0 * np.pi * k * CONTROL_DT / PHASE_PERIOD_S  # steps since reset, period 0.5 s
        np.testing.assert_allclose(p[33:35], [np.cos(phi), np.sin(phi)], atol=1e-6)
        np.testing.assert_allclose(p[9:21], obs.joint_pos - DEFAULT_POSE_UNITREE, atol=1e-6)
        np.testing.assert_allclose(p[21:33], obs.joint_vel, atol=1e-6)
        np.testing.assert_allclose(p[0:3], obs.privileged["base_lin_vel"], atol=1e-6)
        np.testing.assert_allclose(p[6:9], obs.privileged["projected_gravity"], atol=1e-6)
        # flat floor at z = 0: every scan entry is base_z - 0.3, clipped to [-1, 1]
        z = obs.privileged["base_pos"][2]
        np.testing.assert_allclose(obs.height_map, np.clip(z - 0.3, -1, 1), atol=1e-4)
    assert task.config.go2.gait_period == PHASE_PERIOD_S
    assert task.config.go2.control_dt == CONTROL_DT


def test_simulator_inputs_are_the_official_deployments(rollout):
    task, observations, actions = rollout
    _check_terms(observations, task)
    _check_official_inputs(observations, actions, task.backend.spec)


def test_ros_path_inputs_are_the_official_deployments(rollout):
    task, observations, actions = rollout
    spec = task.backend.spec
    received = _ros_round_trip(observations, spec)
    for sent, got in zip(observations, received):
        assert got is not None
        np.testing.assert_array_equal(got.proprio, sent.proprio)
        np.testing.assert_array_equal(got.height_map, sent.height_map)
        np.testing.assert_array_equal(got.command, sent.command)
        got.privileged = sent.privileged  # the expert observation is not sent; compare against it
    _check_official_inputs(received, actions, spec)


def test_the_imported_model_acts_on_simulator_inputs_as_the_official_controller():
    """pi of the imported model, driving go2_flat through simdist-eval's agent, chooses the
    action the official controller's inputs give (its first action, within the action bounds
    the agent clips to)."""
    if not (EXPORT / "weights.npz").is_file():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"official Go2 world model export missing at {EXPORT}")
        pytest.skip(f"official Go2 world model export missing at {EXPORT}")
    model = load_official(EXPORT / "weights.npz", EXPORT / "model_config.yaml").build()
    task = make_task("go2_flat")
    spec = task.backend.spec
    agent = Agent(model, spec)  # simdist-eval's `policy` agent
    agent.reset(0)
    obs = task.reset(5)
    prev = np.zeros(12, np.float32)
    buffer = OfficialBuffer(official_item(obs.privileged["expert_obs"], prev))
    for k in range(H + 5):
        if k:
            buffer.update(official_item(obs.privileged["expert_obs"], prev))
        official = reference_outputs(model, {n: v[None] for n, v in buffer.inputs().items()})
        want = np.clip(official["inference/actions"][0, 0], spec.action_low, spec.action_high)
        action = agent.act(obs)
        np.testing.assert_allclose(action, want, atol=1e-5)
        obs = task.step(action).obs
        prev = action
