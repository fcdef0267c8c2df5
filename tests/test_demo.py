"""`make demo`'s pieces that run without the graph: its model choice and its progress report
(the whole demo runs as `make demo`)."""

from __future__ import annotations

import json

import pytest
import rclpy
from std_msgs.msg import String

from robot_drivers.specs import robot_spec
from simdist_adapter import demo
from simdist_adapter.episodes import CHOSEN_STAND_IN
from simdist_planner.planning.config import planner_config_for
from simdist_planner.ros import launch_description as desc


@pytest.fixture()
def node():
    rclpy.init()
    n = rclpy.create_node("demo_watcher_test")
    yield n
    n.destroy_node()
    rclpy.shutdown()


def tick(episode, step, done=False, success=False, reward=0.5, distance=0.0, fallen=False):
    return String(
        data=json.dumps(
            {"episode": episode, "seed": episode, "step": step, "truncated": done,
             "success": success, "reward": reward,
             "info": {"distance": distance, "fallen": fallen}}
        )
    )  # fmt: skip


def test_progress_reports_episode_step_elapsed_and_an_upper_estimate_of_what_is_left(node):
    w = demo.Watcher(node, episodes=2, max_steps=100)
    t0 = w.start
    assert w.progress(t0 + 1.0) is None  # not before PROGRESS_PERIOD_S
    assert "unknown until the first step" in w.progress(t0 + demo.PROGRESS_PERIOD_S)
    w._on_episode(tick(0, 1))
    first = w._first_step
    for k in range(2, 51):
        w._on_episode(tick(0, k))
    line = w.progress(first + 2 * demo.PROGRESS_PERIOD_S)
    # 50 steps in 2 periods; 4 episodes planned x 100 steps, 50 done in the running one
    per_step = 2 * demo.PROGRESS_PERIOD_S / 50
    assert "zero_shot episode 1 (4 to go), step 50/100" in line
    assert f"({per_step:.2f} s per step)" in line
    assert demo._minutes(per_step * 350) in line
    w._on_episode(tick(0, 100, done=True, success=True))
    w._on_episode(tick(0, 100, done=True, success=True))  # a re-sent last tick counts once
    assert [o.success for o in w.results["zero_shot"]] == [True] and w.episodes_left() == 3
    assert len(w.tick_rates) == 1 and w.tick_rates[0] > 0  # ticks per wall second, per episode
    w._on_episode(tick(1, 3))
    line = w.progress(first + 3 * demo.PROGRESS_PERIOD_S)
    assert "zero_shot episode 2 (3 to go), step 3/100" in line


def test_the_official_model_plans_with_the_official_preset_at_demo_size():
    section = demo.official_planner_params(demo.OFFICIAL_DEMO_PLANNER)
    official = planner_config_for(robot_spec("go2"), "official")
    assert section["planner_preset"] == "official"
    for field in ("temperature", "warm_start", "value_discount_offset", "clamp_actions"):
        assert section[field] == getattr(official, field)
    for field, value in demo.OFFICIAL_DEMO_PLANNER.items():
        assert section[field] == value


def test_without_an_export_the_demo_falls_back_to_pretraining(tmp_path):
    assert demo.official_checkpoint(tmp_path / "out", tmp_path / "no_export") is None


def test_the_demo_runs_the_chosen_stand_in(tmp_path):
    """The graph the demo starts is the pre-registered rung: its driver gets the panel friction
    and the commanded speed, and the progress estimate uses that rung's episode limit."""
    params = demo.demo_params(tmp_path, tmp_path / "bags", 4, demo.DEMO_PARAMS)
    cmd = demo.graph_command(tmp_path / "ck", tmp_path / "bags", "42", params)
    args = dict(a.split(":=", 1) for a in cmd[3:])
    graph = desc.resolve("go2_slope", args)
    driver = next(n for n in graph.nodes if n.name == "mujoco_driver")
    stand_in = CHOSEN_STAND_IN
    assert driver.overrides["task"] == "slippery_slope"
    assert driver.overrides["speed"] == stand_in.speed
    assert driver.overrides["panel_friction"] == stand_in.friction
    assert {n.name for n in graph.nodes} >= {"recorder", "adapter", "planner"}
    assert demo.episode_steps() == round(2.5 * 1.82 / stand_in.speed / 0.02)


def test_the_demo_prints_the_committed_headline_run_or_says_there_is_none(tmp_path):
    assert "no headline run is committed" in demo.headline_result(tmp_path / "none")
    if (demo.HEADLINE_RUN / "config.json").is_file():
        text = demo.headline_result()
        config = json.loads((demo.HEADLINE_RUN / "config.json").read_text())
        assert config["command"] in text and "replan period" in text
        assert f"--friction {CHOSEN_STAND_IN.friction:g}" in config["command"]
        assert f"--speed {CHOSEN_STAND_IN.speed:g}" in config["command"]


def test_each_finished_episode_keeps_its_distance_return_and_fall(node, tmp_path):
    """The demo's summary and plot show what adaptation changes (distance, return, falls), not
    only success: each phase's episodes keep them, a re-sent tick counting once."""
    w = demo.Watcher(node, episodes=2, max_steps=100)
    for k in range(1, 11):
        w._on_episode(tick(0, k, reward=1.0, distance=0.1 * k))
    w._on_episode(tick(0, 10, reward=1.0, distance=1.0))  # re-sent: its reward counts once
    w._on_episode(tick(0, 11, done=True, reward=-2.0, distance=1.05, fallen=True))
    w._on_episode(tick(0, 11, done=True, reward=-2.0, distance=1.05, fallen=True))
    w.phase = "adapted"
    for k in range(1, 5):
        w._on_episode(tick(1, k, reward=0.25, distance=0.5 * k, done=k == 4, success=k == 4))
    (fell,), (crossed,) = w.results["zero_shot"], w.results["adapted"]
    assert fell == demo.Outcome(False, 1.05, 8.0, True, 11)
    assert crossed == demo.Outcome(True, 2.0, 1.0, False, 4)
    assert demo.summarise(w.results["zero_shot"]) == (
        "0/1, mean distance 1.05 m, mean return 8.0, fell 1/1"
    )
    assert demo.summarise([]) == "n/a"
    png = demo.plot(tmp_path, w)
    assert png.is_file() and png.stat().st_size > 10_000
