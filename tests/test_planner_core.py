"""The planner node's logic without ROS (simdist_planner.ros.planner_core): model loading and
hot-swap checks, parameter values -> PlannerConfig, the deadline fallback and the plan of one
observation, on a small randomly initialised UR5e world model."""

import subprocess
import sys

import numpy as np
import pytest

from checkpoint_helpers import make_checkpoint
from robot_drivers.interface import Observation
from robot_drivers.specs import robot_spec
from simdist_planner.planning.config import PLANNER_FIELDS, planner_config_for
from simdist_planner.ros.planner_core import LatencyEstimate, PlannerCore, load_world_model

SPEC = robot_spec("ur5e")
PERIOD = 0.2


def values(**changes) -> dict:
    """The node's parameter values with the UR5e preset's planner settings."""
    config = planner_config_for(SPEC, "ur5e")
    base = {f: getattr(config, f) for f in PLANNER_FIELDS}
    base |= dict(lockstep=False, fallback_to_policy=True, deadline_fraction=0.9, reprobe_ticks=0)
    return base | changes


def observation(spec, seed=0) -> Observation:
    rng = np.random.default_rng(seed)
    return Observation(
        stamp=0.0,
        proprio=rng.normal(size=spec.proprio_dim).astype(np.float32),
        images={
            c: rng.integers(0, 255, (*spec.image_shape, 3), dtype=np.uint8) for c in spec.cameras
        },
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ck") / "model")


def installed(checkpoint, **changes) -> PlannerCore:
    core = PlannerCore("ur5e", "ur5e", latency_ema=0.2)
    core.install(load_world_model(checkpoint, "cpu"), values(**changes))
    return core


def test_the_core_imports_without_rclpy():
    code = "import sys, simdist_planner.ros.planner_core; assert 'rclpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_latency_estimate_is_pessimistic_scales_and_resets():
    est = LatencyEstimate(alpha=0.5)
    assert est.predict() == 0.0  # MPPI is tried first
    est.update(0.1)
    est.update(0.3)
    assert est.mean == pytest.approx(0.2) and est.dev == pytest.approx(0.1)
    assert est.predict() == pytest.approx(0.2 + 3 * 0.1)
    est.scale(2.0)
    assert est.predict() == pytest.approx(1.0)
    est.reset()
    assert est.predict() == 0.0


def test_falls_back_when_mppi_would_miss_the_deadline_and_reprobes_every_n_ticks():
    core = PlannerCore("ur5e", "ur5e", latency_ema=0.2)
    assert not core.should_fall_back(values(), PERIOD)  # no estimate yet
    core.latency.update(0.5)  # > 0.9 x 0.2 s
    assert core.should_fall_back(values(), PERIOD)
    assert not core.should_fall_back(values(lockstep=True), PERIOD)  # the simulator waits
    assert not core.should_fall_back(values(fallback_to_policy=False), PERIOD)
    assert not core.should_fall_back(values(deadline_fraction=1.0), 1.0)  # 0.5 s fits in 1 s
    probing = [core.should_fall_back(values(reprobe_ticks=3), PERIOD) for _ in range(6)]
    assert probing == [True, True, False, True, True, False]


def test_a_new_episode_is_the_first_plan_and_each_new_episode_id():
    core = PlannerCore("ur5e", "ur5e", latency_ema=0.2)
    assert core.new_episode(None)  # the first plan
    assert not core.new_episode(None)
    assert not core.new_episode((1, 7))  # learnt late: adopted without a reset
    assert not core.new_episode((1, 7))
    assert core.new_episode((2, 8))


def test_plans_a_bounded_chunk_with_mppi_or_the_base_policy(checkpoint):
    core = installed(checkpoint)
    obs = observation(core.spec)
    chunk, rewards, vals = core.plan(obs, None, use_policy=False, loaded=core.loaded)
    horizon = core.loaded.horizon
    assert chunk.shape == (horizon, SPEC.action_dim) and np.all(np.isfinite(chunk))
    assert rewards.shape == (horizon,) and vals.shape == (horizon,)
    assert np.all(chunk >= np.array(SPEC.action_low) - 1e-6)
    assert np.all(chunk <= np.array(SPEC.action_high) + 1e-6)
    chunk, rewards, vals = core.plan(obs, None, use_policy=True, loaded=core.loaded)
    assert chunk.shape == (horizon, SPEC.action_dim) and rewards is None and vals is None


def test_parameter_values_are_checked_against_the_loaded_model(checkpoint):
    core = PlannerCore("ur5e", "ur5e", latency_ema=0.2)
    assert core.check_planner_values(values(num_elites=10**6)) is None  # no model yet
    core.install(load_world_model(checkpoint, "cpu"), values())
    assert core.check_planner_values(values()) is None
    assert "num_elites" in core.check_planner_values(values(num_elites=10**6))
    assert "must equal the model's horizon" in core.check_planner_values(values(horizon=3))
    old = core.planner
    core.latency.update(0.1)
    core.retune(values(iterations=2 * old.config.iterations))
    assert core.planner is not old and core.planner.config.iterations == 2 * old.config.iterations
    assert core.latency.mean == pytest.approx(0.2)  # cost scales with candidates x iterations


def test_a_hot_swap_candidate_must_keep_the_interface_and_plan_finitely(checkpoint, tmp_path):
    core = installed(checkpoint)
    obs = observation(core.spec)
    core.validate(
        load_world_model(make_checkpoint(tmp_path / "same", seed=1), "cpu"), values(), obs
    )
    other = load_world_model(make_checkpoint(tmp_path / "other", seed=1, history=1), "cpu")
    with pytest.raises(ValueError, match="differs from the running model's"):
        core.validate(other, values(), obs)
    go2 = PlannerCore("go2", "go2", latency_ema=0.2)
    with pytest.raises(ValueError, match="is a ur5e model; this planner's parameters are go2's"):
        go2.validate(load_world_model(checkpoint, "cpu"), values(), None)
