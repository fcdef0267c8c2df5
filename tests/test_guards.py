"""Each guard of the chain, with a check of its safe outcome that is shown to fail without it.

`GUARDS` names, per guard, its check (a function that asserts what the guard guarantees) and the
patches that disable it. `test_guard[<guard>]` runs the check; `test_the_check_fails_with_its_
guard_disabled[<guard>]` applies the patches (in this process) and asserts that the same check
then fails: a check that cannot fail would not be a test of its guard. Ingestion's NaN drop has
two layers (its message read and its core), each of which alone drops the fault: both are
disabled.
The five supervisor guards that the fault oracle covers are shown the same way in
`test_faults.py::test_the_oracle_fails_when_a_supervisor_guard_is_patched_out`.
"""

from __future__ import annotations

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image, JointState
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.ingestion import Ingestion
from robot_drivers.ingestion_node import IngestionNode
from robot_drivers.interface import Command, CommandKind
from robot_drivers.mujoco_driver_node import MujocoDriverNode
from robot_drivers.safety import SafetyConfig, SafetySupervisor
from robot_drivers.safety_node import SafetyNode
from robot_drivers.specs import robot_spec
from robot_ros_helpers import RosHarness, diagnostics_text

ZERO = np.zeros(12, np.float32)


def _go2(**kw) -> SafetySupervisor:
    sup = SafetySupervisor(SafetyConfig(robot="go2", **kw))
    sup.observation(0.0)
    return sup


def _move(stamp: float, values=ZERO) -> Command:
    return Command(CommandKind.JOINT_POSITION, np.asarray(values, np.float32), stamp=stamp)


def _kind(decision) -> CommandKind | None:
    return None if decision is None else decision.command.kind


# --- the supervisor's core ------------------------------------------------------------------------
def check_watchdog(domain: int) -> None:
    """No plan for command_timeout_s: HOLD; none before the first plan or within the timeout."""
    dog = _go2(command_timeout_s=0.1, damp_grace_s=0.2, observation_timeout_s=10.0)
    assert dog.watchdog(1.0) is None  # never commanded: nothing to time out
    dog.filter(_move(0.0), now=0.0)
    assert dog.watchdog(0.05) is None
    assert _kind(dog.watchdog(0.15)) == CommandKind.HOLD


def check_damp(domain: int) -> None:
    """The Go2 holds damp_grace_s after the timeout, then DAMPs; the arm never damps."""
    dog = _go2(command_timeout_s=0.1, damp_grace_s=0.2, observation_timeout_s=10.0)
    dog.filter(_move(0.0), now=0.0)
    kinds = [_kind(dog.watchdog(t)) for t in (0.15, 0.30, 0.40)]
    assert kinds == [CommandKind.HOLD, CommandKind.HOLD, CommandKind.DAMP], kinds
    arm = SafetySupervisor(SafetyConfig(robot="ur5e", command_timeout_s=0.1))
    arm.observation(0.0)
    arm.tcp_pose([0.0, 0.5, 0.3])
    arm.filter(Command(CommandKind.EE_DELTA, np.zeros(7, np.float32), stamp=0.0), now=0.0)
    assert _kind(arm.watchdog(5.0)) == CommandKind.HOLD


def check_estop(domain: int) -> None:
    """~/estop latches DAMP for every command and on the watchdog until ~/resume, which is
    refused while observations are stale."""
    sup = _go2(observation_timeout_s=0.1)
    sup.estop()
    d = sup.filter(_move(0.05), now=0.05)
    assert d.status == "estop" and d.command.kind == CommandKind.DAMP, d
    assert _kind(sup.watchdog(0.06)) == CommandKind.DAMP
    assert "resume refused" in (sup.resume(now=1.0) or "")  # observation 1 s old
    sup.observation(0.95)
    assert sup.resume(now=1.0) is None
    assert sup.filter(_move(0.95), now=1.0).status == "pass"


def check_stale_observation(domain: int) -> None:
    """The newest observation older than observation_timeout_s: HOLD, with its age."""
    sup = _go2(observation_timeout_s=0.1)
    d = sup.filter(_move(0.5), now=0.5)
    assert d.status == "stale_observation" and d.command.kind == CommandKind.HOLD, d
    assert "0.500 s old" in d.reason


def check_another_source(domain: int) -> None:
    """The driver reports a target this supervisor never sent (another command source): the
    next command is refused (HOLD), not stepped towards."""
    sup = _go2(max_target_step=0.3, observation_timeout_s=10.0)
    sent = sup.filter(_move(0.02), now=0.02)
    sup.applied(sent.command)
    assert sup.filter(_move(0.06), now=0.06).status == "pass"  # forwarded, not reported yet
    foreign = ZERO.copy()
    foreign[2] = -3.6  # calf 0.9 rad from anything sent
    sup.applied(_move(0.04, foreign))
    d = sup.filter(_move(0.08), now=0.08)
    assert d.status == "rejected" and d.command.kind == CommandKind.HOLD, d
    assert "another command source" in d.reason


# --- nodes on DDS -----------------------------------------------------------------------------
def check_answer_timeout(domain: int) -> None:
    """An observation the planner never answers gets HOLD stamped with it within
    answer_timeout_s (wall), so a lockstep simulator does not stall."""
    ros = RosHarness(domain)
    try:
        ros.add(SafetyNode(context=ros.context, parameter_overrides=[
            Parameter("robot", value="go2"), Parameter("answer_timeout_s", value=0.3),
            Parameter("observation_timeout_s", value=5.0)]))  # fmt: skip
        out = ros.collect(JointTrajectory, "/simdist/safe_command")
        obs = ros.probe.create_publisher(JointState, "/simdist/observation/proprio", 10)
        assert ros.spin_until(lambda: obs.get_subscription_count() > 0, 10.0)
        stamp = ros.probe.get_clock().now().nanoseconds
        msg = JointState(name=["x[0]"], position=[0.0])
        msg.header.stamp = ros_msgs.stamp_msg(stamp)
        obs.publish(msg)
        assert ros.spin_until(
            lambda: any(ros_msgs.stamp_ns(m.header.stamp) == stamp for m in out), 5.0
        ), "the unanswered observation got no safe command"
        (answer,) = [m for m in out if ros_msgs.stamp_ns(m.header.stamp) == stamp]
        assert answer.header.frame_id == "hold"
    finally:
        ros.close()


def _nan_command(stamp: int) -> JointTrajectory:
    msg = ros_msgs.command_to_msg(_move(0.0), ros_msgs.action_names("go2"), stamp, 0.02)
    msg.points[0].positions = [float("nan")] * 12
    return msg


def check_driver_nan(domain: int) -> None:
    """A NaN command on /simdist/safe_command answering the waiting tick: the lockstep driver
    never hands it to its backend (the simulated robot), applies HOLD for that tick instead and
    says so at ERROR. (The backend's own `validate_command` would refuse it too, after the
    driver: that is not what is checked here.)"""
    ros = RosHarness(domain)
    try:
        driver = ros.add(MujocoDriverNode(context=ros.context, parameter_overrides=[
            Parameter(k, value=v) for k, v in
            {"robot": "go2", "task": "go2_flat", "seed": 0, "lockstep_republish_s": 0.2}.items()
        ]))  # fmt: skip
        applied = ros.collect(JointTrajectory, ros_msgs.APPLIED_COMMAND_TOPIC)
        proprio = ros.collect(JointState, "/simdist/robot/proprio")
        diags = ros.collect(DiagnosticArray, "/diagnostics", 100)
        pub = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        assert ros.spin_until(lambda: proprio and pub.get_subscription_count() > 0, 30.0)
        backend = driver.episode.task.backend
        handed: list[Command] = []  # every command the driver hands to the robot
        act = backend.act
        backend.act = lambda command: (handed.append(command), act(command))[1]
        stamp = ros_msgs.stamp_ns(proprio[-1].header.stamp)
        pub.publish(_nan_command(stamp))
        assert ros.spin_until(lambda: driver.tick >= 1, 10.0), "the tick was not applied"
        ros.spin_for(0.2)
        assert handed and all(
            np.all(np.isfinite(c.values)) for c in handed if c.values is not None
        ), [c.values for c in handed]
        kinds = {ros_msgs.stamp_ns(m.header.stamp): m.header.frame_id for m in applied}
        assert kinds.get(stamp) == "hold", kinds
        assert any(
            level == 2 and "NaN" in m for level, m in diagnostics_text(diags, "mujoco_driver")
        )
    finally:
        ros.close()


def check_ingestion_nan(domain: int) -> None:
    """NaN in a proprio or height-map sample: ingestion drops it at ERROR and publishes no
    observation with NaN; a good tick before it is published."""
    ros = RosHarness(domain)
    try:
        params = {"cameras": [""], "height_map_rows": 21, "height_map_cols": 15,
                  "proprio_dim": 35}  # fmt: skip
        ros.add(IngestionNode(
            context=ros.context,
            parameter_overrides=[Parameter(k, value=v) for k, v in params.items()],
        ))  # fmt: skip
        observed = ros.collect(JointState, "/simdist/observation/proprio")
        heights = ros.collect(Image, "/simdist/observation/height_map")
        diags = ros.collect(DiagnosticArray, "/diagnostics", 100)
        pub_p = ros.probe.create_publisher(JointState, "/simdist/robot/proprio", 10)
        pub_h = ros.probe.create_publisher(Image, "/height_map", 10)
        assert ros.spin_until(
            lambda: pub_p.get_subscription_count() and pub_h.get_subscription_count(), 10.0
        )
        names = ros_msgs.proprio_names(robot_spec("go2"))

        def tick(proprio_value: float, height_value: float) -> int:
            stamp = ros.probe.get_clock().now().nanoseconds
            hm = ros_msgs.height_map_to_msg(np.zeros((21, 15), np.float32), stamp)
            hm.data = np.full(21 * 15, height_value, np.float32).tobytes()
            pub_h.publish(hm)
            ros.spin_for(0.05)
            values = np.full(len(names), proprio_value)
            pub_p.publish(ros_msgs.pack_proprio(names, values[:35], values[35:], stamp, "go2"))
            ros.spin_for(0.2)
            return stamp

        good = tick(0.0, 0.0)
        assert ros.spin_until(lambda: observed, 5.0), "the good tick was not published"
        tick(float("nan"), 0.0)
        tick(0.0, float("nan"))
        ros.spin_for(0.3)
        assert ros_msgs.stamp_ns(observed[0].header.stamp) == good
        assert all(np.all(np.isfinite(m.position)) for m in observed), "NaN proprio published"
        assert all(
            np.all(np.isfinite(np.frombuffer(bytes(m.data), np.float32))) for m in heights
        ), "NaN height map published"
        rejected = {
            m.split(":")[1].strip()
            for level, m in diagnostics_text(diags, "ingestion")
            if level == 2 and "sample rejected" in m and "NaN" in m
        }
        assert rejected == {"proprio", "height_map"}, rejected
    finally:
        ros.close()


# --- what disables each guard -----------------------------------------------------------------
def _command_from_msg_without_finite_check(original):
    return lambda msg, spec=None, finite=True: original(msg, spec, finite=False)


def _split_proprio_without_finite_check(msg: JointState):
    values = np.asarray(msg.position, np.float32)
    is_command = np.array([n.startswith("command[") for n in msg.name], bool)
    return values[~is_command], values[is_command] if is_command.any() else None


def _height_map_without_finite_check(msg: Image, expected_shape=None) -> np.ndarray:
    return np.frombuffer(bytes(msg.data), "<f4").reshape(msg.height, msg.width).copy()


# guard -> (check, [(object, attribute, what it becomes)])
GUARDS = {
    "watchdog": (check_watchdog,
                 [(SafetySupervisor, "_plan_timed_out", lambda self, now: False)]),
    "damp": (check_damp, [(SafetySupervisor, "_damp_due", lambda self, now: False)]),
    "estop": (check_estop, [(SafetySupervisor, "estop", lambda self: None)]),
    "stale_observation": (check_stale_observation,
                          [(SafetySupervisor, "observation_stale", lambda self, now: False)]),
    "another_command_source": (check_another_source, [
        (SafetySupervisor, "_another_source", staticmethod(lambda low, high: False))]),
    "answer_timeout": (check_answer_timeout,
                       [(SafetyNode, "on_answer_deadline", lambda self: None)]),
    "driver_nan": (check_driver_nan, [
        (ros_msgs, "command_from_msg",
         _command_from_msg_without_finite_check(ros_msgs.command_from_msg))]),
    "ingestion_nan": (check_ingestion_nan, [
        (ros_msgs, "split_proprio_msg", _split_proprio_without_finite_check),
        (ros_msgs, "height_map_from_msg", _height_map_without_finite_check),
        (Ingestion, "_check_finite", staticmethod(lambda error, *arrays: None))]),
}  # fmt: skip


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_guard(guard, ros_domain):
    GUARDS[guard][0](ros_domain)


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_the_check_fails_with_its_guard_disabled(guard, ros_domain, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # MuJoCo logs a NaN control to MUJOCO_LOG.TXT in the cwd
    check, patches = GUARDS[guard]
    for obj, name, replacement in patches:
        monkeypatch.setattr(obj, name, replacement)
    with pytest.raises(AssertionError):
        check(ros_domain)
