"""Go2 tasks, the official expert / checkpoints / critic, and the sim-vs-real gap."""

import json

import numpy as np
import pytest

from robot_drivers import registry
from robot_drivers.experts.go2 import (
    TorchScriptGo2Policy,
    experts_dir,
    load_go2_critic,
    load_go2_ladder,
)
from robot_drivers.registry import expert_ladder, expert_value, make_task
from robot_drivers.tasks.go2_tasks import FOAM_GAP, GO2_COURSES, SLIPPERY_SLOPE_GAP, rollout


@pytest.fixture(scope="module")
def ladder():
    return load_go2_ladder()


@pytest.mark.parametrize(
    "name,variant",
    [("go2_flat", "sim"), ("go2_slope", "sim"), ("slippery_slope", "real"), ("foam", "real")],
)
def test_tasks_reset_step_and_score(name, variant):
    task = make_task(name, variant)
    obs = task.reset(0)
    assert obs.proprio.shape == (35,) and obs.height_map.shape == (21, 15)
    assert obs.command.shape == (3,) and obs.privileged["expert_obs"].shape == (433,)
    r = task.step(np.zeros(12))
    assert np.isfinite(r.reward) and isinstance(r.reward, float)
    assert set(r.info) >= {"distance", "fallen", "vel_rmse"}
    json.dumps(r.info)  # the driver node publishes it as JSON
    assert not r.success and not r.truncated
    # a course's limit follows the command (2.5 x its length / 0.5 m/s); go2_flat runs 20 s
    course = {"go2_flat": None, "go2_slope": 1.82, "slippery_slope": 1.82, "foam": 3.0}[name]
    assert task.max_steps == (1000 if course is None else round(2.5 * course / 0.5 / 0.02))


def test_real_variants_are_documented_changes_of_the_sim_course():
    sim, real = make_task("slippery_slope", "sim"), make_task("slippery_slope", "real")
    assert sim.backend.terrain.panel_friction == 0.8
    assert real.backend.terrain.panel_friction == SLIPPERY_SLOPE_GAP.panel_friction
    assert sim.backend.terrain.panels == real.backend.terrain.panels
    foam = make_task("foam", "real")
    assert foam.backend.terrain.pad_solref == FOAM_GAP.pad_solref
    assert make_task("foam", "sim").backend.terrain.pad_solref == (0.02, 1.0)
    assert SLIPPERY_SLOPE_GAP.description and FOAM_GAP.description


def test_speed_and_panel_friction_are_task_options():
    """The paper's two knobs of the Slippery Slope stand-in: the commanded speed (the episode
    limit follows it) and the PTFE panels' friction; anything else is refused by name."""
    task = make_task("slippery_slope", "real", speed=0.3, panel_friction=0.12)
    assert task.backend.terrain.panel_friction == 0.12
    assert task.config.gap.name == "slippery_slope" and "0.12" in task.config.gap.description
    assert task.config.command == (0.3, 0.0, 0.0)
    assert task.max_steps == round(2.5 * 1.82 / 0.3 / 0.02)  # 15.2 s
    obs = task.reset(0)
    np.testing.assert_allclose(obs.command[0], 0.3)  # the model is commanded the same speed
    slow = make_task("foam", "real", speed=0.2)
    assert slow.max_steps == round(2.5 * 3.0 / 0.2 / 0.02)
    assert make_task("slippery_slope", "real", panel_friction=0.15).config.gap is SLIPPERY_SLOPE_GAP
    # an explicit episode length wins over the derived one
    assert make_task("slippery_slope", "real", speed=0.1, episode_s=2.0).max_steps == 100
    with pytest.raises(ValueError, match="panel_friction"):
        make_task("slippery_slope", "sim", panel_friction=0.12)
    with pytest.raises(ValueError, match="panel_friction"):
        make_task("foam", "real", panel_friction=0.12)
    with pytest.raises(ValueError, match="panel_friction must be"):
        make_task("slippery_slope", "real", panel_friction=0.0)
    with pytest.raises(ValueError, match="speed must be"):
        make_task("slippery_slope", "real", speed=-0.3)
    with pytest.raises(ValueError, match="either speed or command"):
        make_task("go2_flat", "sim", speed=0.3, command=(0.3, 0.0, 0.0))
    with pytest.raises(ValueError, match="follows the commanded speed"):
        make_task("go2_slope", "sim", command=(0.0, 0.0, 0.0))


def test_bad_task_arguments_raise_clearly():
    with pytest.raises(ValueError, match="no 'real' variant"):
        make_task("go2_flat", "real")
    with pytest.raises(ValueError, match="unknown override"):
        make_task("go2_flat", "sim", velocity=1.0)
    with pytest.raises(ValueError, match="command"):
        make_task("go2_flat", "sim", command=(0.5, np.nan, 0.0))
    task = make_task("go2_flat", "sim")
    with pytest.raises(RuntimeError, match="reset"):
        task.step(np.zeros(12))
    task.reset(0)
    with pytest.raises(ValueError, match="shape"):
        task.step(np.zeros(3))
    # every course is a registered Go2 task and every registered Go2 task a course
    assert set(GO2_COURSES) == set(registry.tasks_of("go2"))
    with pytest.raises(ValueError, match="stand-ins are 'slippery_slope', 'foam'"):
        make_task("go2_slope", "real")


def test_command_override_and_heading_hold():
    task = make_task("go2_flat", "sim", command=(0.3, 0.1, 0.0), heading_gain=1.0)
    obs = task.reset(0)
    np.testing.assert_allclose(obs.command, [0.3, 0.1, 0.0], atol=1e-6)
    d = task.backend.data
    yaw = 0.3  # turn the robot left: the yaw command steers it back
    d.qpos[3:7] = (np.cos(yaw / 2), 0, 0, np.sin(yaw / 2))
    r = task.step(np.zeros(12))
    assert r.obs.command[2] == pytest.approx(-yaw, abs=0.02)
    assert r.obs.privileged["expert_obs"][11] == pytest.approx(r.obs.command[2])


def test_command_ranges_sample_one_command_per_episode():
    ranges = ((-0.5, 1.5), (-0.5, 0.5), (0.0, 0.0))
    task = make_task("go2_flat", "sim", command_ranges=ranges, heading_gain=0.0)
    c1, c2, c3 = (task.reset(s).command for s in (5, 5, 6))
    np.testing.assert_array_equal(c1, c2)
    assert not np.allclose(c1, c3)
    for c in (c1, c3):
        assert all(lo <= v <= hi for v, (lo, hi) in zip(c, ranges))
    with pytest.raises(ValueError, match="command_ranges"):
        make_task("go2_flat", "sim", command_ranges=((1.0, 0.0),) * 3)


def test_friction_range_draws_one_ground_friction_per_episode_and_tells_the_expert():
    task = make_task("go2_slope", "sim", friction_range=(0.2, 1.2))
    b = task.backend
    contacts = b.model.geom_friction[b._contact_geoms, 0]
    frictions = []
    for seed in (3, 3, 4):
        obs = task.reset(seed)
        mu = b.model.geom_friction[b._contact_geoms, 0]
        assert np.all(mu == mu[0]) and 0.2 <= mu[0] <= 1.2  # feet, floor and panels alike
        static, dynamic, restitution = obs.privileged["expert_obs"][394:397]
        assert static == pytest.approx(mu[0], rel=1e-6)
        assert dynamic == pytest.approx(0.75 * mu[0], rel=1e-6) and restitution == pytest.approx(
            0.05
        )
        frictions.append(mu[0])
    assert frictions[0] == frictions[1] != frictions[2]
    b.set_ground_friction(None)  # back to the built scene and the nominal material
    np.testing.assert_array_equal(b.model.geom_friction[b._contact_geoms, 0], [0.8] * len(contacts))
    np.testing.assert_allclose(
        b.observe().privileged["expert_obs"][394:397], [0.8, 0.6, 0.05], atol=1e-6
    )
    with pytest.raises(ValueError, match="friction"):
        b.set_ground_friction(float("nan"))
    with pytest.raises(ValueError, match="friction_range"):
        make_task("go2_slope", "sim", friction_range=(0.0, 1.0))
    # without the range the stand-in keeps its PTFE panels (no randomisation at evaluation)
    real = make_task("slippery_slope", "real")
    real.reset(0)
    panels = real.backend.model.geom_friction[real.backend._terrain_geoms, 0]
    assert SLIPPERY_SLOPE_GAP.panel_friction in panels


def test_expert_keeps_its_footing_on_low_friction_it_is_told_about(ladder):
    """The randomised data holds the expert walking on slippery ground, not just falling."""
    task = make_task("go2_slope", "sim", friction_range=(0.2, 0.2), episode_s=8.0)
    runs = [rollout(task, ladder[0], s).last for s in (0, 1)]
    assert all(r.success for r in runs), [r.info for r in runs]


def test_reward_tracks_velocity():
    task = make_task("go2_flat", "sim", command=(0.5, 0.0, 0.0))
    obs = task.reset(0)
    command = obs.command.astype(float)
    moving = obs.privileged.copy()
    moving["base_lin_vel"] = np.array([0.5, 0.0, 0.0])
    standing = dict(moving, base_lin_vel=np.zeros(3))
    obs.privileged = moving
    r_track = task.reward(obs, command, np.zeros(12))
    obs.privileged = standing
    r_still = task.reward(obs, command, np.zeros(12))
    assert r_track - r_still == pytest.approx(0.02 * 1.5 * (1 - np.exp(-1.0)), rel=1e-6)


def test_expert_files_errors_say_where_to_get_them(monkeypatch, tmp_path):
    monkeypatch.delenv("SIMDIST_GO2_EXPERTS")
    with pytest.raises(FileNotFoundError, match="SIMDIST_GO2_EXPERTS.*CLeARoboticsLab/simdist"):
        experts_dir()
    with pytest.raises(FileNotFoundError, match="policies"):
        experts_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing TorchScript"):
        TorchScriptGo2Policy(tmp_path / "nope.pt")


def test_ladder_and_value_through_the_registry(ladder):
    task = make_task("go2_flat", "sim")
    names = [p.name for p in expert_ladder(task)]
    assert names[0] == "policy_4999" and names[-1] == "policy_0" and len(names) == 12
    assert [p.name for p in ladder] == names
    obs = task.reset(0)
    assert np.isfinite(expert_value(task)(obs))
    obs.privileged = None
    with pytest.raises(ValueError, match="expert_obs"):
        ladder[0].act(obs)


def check_expert_bar(ladder, seeds, seconds):
    task = make_task("go2_flat", "sim", command=(0.5, 0.0, 0.0), episode_s=seconds)
    rmses = []
    for seed in seeds:
        out = rollout(task, ladder[0], seed)
        r, v = out.last, out.mean_velocity
        assert not r.info["fallen"] and r.success and r.truncated, f"seed {seed} fell"
        assert 0.4 < v[0] < 0.6 and abs(v[1]) < 0.1, f"seed {seed}: mean velocity {v}"
        assert abs(r.info["speed"] - 0.5) <= 0.2  # go2_flat's success is the walk criterion
        rmses.append(r.info["vel_rmse"])
    print(
        f"expert 0.5 m/s, {len(seeds)} seeds x {seconds} s: tracking RMSE "
        f"{np.mean(rmses):.3f} m/s (max {np.max(rmses):.3f})"
    )
    assert max(rmses) < 0.2


def test_go2_flat_success_is_walking_at_the_commanded_speed():
    """Standing still for the whole episode survives but does not walk; `speed` is the mean
    forward speed over the last speed_window_s, from the distances of the steps."""
    task = make_task("go2_flat", "sim", episode_s=1.0, speed_window_s=0.5)
    assert task.config.walk_tolerance == 0.2
    task.reset(0)
    distances, result = [0.0], None
    for _ in range(task.max_steps):
        result = task.step(np.zeros(12))  # hold the default pose
        distances.append(result.info["distance"])
    n = 25  # 0.5 s at 50 Hz
    assert result.info["speed"] == pytest.approx((distances[-1] - distances[-1 - n]) / (n * 0.02))
    assert result.truncated and not result.info["fallen"]
    assert abs(result.info["speed"]) < 0.1 and not result.success
    # with no speed criterion, the same episode succeeds by surviving
    task = make_task("go2_flat", "sim", episode_s=1.0, walk_tolerance=None)
    task.reset(0)
    for _ in range(task.max_steps):
        result = task.step(np.zeros(12))
    assert result.success
    with pytest.raises(ValueError, match="walk_tolerance"):
        make_task("go2_flat", "sim", walk_tolerance=0.0)


def test_expert_walks_fast_bar(ladder):
    check_expert_bar(ladder, seeds=(0, 1), seconds=10.0)


@pytest.mark.slow
def test_expert_walks_full_bar(ladder):
    check_expert_bar(ladder, seeds=tuple(range(10)), seconds=20.0)


def test_critic_prefers_expert_states_over_policy_0(ladder):
    task = make_task("go2_flat", "sim")
    critic = load_go2_critic()
    v_expert = rollout(task, ladder[0], 0, max_steps=200, value=critic).values
    zero = rollout(task, ladder[-1], 0, max_steps=200, value=critic)
    v_zero = zero.values
    assert ladder[-1].name == "policy_0" and not zero.last.info["fallen"]
    assert np.mean(v_expert) > np.mean(v_zero) + 0.05


def test_sim_to_real_gap_slippery_slope(ladder):
    """At 0.1 m/s the expert climbs the nominal course but slips and falls on PTFE panels."""
    kw = dict(command=(0.1, 0.0, 0.0), episode_s=25.0)
    sim = make_task("go2_slope", "sim", **kw)
    real = make_task("slippery_slope", "real", **kw)
    sim_runs = [rollout(sim, ladder[0], s).last for s in (0, 1)]
    real_runs = [rollout(real, ladder[0], s).last for s in (0, 1)]
    assert all(r.success for r in sim_runs)
    assert sum(r.success for r in real_runs) < len(real_runs)
    sim_d = np.mean([r.info["distance"] for r in sim_runs])
    real_d = np.mean([r.info["distance"] for r in real_runs])
    print(f"slope 0.1 m/s: sim distance {sim_d:.2f} m, slippery {real_d:.2f} m")
    assert real_d < sim_d - 0.1


def test_sim_to_real_gap_foam(ladder):
    """At 0.7 m/s the expert crosses rigid pads but trips on the sinking foam."""
    kw = dict(command=(0.7, 0.0, 0.0), episode_s=10.0)
    sim = [rollout(make_task("foam", "sim", **kw), ladder[0], s).last for s in (0, 1)]
    real = [rollout(make_task("foam", "real", **kw), ladder[0], s).last for s in (0, 1)]
    assert all(r.success for r in sim)
    assert sum(r.success for r in real) < len(real)
    assert np.mean([r.info["distance"] for r in real]) < 3.0 - 0.2
