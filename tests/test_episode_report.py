"""simdist-episode-report on an episode bag written from the real message builders and the real
safety supervisor core."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rclpy.serialization import serialize_message

from robot_drivers import ros_msgs
from robot_drivers.interface import Command, CommandKind
from robot_drivers.safety import SafetyConfig, SafetySupervisor
from simdist_adapter.bags import BagError, EpisodeBagWriter, EpisodeMeta
from simdist_adapter.episode_report import episode_report, main

NAMES = ros_msgs.action_names("go2")
PERIOD = 0.02


def write_episode(path, actions, observe_until=None):
    """A go2_flat episode: the planner's `actions`, the supervisor's answers, the driver's ticks.
    Observations stop after `observe_until` steps (the supervisor then answers with HOLD)."""
    supervisor = SafetySupervisor(SafetyConfig(robot="go2", observation_timeout_s=0.05))
    with EpisodeBagWriter(path, EpisodeMeta(task="go2_flat", seed=3, robot="go2")) as bag:
        bag.add_topic("/simdist/episode", "std_msgs/msg/String")
        bag.add_topic("/simdist/action", "trajectory_msgs/msg/JointTrajectory")
        bag.add_topic("/simdist/safe_command", "trajectory_msgs/msg/JointTrajectory")
        for k, action in enumerate(actions):
            stamp = int((k + 1) * PERIOD * 1e9)
            if observe_until is None or k < observe_until:
                supervisor.observation(stamp * 1e-9)
            plan = Command(CommandKind.JOINT_POSITION, np.asarray(action, np.float32), stamp * 1e-9)
            decision = supervisor.filter(plan, now=stamp * 1e-9)
            for topic, msg in (
                ("/simdist/action", ros_msgs.command_to_msg(plan, NAMES, stamp, PERIOD)),
                (
                    "/simdist/safe_command",
                    ros_msgs.command_to_msg(decision.command, NAMES, stamp, PERIOD),
                ),
            ):
                bag.write_raw(topic, stamp, serialize_message(msg))
            info = {"distance": 0.01 * k, "speed": 0.5, "fallen": False}
            tick = ros_msgs.episode_msg(
                episode=0, seed=3, step=k + 1, success=k == len(actions) - 1, info=info
            )
            bag.write_raw("/simdist/episode", stamp, serialize_message(tick))


def test_the_report_counts_what_the_supervisor_changed(tmp_path):
    actions = np.zeros((6, 12))
    actions[2, 0] = 100.0  # FR hip far beyond its joint limit: clipped
    actions[4, 4] = 6.0  # FL thigh jumps 1.5 rad in one step (limit 1.0): clipped
    write_episode(tmp_path / "ep", actions)
    r = episode_report(tmp_path / "ep")
    assert (r.task, r.seed, r.steps, r.success, r.fallen) == ("go2_flat", 3, 6, True, False)
    assert r.speed == 0.5 and r.distance == pytest.approx(0.05)
    assert (r.commands, r.changed, r.replaced) == (6, 2, 0)
    assert r.changed_elements == {NAMES[0]: 1, NAMES[4]: 1}
    # the hip target moves at most 1.0 rad from the default -0.1: action 1.0 / 0.25 = 4
    assert r.max_change == pytest.approx(100.0 - 4.0, abs=1e-3)


def test_a_walking_gait_within_the_limits_passes_unchanged_and_hold_is_counted(tmp_path, capsys):
    steps = np.arange(20)[:, None]
    gait = 0.8 * np.sin(2 * np.pi * steps * PERIOD / 0.5 + np.arange(12))  # 0.5 s gait period
    write_episode(tmp_path / "walk", gait)
    r = episode_report(tmp_path / "walk")
    assert (r.commands, r.changed, r.replaced, r.max_change) == (20, 0, 0, 0.0)
    write_episode(tmp_path / "stale", gait, observe_until=5)
    stale = episode_report(tmp_path / "stale")
    assert stale.replaced > 0 and stale.changed == 0
    assert main([str(tmp_path / "walk"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] == 0


def test_a_bag_without_the_episode_topic_is_refused(tmp_path, capsys):
    with EpisodeBagWriter(tmp_path / "empty", EpisodeMeta(task="go2_flat")) as bag:
        bag.add_topic("/simdist/action", "trajectory_msgs/msg/JointTrajectory")
    with pytest.raises(BagError, match="no topic"):
        episode_report(tmp_path / "empty")
    assert main([str(tmp_path / "empty")]) == 1
    assert "no topic" in capsys.readouterr().err
