"""Safety supervisor: limits, watchdog, NaN rejection, stale stop, e-stop (core and node on DDS)."""

import math
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Parameter as ParameterMsg
from rcl_interfaces.msg import ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.diagnostics import Diagnostics, Level
from robot_drivers.interface import Command, CommandKind
from robot_drivers.safety import (
    GO2_DEFAULT_POSE,
    GO2_JOINT_HIGH,
    GO2_TARGET_HIGH,
    GO2_TARGET_MARGIN,
    SafetyConfig,
    SafetySupervisor,
)
from robot_drivers.safety_node import SafetyNode
from robot_ros_helpers import RosHarness, diagnostics_text


def ur5e(**kw):
    sup = SafetySupervisor(SafetyConfig(robot="ur5e", **kw))
    sup.observation(0.0)
    sup.tcp_pose([0.0, 0.5, 0.3])
    return sup


def go2(**kw):
    sup = SafetySupervisor(SafetyConfig(robot="go2", **kw))
    sup.observation(0.0)
    return sup


def ee(*values, stamp):
    """An EE command answering the observation at `stamp` (the tests send it at that time)."""
    return Command(CommandKind.EE_DELTA, np.array(values, np.float32), stamp=stamp)


def test_ee_step_caps_and_workspace_box():
    sup = ur5e(max_step_pos=0.03, max_step_rot=0.25, workspace_high=(0.55, 0.9, 0.31))
    d = sup.filter(ee(0.1, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, stamp=0.1), now=0.1)
    assert d.status == "clipped" and {"max_step_pos", "max_step_rot"} <= set(d.clipped)
    assert np.linalg.norm(d.command.values[:3]) == pytest.approx(0.03, rel=1e-5)
    assert np.linalg.norm(d.command.values[3:6]) == pytest.approx(0.25, rel=1e-5)
    up = sup.filter(ee(0.0, 0.0, 0.02, 0, 0, 0, 0.0, stamp=0.12), now=0.12)  # z: 0.32 > box top
    assert "workspace" in up.clipped and up.command.values[2] == pytest.approx(0.01, abs=1e-6)
    ok = sup.filter(ee(0.001, 0, 0, 0, 0, 0, 0, stamp=0.14), now=0.14)
    assert ok.status == "pass" and ok.command.kind == CommandKind.EE_DELTA


def test_bad_commands_become_hold_with_reason():
    sup = ur5e()
    nan = sup.filter(ee(math.nan, 0, 0, 0, 0, 0, 0, stamp=0.1), now=0.1)
    assert nan.status == "rejected" and nan.command.kind == CommandKind.HOLD and "NaN" in nan.reason
    inf = sup.filter(ee(0, math.inf, 0, 0, 0, 0, 0, stamp=0.12), now=0.12)
    assert inf.command.kind == CommandKind.HOLD
    short = sup.filter(Command(CommandKind.EE_DELTA, np.zeros(3, np.float32), stamp=0.14), now=0.14)
    assert short.status == "rejected" and "expected (7,)" in short.reason
    wrong = sup.filter(
        Command(CommandKind.JOINT_POSITION, np.zeros(7, np.float32), stamp=0.16), now=0.16
    )
    assert wrong.status == "rejected" and "ee_delta" in wrong.reason
    no_tcp = SafetySupervisor(SafetyConfig(robot="ur5e"))
    no_tcp.observation(0.0)
    assert (
        no_tcp.filter(ee(0, 0, 0, 0, 0, 0, 0, stamp=0.1), now=0.1).command.kind == CommandKind.HOLD
    )


def test_go2_joint_limits_and_target_step():
    sup = go2(max_target_step=0.2)
    a = np.zeros(12, np.float32)
    a[0] = 100.0  # FR hip far beyond +1.0472 rad
    d = sup.filter(Command(CommandKind.JOINT_POSITION, a, stamp=0.01), now=0.01)
    target = np.asarray(GO2_DEFAULT_POSE) + 0.25 * d.command.values
    assert "joint_limits" in d.clipped and target[0] == pytest.approx(GO2_TARGET_HIGH[0], abs=1e-5)
    back = sup.filter(
        Command(CommandKind.JOINT_POSITION, np.zeros(12, np.float32), stamp=0.02), now=0.02
    )
    target2 = np.asarray(GO2_DEFAULT_POSE) + 0.25 * back.command.values
    assert "max_target_step" in back.clipped
    assert target2[0] == pytest.approx(GO2_TARGET_HIGH[0] - 0.2, abs=1e-5)


def test_go2_defaults_pass_a_walking_gait_and_stop_garbage():
    """The default target limits are the joint range widened by GO2_TARGET_MARGIN: the official
    model's gait (calf targets up to 0.16 rad past the stop, steps up to 0.67 rad per tick)
    passes unchanged, a target 0.5 rad past the stop or a 1.2 rad jump does not."""
    sup = go2()
    calf_stop = GO2_JOINT_HIGH[2]
    to_action = lambda target: (target - GO2_DEFAULT_POSE[2]) / 0.25  # noqa: E731
    a = np.zeros(12, np.float32)
    a[2] = to_action(calf_stop + 0.16)
    assert sup.filter(Command(CommandKind.JOINT_POSITION, a, stamp=0.01), now=0.01).status == "pass"
    a[2] = to_action(calf_stop + 0.16 - 0.67)
    assert sup.filter(Command(CommandKind.JOINT_POSITION, a, stamp=0.02), now=0.02).status == "pass"
    a[2] = to_action(calf_stop + 0.5)  # 0.2 rad past the widened limit
    d = sup.filter(Command(CommandKind.JOINT_POSITION, a, stamp=0.03), now=0.03)
    target = GO2_DEFAULT_POSE[2] + 0.25 * d.command.values[2]
    assert d.clipped == ["joint_limits"] and target == pytest.approx(calf_stop + 0.3, abs=1e-5)
    assert GO2_TARGET_HIGH[2] == pytest.approx(calf_stop + GO2_TARGET_MARGIN)
    a[2] = to_action(calf_stop - 0.9)  # a 1.2 rad jump inside the joint range
    d = sup.filter(Command(CommandKind.JOINT_POSITION, a, stamp=0.04), now=0.04)
    target = GO2_DEFAULT_POSE[2] + 0.25 * d.command.values[2]
    assert d.clipped == ["max_target_step"] and target == pytest.approx(calf_stop - 0.7, abs=1e-5)


def test_watchdog_hold_then_damp_and_stale_observation():
    arm = ur5e(command_timeout_s=0.5)
    assert arm.watchdog(1.0) is None  # never commanded: nothing to time out
    arm.filter(ee(0, 0, 0, 0, 0, 0, 0, stamp=0.1), now=0.1)
    assert arm.watchdog(0.5) is None
    assert arm.watchdog(0.7).command.kind == CommandKind.HOLD
    assert arm.watchdog(5.0).command.kind == CommandKind.HOLD  # the arm never damps

    dog = go2(command_timeout_s=0.1, damp_grace_s=0.2, observation_timeout_s=10.0)
    dog.filter(Command(CommandKind.JOINT_POSITION, np.zeros(12, np.float32), stamp=0.0), now=0.0)
    assert dog.watchdog(0.15).command.kind == CommandKind.HOLD
    assert dog.watchdog(0.30).command.kind == CommandKind.HOLD
    assert dog.watchdog(0.40).command.kind == CommandKind.DAMP

    stale = go2(observation_timeout_s=0.1)
    d = stale.filter(
        Command(CommandKind.JOINT_POSITION, np.zeros(12, np.float32), stamp=0.5), now=0.5
    )
    assert (
        d.status == "stale_observation"
        and d.command.kind == CommandKind.HOLD
        and "0.500 s old" in d.reason
    )


def test_estop_latches_until_resume_with_fresh_observation():
    sup = go2(observation_timeout_s=0.1)
    sup.estop()
    d = sup.filter(
        Command(CommandKind.JOINT_POSITION, np.zeros(12, np.float32), stamp=0.05), now=0.05
    )
    assert d.status == "estop" and d.command.kind == CommandKind.DAMP
    assert "resume refused" in sup.resume(now=1.0)  # observation 1 s old
    sup.observation(0.95)
    assert sup.resume(now=1.0) is None and not sup.estopped
    zero = np.zeros(12, np.float32)
    assert sup.filter(Command(CommandKind.JOINT_POSITION, zero, stamp=0.95), now=1.0).status == (
        "pass"
    )


@pytest.mark.parametrize("robot", ["ur5e", "go2"])
def test_a_command_answering_an_old_or_future_observation_is_not_forwarded(robot):
    """The command's stamp is the observation it answers: a late plan, or one from another
    episode after a clock reset, gets the safe action with the reason; HOLD / DAMP pass."""
    sup = SafetySupervisor(SafetyConfig(robot=robot, max_command_age_s=0.06))
    sup.observation(9.99)
    sup.tcp_pose((0.0, 0.5, 0.3))
    values = np.zeros(sup.config.action_dim, np.float32)
    kind = sup.config.action_kind
    fresh = sup.filter(Command(kind, values, stamp=9.96), now=10.0)
    assert fresh.status == "pass" and fresh.command.kind == kind
    late = sup.filter(Command(kind, values, stamp=9.9), now=10.0)
    assert late.status == "stale_command" and late.command.kind == CommandKind.HOLD
    assert "0.100 s old" in late.reason and "max_command_age_s=0.06" in late.reason
    ahead = sup.filter(Command(kind, values, stamp=12.0), now=10.0)
    assert ahead.status == "stale_command" and "ahead of the node clock" in ahead.reason
    old_hold = sup.filter(Command(CommandKind.HOLD, stamp=1.0), now=10.0)
    assert old_hold.status == "pass" and old_hold.command.kind == CommandKind.HOLD


def test_a_re_sent_answer_gets_the_first_decision_and_the_limiter_steps_once():
    """Lockstep: the planner answers a re-sent tick again. Filtering the clipped copy a second
    time would move the limiter's reference past the target the driver applied."""
    sup = go2(max_target_step=0.3, observation_timeout_s=10.0)
    zero = np.zeros(12, np.float32)
    start = sup.filter(Command(CommandKind.JOINT_POSITION, zero, stamp=0.02), now=0.02)
    assert start.status == "pass"
    sup.applied(start.command)
    jump = zero.copy()
    jump[2] = 3.6  # calf target +0.9 rad, inside the limits: clipped to +0.3 per tick
    first = sup.filter(Command(CommandKind.JOINT_POSITION, jump, stamp=0.04), now=0.04)
    again = sup.filter(Command(CommandKind.JOINT_POSITION, jump, stamp=0.04), now=0.05)
    assert first.clipped == ["max_target_step"] and again.status == "duplicate"
    np.testing.assert_array_equal(again.command.values, first.command.values)
    assert "first decision (clipped)" in again.reason
    sup.applied(first.command)
    applied = GO2_DEFAULT_POSE[2] + 0.25 * first.command.values[2]
    nxt = sup.filter(Command(CommandKind.JOINT_POSITION, jump, stamp=0.06), now=0.06)
    step = GO2_DEFAULT_POSE[2] + 0.25 * nxt.command.values[2] - applied
    assert step == pytest.approx(0.3, abs=1e-5)  # from the applied target: 0.6 if filtered twice


def _calf(decision) -> float:
    return GO2_DEFAULT_POSE[2] + 0.25 * float(decision.command.values[2])


def test_the_step_limit_holds_whichever_forwarded_command_the_driver_applies():
    """The limiter's reference is what the driver reports applied. A target forwarded but not
    yet reported is a reference too: the driver may apply it, or drop it and apply the next."""
    sup = go2(max_target_step=0.3, observation_timeout_s=10.0)
    up, down = np.zeros(12, np.float32), np.zeros(12, np.float32)
    up[2], down[2] = 3.6, -3.6  # calf +0.9 / -0.9 rad from the default pose
    start = sup.filter(
        Command(CommandKind.JOINT_POSITION, np.zeros(12, np.float32), stamp=0.02), 0.02
    )
    sup.applied(start.command)
    base = _calf(start)
    a = sup.filter(Command(CommandKind.JOINT_POSITION, up, stamp=0.04), now=0.04)
    assert _calf(a) == pytest.approx(base + 0.3, abs=1e-5)
    # No report for a yet: b must be a safe step from the applied target AND from a.
    b = sup.filter(Command(CommandKind.JOINT_POSITION, up, stamp=0.06), now=0.06)
    assert _calf(b) == pytest.approx(base + 0.3, abs=1e-5)  # not base + 0.6
    c = sup.filter(Command(CommandKind.JOINT_POSITION, down, stamp=0.08), now=0.08)
    assert _calf(c) == pytest.approx(base, abs=1e-5)  # within 0.3 of a and b and the applied
    sup.applied(b.command)  # the driver dropped a and applied b: a and b are no references now
    d = sup.filter(Command(CommandKind.JOINT_POSITION, down, stamp=0.10), now=0.10)
    assert _calf(d) == pytest.approx(base, abs=1e-5)  # c (pending) is base: d within 0.3 of it
    sup.applied(d.command)
    e = sup.filter(Command(CommandKind.JOINT_POSITION, down, stamp=0.12), now=0.12)
    assert _calf(e) == pytest.approx(base - 0.3, abs=1e-5)
    # HOLD applied: the robot stands at the default pose, the next step is measured from there;
    # DAMP applied: no target, the step is measured from the joint positions measured in the
    # observation the command answers. A report older than the newest changes nothing.
    sup.applied(Command(CommandKind.HOLD, stamp=0.14))
    sup.applied(Command(CommandKind.JOINT_POSITION, down, stamp=0.13))
    held = sup.filter(Command(CommandKind.JOINT_POSITION, up, stamp=0.15), now=0.15)
    assert _calf(held) == pytest.approx(base + 0.3, abs=1e-5)
    sup.applied(Command(CommandKind.DAMP, stamp=0.155))
    sagged = np.zeros(12)
    sagged[2] = -0.5  # the limp calf measured 0.5 rad below the default pose
    sup.observation(0.16, joint_pos_rel=sagged)
    f = sup.filter(Command(CommandKind.JOINT_POSITION, up, stamp=0.16), now=0.16)
    assert f.clipped == ["max_target_step"] and _calf(f) == pytest.approx(base - 0.2, abs=1e-5)
    # A robot that applied a target this supervisor never sent: refused, not stepped towards.
    sup.applied(Command(CommandKind.JOINT_POSITION, down, stamp=0.158))  # f still pending
    g = sup.filter(Command(CommandKind.JOINT_POSITION, up, stamp=0.18), now=0.18)
    assert g.status == "rejected" and "another command source" in g.reason


def test_config_validation():
    with pytest.raises(ValueError, match="low < high"):
        SafetyConfig(workspace_low=(0, 0, 1), workspace_high=(1, 1, 0.5))
    with pytest.raises(ValueError, match="12 values"):
        SafetyConfig(robot="go2", joint_low=(0.0,) * 11)
    with pytest.raises(ValueError, match="robot"):
        SafetyConfig(robot="spot")
    with pytest.raises(ValueError, match="max_command_age_s"):
        SafetyConfig(max_command_age_s=0.0)


# --- the node, on real DDS -------------------------------------------------------------------
def _param(name, value):
    return ParameterMsg(
        name=name, value=ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
    )


def test_safety_node_forwards_rejects_estops_and_times_out(ros_domain):
    ros = RosHarness(ros_domain)
    try:
        node = ros.add(
            SafetyNode(
                context=ros.context,
                parameter_overrides=[
                    Parameter("robot", value="go2"),
                    Parameter("command_timeout_s", value=0.3),
                    Parameter("damp_grace_s", value=0.3),
                    Parameter("observation_timeout_s", value=5.0),
                    Parameter("answer_timeout_s", value=0.5),
                ],
            )
        )
        out = ros.collect(JointTrajectory, "/simdist/safe_command")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        act = ros.probe.create_publisher(JointTrajectory, "/simdist/action", 10)
        obs = ros.probe.create_publisher(JointState, "/simdist/observation/proprio", 10)
        names = ros_msgs.action_names("go2")

        def now_ns():
            return ros.probe.get_clock().now().nanoseconds

        assert ros.spin_until(lambda: act.get_subscription_count() and obs.get_subscription_count())
        assert not ros.spin_until(lambda: bool(out), 0.1)  # nothing before a plan

        stamp = now_ns()
        o = JointState(name=["x[0]"], position=[0.0])
        o.header.stamp = ros_msgs.stamp_msg(stamp)
        obs.publish(o)
        ros.spin_for(0.1)
        good = Command(CommandKind.JOINT_POSITION, np.full(12, 0.1, np.float32))
        act.publish(ros_msgs.command_to_msg(good, names, stamp, 0.02))
        assert ros.spin_until(lambda: len(out) >= 1)
        assert ros_msgs.stamp_ns(out[0].header.stamp) == stamp  # same tick id: lockstep advances
        assert ros_msgs.command_from_msg(out[0]).kind == CommandKind.JOINT_POSITION
        np.testing.assert_allclose(out[0].points[0].positions, 0.1, atol=1e-6)

        bad = ros_msgs.command_to_msg(good, names, stamp + 1, 0.02)
        bad.points[0].positions[3] = math.nan
        act.publish(bad)
        assert ros.spin_until(lambda: len(out) >= 2)
        assert out[1].header.frame_id == "hold"
        assert ros.spin_until(
            lambda: any(
                lvl == 2 and "NaN" in m for lvl, m in diagnostics_text(diags, "safety_supervisor")
            )
        )

        # watchdog: no more plans -> HOLD after 0.3 s, DAMP after a further 0.3 s
        assert ros.spin_until(lambda: any(m.header.frame_id == "damp" for m in out), 3.0)
        kinds = [m.header.frame_id for m in out[2:]]
        assert kinds[0] == "hold" and "damp" in kinds

        # parameters through the SetParameters service, as rqt does
        client = ros.probe.create_client(SetParameters, "/safety_supervisor/set_parameters")
        res = ros.call(
            client, SetParameters.Request(parameters=[_param("command_timeout_s", 99.0)])
        )
        assert not res.results[0].successful and "range" in res.results[0].reason.lower()
        bad_limits = ParameterMsg(
            name="joint_low",
            value=ParameterValue(
                type=ParameterType.PARAMETER_DOUBLE_ARRAY, double_array_value=[5.0] * 12
            ),
        )
        res = ros.call(client, SetParameters.Request(parameters=[bad_limits]))  # above joint_high
        assert not res.results[0].successful and "below joint_high" in res.results[0].reason
        res = ros.call(client, SetParameters.Request(parameters=[_param("command_timeout_s", 1.0)]))
        assert res.results[0].successful
        ros.spin_until(lambda: False, 0.1)
        assert node.core.config.command_timeout_s == 1.0  # applied at the next tick

        estop = ros.probe.create_client(Trigger, "/safety_supervisor/estop")
        resume = ros.probe.create_client(Trigger, "/safety_supervisor/resume")
        assert ros.call(estop, Trigger.Request()).success
        n = len(out)
        act.publish(ros_msgs.command_to_msg(good, names, stamp + 2, 0.02))
        assert ros.spin_until(
            lambda: any(ros_msgs.stamp_ns(m.header.stamp) == stamp + 2 for m in out[n:])
        )
        latched = [m for m in out[n:] if ros_msgs.stamp_ns(m.header.stamp) == stamp + 2][0]
        assert latched.header.frame_id == "damp"
        r = ros.call(resume, Trigger.Request())
        assert r.success, r.message

        # the planner never answers an observation (NaN model, hang): its tick still gets HOLD
        silent = stamp + 10
        o.header.stamp = ros_msgs.stamp_msg(silent)
        obs.publish(o)
        assert ros.spin_until(
            lambda: any(ros_msgs.stamp_ns(m.header.stamp) == silent for m in out), 3.0
        )
        assert [m for m in out if ros_msgs.stamp_ns(m.header.stamp) == silent][
            0
        ].header.frame_id == "hold"
        assert ros.spin_until(
            lambda: any(
                "no plan for the observation" in m
                for _, m in diagnostics_text(diags, "safety_supervisor")
            )
        )
    finally:
        ros.close()


def test_diagnostics_levels_immediate_publish_and_stale(ros_domain):

    ros = RosHarness(ros_domain)
    try:
        node = ros.add(Node("diag_user", context=ros.context))
        diag = Diagnostics(node, hardware_id="hw", period_s=0.2)
        got = ros.collect(DiagnosticArray, "/diagnostics")
        assert ros.spin_until(lambda: ros.probe.count_publishers("/diagnostics") >= 1)
        ros.spin_for(0.3)
        diag.set("link", Level.ERROR, "cable out", retries=3)  # a level change goes out at once
        diag.set("beat", Level.OK, "alive", stale_after_s=0.3)
        assert ros.spin_until(
            lambda: any(
                lvl == 2 and "cable out" in m for lvl, m in diagnostics_text(got, "diag_user")
            )
        )
        status = [s for a in got for s in a.status if s.name == "diag_user: link"][-1]
        assert status.hardware_id == "hw" and [(kv.key, kv.value) for kv in status.values] == [
            ("retries", "3")
        ]
        time.sleep(0.4)  # "beat" is not refreshed: STALE; "link" (no stale_after_s) stays ERROR
        n = len(got)
        assert ros.spin_until(lambda: len(got) > n + 1)
        last = {s.name: s.level[0] for s in got[-1].status}
        assert last == {"diag_user: link": 2, "diag_user: beat": 3}
    finally:
        ros.close()


def test_the_answer_deadline_opens_on_a_new_observation_and_closes_on_its_answer():
    from robot_drivers.safety import AnswerDeadline  # noqa: PLC0415

    d = AnswerDeadline()
    assert d.due(100.0, 0.5) is None  # nothing observed
    d.observed(10, now=1.0)
    d.observed(20, now=1.1)  # the newest observation is the one waited for, since it arrived
    assert d.due(1.5, 0.5) is None and d.due(1.6, 0.0) is None  # not yet; 0 turns it off
    assert d.due(1.6, 0.5) == 20 and d.due(5.0, 0.5) is None  # once: the safe action answers it
    d.observed(15, now=2.0)  # older than what counts as answered: no deadline
    assert d.due(9.0, 0.5) is None
    d.observed(30, now=3.0)
    d.answered(30)  # answered in time
    assert d.due(9.0, 0.5) is None
    d.observed(40, now=4.0)
    d.answered(35)  # an answer to an older tick leaves the newer one open
    assert d.due(4.6, 0.5) == 40
    d.observed(50, now=5.0)
    d.answered(90)  # ahead of every observation (another episode): counts for nothing
    assert d.due(5.6, 0.5) == 50
    d.observed(60, now=6.0)
    d.observed(70, now=6.2)
    d.answered(70)  # answering the newest closes the older one with it
    assert d.due(9.0, 0.5) is None
