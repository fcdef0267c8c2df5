"""The shared shell of the hardware driver nodes (UR5e via ur_rtde, Go2 via unitree_sdk2py).

Hardware runs on the wall clock. A timer at `publish_rate_hz` reads the backend and publishes
`/joint_states` and `/simdist/robot/proprio` (plus what the subclass adds); commands from
`/simdist/safe_command` go to the backend on arrival, unless their stamp (the observation they
answer) is more than `max_command_age_s` from the node clock: such a command is replaced by HOLD,
as the safety supervisor does upstream. Any ERROR fault latches the safe action
(the backend's own stop / damping) and is reported on /diagnostics until `~/reset` clears it;
a command-rate watchdog sends HOLD when the supervisor falls silent.
"""

from __future__ import annotations

import time

from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.described import Param
from robot_drivers.diagnostics import CommandSourceWatch, Diagnostics, Level
from robot_drivers.interface import (
    Command,
    CommandKind,
    Fault,
    FaultLevel,
    Observation,
    RobotBackend,
)
from robot_drivers.node_params import NodeParams
from robot_drivers.safety import stale_command_reason

COMMON_PARAMS = (
    Param(
        "publish_rate_hz",
        50.0,
        "how often robot state is read and published",
        1.0,
        1000.0,
        read_only=True,
    ),
    Param(
        "command_timeout_s",
        0.5,
        "no command for this long -> HOLD (the supervisor also watches)",
        0.01,
        10.0,
    ),
    Param(
        "max_command_age_s",
        0.5,
        "a command stamped further than this from the node clock (late, or ahead) -> HOLD",
        0.001,
        10.0,
    ),
)


class RealtimeDriverNode(Node):
    """Subclasses set SAFE_KIND, declare their params and build the backend in `connect()`."""

    SAFE_KIND = CommandKind.HOLD

    def __init__(
        self, name: str, params: tuple[Param, ...], backend: RobotBackend | None = None, **kwargs
    ):
        super().__init__(name, **kwargs)
        self.params = NodeParams(self, COMMON_PARAMS + params)
        self.diag = Diagnostics(self, hardware_id=name)
        self.backend = backend if backend is not None else self.connect()
        self.spec = self.backend.spec
        self.latched: str | None = (
            "not reset yet"  # why the safe action is latched (fault, start-up)
        )
        self.last_command_time: float | None = None
        self.watchdog_fired = False
        self.pub_joints = self.create_publisher(JointState, "/joint_states", 10)
        self.pub_proprio = self.create_publisher(
            JointState, "/simdist/robot/proprio", ros_msgs.RECORDED_DEPTH
        )
        self.create_subscription(JointTrajectory, "/simdist/safe_command", self.on_command, 10)
        self.pub_applied = self.create_publisher(
            JointTrajectory, ros_msgs.APPLIED_COMMAND_TOPIC, ros_msgs.RECORDED_DEPTH
        )
        self._command_stamp_ns = 0  # stamp of the newest command received (its safe actions too)
        self.command_source = CommandSourceWatch(self, self.diag, "/simdist/safe_command")
        self.create_service(Trigger, "~/reset", self.on_reset)
        self.create_timer(1.0 / self.params["publish_rate_hz"], self.tick)
        self.diag.set("robot", Level.WARN, "connected; call ~/reset to enable commands")

    def connect(self) -> RobotBackend:
        raise NotImplementedError

    def apply_params(self, changed: dict) -> None:
        """Push changed tunables into the backend (subclasses)."""

    def publish_extra(self, obs: Observation, stamp_ns: int) -> None:
        """Robot-specific topics (subclasses)."""

    # --- commands -------------------------------------------------------------------------------
    def on_command(self, msg: JointTrajectory) -> None:
        self.last_command_time = time.monotonic()
        self.watchdog_fired = False
        if self.latched:
            self.diag.set("command", Level.WARN, f"command ignored: {self.latched}")
            return
        self._command_stamp_ns = ros_msgs.stamp_ns(msg.header.stamp)
        try:
            command = ros_msgs.command_from_msg(msg, self.spec)
            stale = command.kind not in (CommandKind.HOLD, CommandKind.DAMP) and (
                stale_command_reason(
                    ros_msgs.stamp_ns(msg.header.stamp) * 1e-9,
                    self.get_clock().now().nanoseconds * 1e-9,
                    self.params["max_command_age_s"],
                )
            )
            if stale:
                self.diag.set("command", Level.ERROR, f"{stale}: HOLD")
                self.send(CommandKind.HOLD)
                return
            self.backend.act(command)
            self.report_applied(command)
            self.diag.set("command", Level.OK, f"applying {msg.header.frame_id}")
        except (ValueError, RuntimeError) as e:
            self.diag.set(
                "command", Level.ERROR, f"command refused, sending {self.SAFE_KIND.value}: {e}"
            )
            self.send(self.SAFE_KIND)

    def report_applied(self, command: Command) -> None:
        """What the robot now does, for the supervisor's step limiter. A safe action carries the
        newest command's stamp, so a newer command still reports as newer."""
        stamp_ns = round(command.stamp * 1e9) or self._command_stamp_ns
        self.pub_applied.publish(
            ros_msgs.command_to_msg(command, ros_msgs.action_names(self.spec.name), stamp_ns, 0.0)
        )

    def send(self, kind: CommandKind) -> None:
        try:
            self.backend.act(Command(kind))
            self.report_applied(Command(kind))
        except (ValueError, RuntimeError) as e:  # a faulted robot refuses even that: it is stopped
            self.diag.set("safe_action", Level.ERROR, f"{kind.value} not accepted: {e}")

    # --- the periodic read ------------------------------------------------------------------------
    def tick(self) -> None:
        changed = self.params.apply()
        if changed:
            self.apply_params(changed)
        try:
            faults = self.backend.faults()
        except (RuntimeError, OSError) as e:  # the vendor client itself failed: treat as lost link
            faults = [
                Fault(
                    FaultLevel.ERROR,
                    "fault_check_failed",
                    f"reading the robot's status failed: {e}",
                )
            ]
        errors = [f for f in faults if f.level >= FaultLevel.ERROR]
        text = "; ".join(f"{f.code}: {f.message}" for f in faults) or "no faults"
        if errors:
            if self.latched is None:
                self.latched = text
                self.send(self.SAFE_KIND)
            self.diag.set(
                "robot", Level.ERROR, f"{text} (safe action latched; ~/reset after fixing)"
            )
        elif self.latched is None:
            self.diag.set("robot", Level.WARN if faults else Level.OK, text)
        timeout = self.params["command_timeout_s"]
        if (
            self.latched is None
            and self.last_command_time is not None
            and not self.watchdog_fired
            and time.monotonic() - self.last_command_time > timeout
        ):
            self.watchdog_fired = True
            self.diag.set("command", Level.WARN, f"no command for {timeout} s: HOLD")
            self.send(CommandKind.HOLD)
        try:
            obs = self.backend.observe()
        except (RuntimeError, ValueError) as e:
            self.diag.set("state", Level.ERROR, f"cannot read robot state: {e}")
            return
        self.diag.set("state", Level.OK, "reading robot state", stale_after_s=2.0)
        t = self.get_clock().now().nanoseconds
        self.pub_joints.publish(
            ros_msgs.joint_state_msg(self.spec.joint_names, obs.joint_pos, obs.joint_vel, t)
        )
        self.publish_extra(obs, t)
        self.pub_proprio.publish(ros_msgs.proprio_to_msg(obs, self.spec, t))

    def on_reset(self, request, response):
        try:
            self.backend.reset()
        except (RuntimeError, ValueError, OSError) as e:
            response.success, response.message = False, f"reset refused: {e}"
            return response
        self.latched = None
        self.last_command_time = None
        self.diag.set("robot", Level.OK, "reset: commands enabled")
        response.success, response.message = True, "ready"
        return response
