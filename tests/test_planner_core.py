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
from simdist_planner.ros.planner_core import (
    ANSWER_MIN_SEEN,
    ERROR,
    OK,
    REPORTED_COUNTS,
    WARN,
    LatencyEstimate,
    PlannerCore,
    PlanningTicks,
    load_world_model,
)

SPEC = robot_spec("ur5e")
PERIOD = 0.2


def values(**changes) -> dict:
    """The node's parameter values with the UR5e preset's planner settings."""
    config = planner_config_for(SPEC, "ur5e")
    base = {f: getattr(config, f) for f in PLANNER_FIELDS}
    base |= dict(lockstep=False, fallback_to_policy=True, deadline_fraction=0.9, reprobe_ticks=0,
                 control_rate_hz=1 / PERIOD, max_observation_age_s=0.5, min_answer_share=0.9,
                 device="cpu")  # fmt: skip
    return base | changes


def observation(spec, seed=0, stamp=0.0) -> Observation:
    rng = np.random.default_rng(seed)
    return Observation(
        stamp=stamp,
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


# --- the ticks: which observation is planned on, the counters, the diagnostic ------------------
S = 1_000_000_000  # ns per second


def ticking(checkpoint, **changes) -> tuple[PlanningTicks, dict]:
    return PlanningTicks(installed(checkpoint, **changes)), values(**changes)


def test_a_tick_plans_on_the_newest_observation_once_and_counts_the_superseded(checkpoint):
    ticks, v = ticking(checkpoint)
    spec, book = ticks.core.spec, ticks.book
    assert ticks.tick(v, 0) is None  # nothing arrived yet
    assert book.observe(1 * S, observation(spec, 1), lockstep=False) == "new"
    assert book.observe(2 * S, observation(spec, 2), lockstep=False) == "new"  # 1 s superseded
    tick = ticks.tick(v, 2 * S)
    assert tick.stamp == 2 * S and tick.chunk is not None and not (tick.error or tick.skipped)
    assert tick.period == PERIOD and tick.chunk.shape[1] == SPEC.action_dim
    ticks.sent(tick, 2 * S + 10**7, v["min_answer_share"])
    assert tick.level == OK and tick.status == "planning with MPPI"
    assert ticks.tick(v, 2 * S) is None  # the same observation is never planned twice
    assert list(book.answered) == [False, True]
    report = ticks.report()
    assert report["ticks"] == report["mppi_ticks"] == 1 and report["last_stamp"] == 2 * S
    assert report["observation_to_action_ms"] == "10.00" and report["answer_share"] == "n/a"
    assert set(REPORTED_COUNTS) <= set(report) and report["checkpoint"] == checkpoint
    assert book.stats["ticks_without_new_observation"] == 2


def test_an_old_observation_is_not_planned_on_in_real_time_but_is_in_lockstep(checkpoint):
    ticks, v = ticking(checkpoint)
    ticks.book.observe(1 * S, observation(ticks.core.spec), lockstep=False)
    tick = ticks.tick(v, 2 * S)  # 1 s old > max_observation_age_s 0.5
    assert tick.chunk is None and tick.level == WARN and "1.000 s old" in tick.skipped
    assert ticks.book.stats["stale_observations"] == 1 and list(ticks.book.answered) == [False]
    lockstep = values(lockstep=True)  # the simulator waits: age does not matter
    ticks.book.observe(3 * S, observation(ticks.core.spec), lockstep=True)
    tick = ticks.tick(lockstep, 60 * S)
    assert tick.chunk is not None and tick.period == 1 / SPEC.control_rate_hz


def test_a_resent_lockstep_tick_gets_the_same_answer_again_never_a_second_plan(checkpoint):
    ticks, v = ticking(checkpoint, lockstep=True)
    book, obs = ticks.book, observation(ticks.core.spec)
    assert book.observe(1 * S, obs, lockstep=True) == "new"
    tick = ticks.tick(v, 1 * S)
    assert book.observe(1 * S, obs, lockstep=True) == "answered"  # taken, nothing sent yet
    ticks.sent(tick, 1 * S, 0.9)
    assert book.observe(1 * S, obs, lockstep=True) == "republish"
    assert book.stats["republished"] == 1 and ticks.tick(v, 1 * S) is None


def test_a_failed_plan_is_answered_with_hold_and_counted(tmp_path):
    ticks, v = ticking(make_checkpoint(tmp_path / "nan", scale=1e30))
    ticks.book.observe(1 * S, observation(ticks.core.spec), lockstep=False)
    tick = ticks.tick(v, 1 * S)
    assert tick.chunk is None and tick.error and tick.level == ERROR
    assert tick.status.startswith(f"no plan for stamp {1 * S}, HOLD sent")
    ticks.sent(tick, 1 * S, 0.9)
    assert ticks.book.stats["failed_plans"] == 1 and ticks.book.sent_stamp == 1 * S
    assert not ticks.book.answered  # HOLD answers no observation with a plan


def test_no_model_skips_the_tick_with_an_error():
    ticks = PlanningTicks(PlannerCore("ur5e", "ur5e", latency_ema=0.2))
    ticks.book.observe(1 * S, observation(SPEC), lockstep=False)
    tick = ticks.tick(values(), 1 * S)
    assert tick.level == ERROR and "no model loaded" in tick.skipped and tick.chunk is None
    assert ticks.report()["checkpoint"] == "no model"


def test_deadline_misses_the_policy_fallback_and_the_answered_share(checkpoint):
    """A control period shorter than any plan: every tick misses its deadline; once the latency
    estimate exceeds it, the base policy plans (WARN). Observations answered one in five: the
    diagnostic says fewer than min_answer_share were answered."""
    ticks, v = ticking(checkpoint)
    v |= dict(control_rate_hz=1e6)
    spec, book = ticks.core.spec, ticks.book
    stamp = 0
    for k in range(ANSWER_MIN_SEEN * 5):
        stamp = (k + 1) * 1000
        book.observe(stamp, observation(spec, k), lockstep=False)
        if k % 5 == 4:
            tick = ticks.tick(v, stamp)
            ticks.sent(tick, stamp, v["min_answer_share"])
    assert book.stats["deadline_misses"] == book.stats["ticks"] == ANSWER_MIN_SEEN
    assert book.stats["mppi_ticks"] == 1 and book.stats["policy_fallbacks"] == ANSWER_MIN_SEEN - 1
    assert tick.use_policy and tick.level == WARN and "base policy" in tick.status
    assert book.answer_share() == pytest.approx(0.2)
    assert f"answered {ANSWER_MIN_SEEN} of the last {5 * ANSWER_MIN_SEEN}" in tick.status


def test_episode_messages_and_parameter_checks():
    core = PlannerCore("ur5e", "ur5e", latency_ema=0.2)
    book = PlanningTicks(core).book
    assert book.episode_message('{"episode": 3, "seed": 9}') is None and book.episode == (3, 9)
    assert "unreadable /simdist/episode" in book.episode_message("not json")
    assert book.episode == (3, 9)  # an unreadable message changes nothing
    assert "not a torch device" in core.check_param("device", values(device="gpu7"))
    assert core.check_param("deadline_fraction", values()) is None
    core.apply_params({"latency_ema": 0.5}, values(latency_ema=0.5))
    assert core.latency.alpha == 0.5
