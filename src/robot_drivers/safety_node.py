"""Safety supervisor node: the only path from the planner (`/simdist/action`) to a driver.

Every planner command is checked by `safety.SafetySupervisor` and republished on
`/simdist/safe_command` with the SAME stamp (so a lockstep driver advances on it), or replaced by
the safe action (HOLD / DAMP) with the reason on /diagnostics. A watchdog timer sends the safe
action when plans stop; an observation left unanswered for `answer_timeout_s` of wall time gets
the safe action with its stamp (so a failing planner cannot stall a lockstep simulator);
`~/estop` latches it until `~/resume`. The driver reports what it applied on
`/simdist/robot/applied_command`; the Go2 step limiter measures steps from that.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import rclpy
from geometry_msgs.msg import PoseStamped
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.described import Param, settings
from robot_drivers.diagnostics import Diagnostics, Level, SourceNodes
from robot_drivers.node_params import NodeParams, descriptor
from robot_drivers.node_spin import spin_until_shutdown
from robot_drivers.safety import AnswerDeadline, Decision, SafetyConfig, SafetySupervisor
from robot_drivers.specs import ROBOT_SPECS

# Declared first: the others' defaults and which of them exist follow the robot it names.
ROBOT_PARAM = Param(
    "robot",
    "ur5e",
    "robot whose limits apply: ur5e (EE deltas, HOLD) or go2 (joint targets, DAMP)",
    read_only=True,
    choices=tuple(sorted(ROBOT_SPECS)),
)


def tunable_params(robot: str) -> tuple[Param, ...]:
    """The node's parameters after ROBOT_PARAM for `robot`: its own timing, then SafetyConfig's
    described settings (robot_drivers.described) with the robot's defaults; of the limits, those
    of what the robot's actions are (RobotSpec.command_kind: the step caps and workspace box of
    end-effector deltas, the joint-target limits and step of joint targets)."""
    config = SafetyConfig(robot=robot)
    own = (
        Param(
            "watchdog_rate_hz",
            50.0,
            "how often the command-rate watchdog runs (node clock)",
            1.0,
            1000.0,
            read_only=True,
        ),
        Param(
            "answer_timeout_s",
            10.0,
            "the newest observation unanswered this long on the WALL clock -> safe "
            "action stamped with it (a stuck or failing planner cannot stall a lockstep "
            "simulator); 0 = off",
            0.0,
            60.0,
        ),
    )
    kind = config.action_kind.value
    return own + tuple(s for s in settings(config) if s.group in ("", kind))


def node_params(robot: str) -> tuple[Param, ...]:
    """Every parameter the node declares when it supervises `robot`."""
    return (ROBOT_PARAM, *tunable_params(robot))


CONFIG_FIELDS = [f.name for f in dataclasses.fields(SafetyConfig)]


def _config(values: dict) -> SafetyConfig:
    kw: dict[str, Any] = {
        k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items() if k in CONFIG_FIELDS
    }
    return SafetyConfig(**kw)


def _checker(robot: str):
    """Cross-field validation of `robot`'s values: the whole config must still build (box order,
    one joint-target limit per joint, ...)."""

    def check(name, value, values) -> str | None:
        try:
            _config(values | {"robot": robot})
        except ValueError as e:
            return str(e)
        return None

    return check


def _joint_pos_rel(msg: JointState, joints: int) -> list[float] | None:
    """The proprio's measured `joint_pos[i]` values (relative to the default pose), if it has
    them all (the Go2's proprio does)."""
    if len(msg.name) != len(msg.position):
        return None
    index = {name: i for i, name in enumerate(msg.name)}
    keys = [f"joint_pos[{i}]" for i in range(joints)]
    if not all(k in index for k in keys):
        return None
    return [msg.position[index[k]] for k in keys]


class SafetyNode(Node):
    def __init__(self, **kwargs):
        super().__init__("safety_supervisor", **kwargs)
        self.robot: str = self.declare_parameter(
            ROBOT_PARAM.name, ROBOT_PARAM.default, descriptor(ROBOT_PARAM)
        ).value
        if self.robot not in ROBOT_PARAM.choices:
            raise ValueError(
                f"safety_supervisor: parameter robot={self.robot!r} must be one of "
                f"{ROBOT_PARAM.choices}"
            )
        self.params = NodeParams(self, tunable_params(self.robot), _checker(self.robot))
        self.core = SafetySupervisor(_config(self.params.values | {"robot": self.robot}))
        self.names = ros_msgs.action_names(self.robot)
        self.period_s = 0.0
        self.diag = Diagnostics(self, hardware_id=self.robot)
        self.diag.set("command", Level.WARN, "waiting for the first plan on /simdist/action")
        self.diag.set("estop", Level.OK, "released")
        self.counts = {"pass": 0, "clipped": 0, "rejected": 0, "safe": 0, "duplicate": 0}
        self.pub = self.create_publisher(
            JointTrajectory, "/simdist/safe_command", ros_msgs.RECORDED_DEPTH
        )
        self.create_subscription(JointTrajectory, "/simdist/action", self.on_action, 10)
        self.create_subscription(
            JointState, "/simdist/observation/proprio", self.on_observation, 10
        )
        self.create_subscription(PoseStamped, "/tcp_pose", self.on_tcp_pose, 10)
        self.create_subscription(
            JointTrajectory, ros_msgs.APPLIED_COMMAND_TOPIC, self.on_applied, 10
        )
        self.sources = SourceNodes(self, {"action": "/simdist/action"})
        self.create_service(Trigger, "~/estop", self.on_estop)
        self.create_service(Trigger, "~/resume", self.on_resume)
        self.create_timer(1.0 / self.params["watchdog_rate_hz"], self.on_watchdog)
        self.deadline = AnswerDeadline()  # the observation the planner leaves unanswered
        self.create_timer(
            0.05, self.on_answer_deadline, clock=Clock(clock_type=ClockType.STEADY_TIME)
        )

    def now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def apply_params(self) -> None:
        if self.params.apply():
            # limits only: the supervisor's state stays
            self.core.config = _config(self.params.values | {"robot": self.robot})

    def on_observation(self, msg: JointState) -> None:
        stamp_ns = ros_msgs.stamp_ns(msg.header.stamp)
        self.core.observation(stamp_ns * 1e-9, _joint_pos_rel(msg, len(self.names)))
        self.deadline.observed(stamp_ns, time.monotonic())

    def on_answer_deadline(self) -> None:
        """The planner never answered the newest observation: send the safe action for its tick."""
        limit = self.params["answer_timeout_s"]
        stamp_ns = self.deadline.due(time.monotonic(), limit)
        if stamp_ns is None:
            return
        reason = (
            f"no plan for the observation stamped {stamp_ns} "
            f"within answer_timeout_s={limit} s (wall)"
        )
        self.publish(
            Decision(self.core.safe_command(stamp_ns * 1e-9), "no_answer", reason), stamp_ns
        )

    def on_tcp_pose(self, msg: PoseStamped) -> None:
        pos = ros_msgs.pose_from_msg(msg)[0]
        self.core.tcp_pose(pos)  # a non-finite pose leaves no TCP pose: EE commands get HOLD
        if np.all(np.isfinite(pos)):
            self.diag.set("tcp_pose", Level.OK, "finite TCP poses on /tcp_pose")
        else:
            self.diag.set(
                "tcp_pose", Level.ERROR, f"NaN or Inf TCP pose on /tcp_pose dropped: {pos.tolist()}"
            )

    def on_applied(self, msg: JointTrajectory) -> None:
        try:
            self.core.applied(ros_msgs.command_from_msg(msg))
        except ros_msgs.MessageError as e:
            self.diag.set("applied", Level.ERROR, f"unreadable applied-command report: {e}")
            return
        self.diag.set("applied", Level.OK, "the step limit follows the driver's reports")

    def on_action(self, msg: JointTrajectory) -> None:
        self.apply_params()
        stamp_ns = ros_msgs.stamp_ns(msg.header.stamp)
        self.deadline.answered(stamp_ns)
        self.sources.refresh("action")
        if msg.points:
            d = msg.points[0].time_from_start
            self.period_s = d.sec + d.nanosec * 1e-9
        try:  # NaN / Inf pass here: the supervisor's own guard rejects them (core.filter)
            command = ros_msgs.command_from_msg(msg, finite=False)
        except ros_msgs.MessageError as e:
            decision = self.core.reject(stamp_ns * 1e-9, str(e))
        else:
            decision = self.core.filter(command, self.now_s())
        self.publish(decision, stamp_ns)

    def on_watchdog(self) -> None:
        self.apply_params()
        decision = self.core.watchdog(self.now_s())
        if decision is not None:
            if decision.status == "watchdog":  # name the node that went quiet
                decision.reason += f" on {self.sources.describe('action')}"
            self.publish(decision, self.get_clock().now().nanoseconds)

    def publish(self, decision, stamp_ns: int) -> None:
        self.pub.publish(
            ros_msgs.command_to_msg(decision.command, self.names, stamp_ns, self.period_s)
        )
        if decision.status == "duplicate":  # the first decision's diagnostics stand
            self.counts["duplicate"] += 1
            return
        if decision.status in ("pass", "clipped"):
            self.counts[decision.status] += 1
            level = Level.OK if decision.status == "pass" else Level.WARN
            text = "forwarding plans" if level == Level.OK else f"clipped by {decision.reason}"
        else:
            self.counts["rejected" if decision.status == "rejected" else "safe"] += 1
            level = Level.WARN if decision.status == "estop" else Level.ERROR
            text = (
                f"{decision.command.kind.value.upper()} sent: {decision.status}: {decision.reason}"
            )
        self.diag.set("command", level, text, **self.counts)

    def on_estop(self, request, response):
        self.core.estop()
        self.publish(self.core.watchdog(self.now_s()), self.get_clock().now().nanoseconds)
        self.diag.set("estop", Level.ERROR, "e-stop latched: safe action until ~/resume")
        response.success, response.message = True, "e-stop latched"
        return response

    def on_resume(self, request, response):
        reason = self.core.resume(self.now_s())
        response.success = reason is None
        response.message = reason or "resumed"
        if reason is None:
            self.diag.set("estop", Level.OK, "released")
        return response


def main(args=None):
    with rclpy.init(args=args):
        node = SafetyNode()
        spin_until_shutdown(node)


if __name__ == "__main__":
    main()
