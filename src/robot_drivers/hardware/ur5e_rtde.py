"""UR5e over ur_rtde: 5 Hz end-effector deltas tracked by servoL at 500 Hz.

Each EE_DELTA command is applied to the MEASURED TCP pose exactly like the MuJoCo backend (world-
frame delta, rotation on the left, per-step caps), and a 500 Hz servo loop interpolates from the
current set-point to that target over one control period, kicking the controller's watchdog every
cycle. Faults come from the controller itself: lost RTDE link, protective / emergency stop, the
control script no longer running; reduced speed scaling is a warning (targets arrive late).

Frames: ur_rtde reports poses in the controller's base frame, which is the MuJoCo scene's world
frame (the menagerie arm's forward kinematics equal the UR5e DH model); `world_yaw` turns it for a
differently mounted arm, and `tcp_offset` puts the controller's TCP on the sim's pinch point.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from robot_drivers.interface import (
    Command,
    CommandKind,
    Fault,
    FaultLevel,
    Observation,
    RobotBackend,
    validate_command,
)
from robot_drivers.ur5e.backend import make_spec
from robot_drivers.ur5e.config import ControllerConfig, SceneConfig
from robot_drivers.ur5e.so3 import mat_to_rotvec, rotvec_to_mat, rotz

RTDE_PORT = 30004  # fixed by the UR controller
ROBOT_MODE_RUNNING = 7  # RTDE robot_mode value when the arm is powered and released


@dataclass(frozen=True)
class UR5eRtdeConfig:
    controller: ControllerConfig = ControllerConfig()  # control rate and step caps, as in sim
    servo_rate_hz: float = 500.0
    lookahead_time: float = 0.1  # s, servoL smoothing (ur_rtde accepts 0.03..0.2)
    gain: float = 300.0  # servoL proportional gain (100..2000)
    watchdog_min_hz: float = 10.0  # the controller stops the arm if not kicked this often
    # flange -> the sim's TCP (gripper_pinch): 155.8 mm out, turned -90 deg about z (measured on the
    # MuJoCo model; tests/test_drivers.py checks it), so real and sim TCP frames coincide
    tcp_offset: tuple[float, ...] = (0.0, 0.0, 0.1558, 0.0, 0.0, -np.pi / 2)
    world_yaw: float = (
        0.0  # rad: world = Rz(world_yaw) * controller base (the sim's world IS the base frame)
    )
    speed_scaling_warn: float = 0.99  # below this the speed slider / safety slows the arm

    def __post_init__(self) -> None:
        if not 0.03 <= self.lookahead_time <= 0.2:
            raise ValueError(f"lookahead_time must be in [0.03, 0.2] s, got {self.lookahead_time}")
        if not 100 <= self.gain <= 2000:
            raise ValueError(f"gain must be in [100, 2000], got {self.gain}")
        if self.servo_rate_hz <= self.controller.control_hz or self.watchdog_min_hz <= 0:
            raise ValueError(
                "servo_rate_hz must exceed the control rate and watchdog_min_hz be > 0"
            )


def connect_ur5e(
    host: str, config: UR5eRtdeConfig | None = None, gripper=None
) -> "UR5eRtdeBackend":
    """Open RTDE receive + control to the arm at `host`; a clear ConnectionError if unreachable."""
    if not host:
        raise ValueError("robot_ip is required (the UR5e controller's address)")
    config = config or UR5eRtdeConfig()
    import rtde_control  # noqa: PLC0415 - ur_rtde's client: needed only to drive a real UR5e
    import rtde_receive  # noqa: PLC0415 - ur_rtde's client: needed only to drive a real UR5e

    try:
        receive = rtde_receive.RTDEReceiveInterface(host, config.servo_rate_hz)
    except RuntimeError as e:
        raise ConnectionError(
            f"UR5e at {host}: could not open RTDE on port {RTDE_PORT} ({e}). Check that the "
            "controller is booted, the address and subnet are right (ping it), and no other "
            "RTDE client holds it."
        ) from e
    try:
        control = rtde_control.RTDEControlInterface(host, config.servo_rate_hz)
    except RuntimeError as e:
        receive.disconnect()
        raise ConnectionError(
            f"UR5e at {host}: RTDE receive works but the control interface failed ({e}). Put the "
            "pendant in Remote Control mode, release the brakes, and clear any protective stop."
        ) from e
    control.setTcp(list(config.tcp_offset))
    control.setWatchdog(config.watchdog_min_hz)
    return UR5eRtdeBackend(control, receive, config, gripper)


def interpolate(start: tuple[np.ndarray, np.ndarray], end: tuple[np.ndarray, np.ndarray], s: float):
    """Pose at fraction s in [0, 1]: linear in position, geodesic in rotation."""
    (p0, r0), (p1, r1) = start, end
    s = float(np.clip(s, 0.0, 1.0))
    return p0 + s * (p1 - p0), rotvec_to_mat(s * mat_to_rotvec(r1 @ r0.T)) @ r0


Pose = tuple[np.ndarray, np.ndarray]  # (position (3,), rotation matrix (3, 3)), world frame


class UR5eRtdeBackend(RobotBackend):
    """`control` / `receive` are ur_rtde's RTDEControlInterface / RTDEReceiveInterface (or stand-ins
    with the same methods); `gripper` has move(0..255) and position() -> 0..255, or is None."""

    def __init__(
        self,
        control,
        receive,
        config: UR5eRtdeConfig | None = None,
        gripper=None,
        clock=time.monotonic,
    ):
        self.config = config or UR5eRtdeConfig()
        self.spec = make_spec(SceneConfig(cameras=()), self.config.controller)
        self.control, self.receive, self.gripper, self._clock = control, receive, gripper, clock
        self._io = threading.Lock()  # ur_rtde's control interface is driven from two threads
        self._world = rotz(self.config.world_yaw)
        # (start pose, end pose, t0, duration) in the world frame; a pose is (position, rotation)
        self._segment: tuple[Pose, Pose, float, float] | None = None
        self._setpoint: Pose | None = None
        self._gripper_closed = False
        self._stopped = True  # servo idle until reset()
        self.speed_scaling = 1.0
        self._loop_error: str | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # --- frames -------------------------------------------------------------------------------
    def measured_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """TCP (position, rotation matrix) in the world frame."""
        tcp = np.asarray(self.receive.getActualTCPPose(), dtype=np.float64)
        return self._world @ tcp[:3], self._world @ rotvec_to_mat(tcp[3:6])

    def to_base(self, pos: np.ndarray, mat: np.ndarray) -> list[float]:
        """World pose -> ur_rtde pose [x, y, z, rx, ry, rz] in the controller's base frame."""
        return [*(self._world.T @ pos), *mat_to_rotvec(self._world.T @ mat)]

    # --- RobotBackend -------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Observation:
        """Confirm the arm is ready (reconnecting a lost link) and hold the current pose."""
        with self._io:
            if not self.receive.isConnected():
                self.receive.reconnect()
            if not self.control.isConnected():
                self.control.reconnect()
        self._loop_error = None
        errors = [f for f in self.faults() if f.level >= FaultLevel.ERROR]
        if errors:
            raise RuntimeError("ur5e not ready: " + "; ".join(f.message for f in errors))
        pose = self.measured_pose()
        self._setpoint, self._segment, self._stopped = pose, None, False
        return self.observe()

    def act(self, command: Command) -> None:
        validate_command(self.spec, command)
        errors = [f for f in self.faults() if f.level >= FaultLevel.ERROR]
        if errors:
            raise RuntimeError(
                "ur5e: refusing a command while faulted: " + "; ".join(f.code for f in errors)
            )
        if command.kind == CommandKind.DAMP:  # the arm has no damping mode: stop servoing
            with self._io:
                self.control.servoStop()
            self._stopped = True
            return
        if command.kind == CommandKind.HOLD:
            if self._setpoint is not None:
                self._segment = None  # keep the current set-point
            return
        if command.kind != CommandKind.EE_DELTA:
            raise ValueError(
                f"ur5e accepts EE_DELTA, HOLD or DAMP commands, got {command.kind.name}"
            )
        c = self.config.controller
        v = np.asarray(command.values, dtype=np.float64)
        dp, dr = v[:3], v[3:6]
        if np.linalg.norm(dp) > c.max_step_pos:
            dp = dp * c.max_step_pos / np.linalg.norm(dp)
        if np.linalg.norm(dr) > c.max_step_rot:
            dr = dr * c.max_step_rot / np.linalg.norm(dr)
        pos, mat = self.measured_pose()
        target = (pos + dp, rotvec_to_mat(dr) @ mat)
        start = self._setpoint if self._setpoint is not None else (pos, mat)
        self._segment = (start, target, self._clock(), 1.0 / c.control_hz)
        self._stopped = False
        closed = bool(v[6] > 0.5)
        if self.gripper is not None and closed != self._gripper_closed:
            self.gripper.move(255 if closed else 0)
        self._gripper_closed = closed

    def servo_step(self) -> list[float] | None:
        """One servo cycle: send the interpolated set-point with servoL, kick the watchdog."""
        with self._io:
            self.control.kickWatchdog()
        if self._stopped or self._setpoint is None:
            return None
        if self._segment is not None:
            start, end, t0, duration = self._segment
            self._setpoint = interpolate(start, end, (self._clock() - t0) / duration)
        pose = self.to_base(*self._setpoint)
        cfg = self.config
        with self._io:
            self.control.servoL(
                pose, 0.0, 0.0, 1.0 / cfg.servo_rate_hz, cfg.lookahead_time, cfg.gain
            )
        return pose

    def observe(self) -> Observation:
        q = np.asarray(self.receive.getActualQ(), dtype=np.float32)
        qd = np.asarray(self.receive.getActualQd(), dtype=np.float32)
        pos, mat = self.measured_pose()
        grip = (
            (self.gripper.position() / 255.0)
            if self.gripper is not None
            else float(self._gripper_closed)
        )
        self.speed_scaling = float(self.receive.getSpeedScalingCombined())
        proprio = np.concatenate([q, qd, pos, mat[:, :2].T.reshape(6), [grip]]).astype(np.float32)
        return Observation(
            stamp=time.time(),
            proprio=proprio,
            joint_pos=q,
            joint_vel=qd,
            privileged={
                "tcp_pos": pos,
                "tcp_mat": mat,
                "speed_scaling": np.array([self.speed_scaling]),
            },
        )

    def faults(self) -> list[Fault]:
        r = self.receive
        if not r.isConnected():
            return [
                Fault(
                    FaultLevel.ERROR,
                    "disconnected",
                    "RTDE link to the UR5e lost; check the cable, then reset",
                )
            ]
        with self._io:
            control_up = self.control.isConnected()
            running = control_up and self.control.isProgramRunning()
        out = []
        if r.isEmergencyStopped():
            out.append(
                Fault(
                    FaultLevel.ERROR,
                    "emergency_stop",
                    "emergency stop pressed: release it, re-enable the arm, then reset",
                )
            )
        elif r.isProtectiveStopped():
            out.append(
                Fault(
                    FaultLevel.ERROR,
                    "protective_stop",
                    "protective stop (collision or limit): clear it on the pendant, then reset",
                )
            )
        elif r.getRobotMode() != ROBOT_MODE_RUNNING:
            out.append(
                Fault(
                    FaultLevel.ERROR,
                    "not_running",
                    f"robot mode {r.getRobotMode()} (7 = running): power on and release the brakes",
                )
            )
        if not control_up:
            out.append(
                Fault(
                    FaultLevel.ERROR,
                    "control_disconnected",
                    "RTDE control interface lost; reset to reconnect",
                )
            )
        elif not running:
            out.append(
                Fault(
                    FaultLevel.ERROR,
                    "script_stopped",
                    "the ur_rtde control script stopped (watchdog, stop or another program); reset",
                )
            )
        if self._loop_error:
            out.append(Fault(FaultLevel.ERROR, "servo_loop", self._loop_error))
        if self.speed_scaling < self.config.speed_scaling_warn:
            out.append(
                Fault(
                    FaultLevel.WARN,
                    "speed_scaling",
                    f"speed scaling {self.speed_scaling:.2f}: targets are reached late",
                )
            )
        return out

    # --- the 500 Hz loop ----------------------------------------------------------------------
    def start(self) -> None:
        """Run `servo_step` at servo_rate_hz on ur_rtde's real-time period timer."""

        def loop():
            while not self._stop.is_set():
                t = self.control.initPeriod()  # local timing only: no lock needed
                try:
                    self.servo_step()
                except Exception as e:  # a failed cycle stops servoing; faults() reports it
                    self._loop_error = f"servo loop failed: {e}"
                    self._stopped = True
                self.control.waitPeriod(t)

        self._stop.clear()
        self._thread = threading.Thread(target=loop, name="ur5e_servo", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        with self._io:
            if self.control.isConnected():
                self.control.servoStop()
                self.control.stopScript()
            self.control.disconnect()
        self.receive.disconnect()
        if self.gripper is not None:
            self.gripper.close()
