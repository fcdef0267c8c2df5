"""Unitree Go2 over unitree_sdk2py: rt/lowcmd (with the SDK's CRC32) out, rt/lowstate in.

The SDK is not on PyPI; it is imported only by `connect_go2`, with install instructions when
missing. Everything else — the LowCmd byte layout and CRC, joint order and units, the PD
set-points, the lowstate timeout and the damping mode on any fault — is plain Python tested
without the robot.

Motor order: the SDK's motor_cmd / motor_state index i = Unitree joint order FR, FL, RR, RL x
(hip, thigh, calf), i.e. `UNITREE_JOINT_NAMES[i]`; indices 12..19 are unused and kept stopped.
"""

from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from robot_drivers.go2.backend import go2_spec
from robot_drivers.go2.config import DEFAULT_POSE_UNITREE, Go2Config
from robot_drivers.go2.observation import Go2State, build_proprio
from robot_drivers.interface import (
    Command,
    CommandKind,
    Fault,
    FaultLevel,
    Observation,
    RobotBackend,
    validate_command,
)

SDK_URL = "https://github.com/unitreerobotics/unitree_sdk2_python"
N_MOTORS = 20  # LowCmd carries 20 motor slots; the Go2 uses the first 12
POS_STOP = 2.146e9  # the SDK's "no position target" sentinel (PosStopF)
VEL_STOP = 16000.0  # the SDK's "no velocity target" sentinel (VelStopF)
PMSM_MODE = 0x01
# Little-endian, 4-byte aligned struct layout of unitree_go LowCmd_ (812 bytes), field by field:
# head[2] level_flag frame_reserve | sn[2] version[2] (uint32) | bandwidth (uint16) + 2 pad |
# 20 x (mode uint8 + 3 pad, q dq tau kp kd float32, reserve[3] uint32) | bms off + reserve[3] |
# wireless_remote[40] led[12] fan[2] gpio (uint8) + 1 pad | reserve (uint32) | crc (uint32)
LOWCMD_FORMAT = "<4B4IH2x" + "B3x5f3I" * N_MOTORS + "4B" + "55Bx2I"
LOWCMD_SIZE = struct.calcsize(LOWCMD_FORMAT)
_POLY = 0x04C11DB7


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        c = byte << 24
        for _ in range(8):
            c = ((c << 1) ^ _POLY) if c & 0x80000000 else (c << 1)
        table.append(c & 0xFFFFFFFF)
    return table


_TABLE = _crc_table()


def crc32_mpeg2(data: bytes) -> int:
    """CRC-32/MPEG-2: polynomial 0x04C11DB7, init 0xFFFFFFFF, no reflection, no final xor."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _TABLE[((crc >> 24) ^ b) & 0xFF]
    return crc


def unitree_crc(packed: bytes) -> int:
    """The SDK's CRC of a packed message: every 32-bit little-endian word but the last (the crc
    field itself), each fed most-significant bit first, i.e. as its big-endian bytes."""
    if len(packed) % 4:
        raise ValueError(f"packed message must be whole 32-bit words, got {len(packed)} bytes")
    body = packed[:-4]
    return crc32_mpeg2(b"".join(body[i : i + 4][::-1] for i in range(0, len(body), 4)))


@dataclass
class MotorCmd:
    mode: int = 0
    q: float = 0.0
    dq: float = 0.0
    tau: float = 0.0
    kp: float = 0.0
    kd: float = 0.0
    reserve: list = field(default_factory=lambda: [0, 0, 0])


@dataclass
class BmsCmd:
    off: int = 0
    reserve: list = field(default_factory=lambda: [0, 0, 0])


@dataclass
class LowCmd:
    """Field-for-field the SDK's unitree_go LowCmd_ (builds commands without the SDK)."""

    head: list = field(default_factory=lambda: [0xFE, 0xEF])
    level_flag: int = 0xFF
    frame_reserve: int = 0
    sn: list = field(default_factory=lambda: [0, 0])
    version: list = field(default_factory=lambda: [0, 0])
    bandwidth: int = 0
    motor_cmd: list = field(default_factory=lambda: [MotorCmd() for _ in range(N_MOTORS)])
    bms_cmd: BmsCmd = field(default_factory=BmsCmd)
    wireless_remote: list = field(default_factory=lambda: [0] * 40)
    led: list = field(default_factory=lambda: [0] * 12)
    fan: list = field(default_factory=lambda: [0, 0])
    gpio: int = 0
    reserve: int = 0
    crc: int = 0


def pack_lowcmd(cmd) -> bytes:
    """Serialise any LowCmd-shaped object (ours or the SDK's LowCmd_) to its 812-byte layout."""
    values = [*cmd.head, cmd.level_flag, cmd.frame_reserve, *cmd.sn, *cmd.version, cmd.bandwidth]
    for m in cmd.motor_cmd:
        values += [m.mode, m.q, m.dq, m.tau, m.kp, m.kd, *m.reserve]
    values += [
        cmd.bms_cmd.off,
        *cmd.bms_cmd.reserve,
        *cmd.wireless_remote,
        *cmd.led,
        *cmd.fan,
        cmd.gpio,
        cmd.reserve,
        cmd.crc,
    ]
    return struct.pack(LOWCMD_FORMAT, *values)


def lowcmd_crc(cmd) -> int:
    return unitree_crc(pack_lowcmd(cmd))


def import_sdk():
    """The unitree_sdk2py modules this backend uses, or an ImportError that says how to install
    them."""
    try:
        from unitree_sdk2py.core.channel import (  # noqa: PLC0415 - unitree_sdk2py is not on PyPI: needed only to drive a real Go2
            ChannelFactoryInitialize,
            ChannelPublisher,
            ChannelSubscriber,
        )
        from unitree_sdk2py.idl.default import unitree_go_msg_dds__LowCmd_  # noqa: PLC0415 - unitree_sdk2py is not on PyPI: needed only to drive a real Go2
        from unitree_sdk2py.idl.unitree_go.msg.dds_ import LowCmd_, LowState_  # noqa: PLC0415 - unitree_sdk2py is not on PyPI: needed only to drive a real Go2
    except ImportError as e:
        raise ImportError(
            "unitree_sdk2py is needed to drive a real Go2 but could not be imported "
            f"({e}). It is not on PyPI: install it from {SDK_URL} (git clone, then "
            "`pip install -e .`; it needs cyclonedds 0.10.x, see its README for "
            "CYCLONEDDS_HOME). Simulation needs no SDK: use robot:=sim."
        ) from e
    return (
        ChannelFactoryInitialize,
        ChannelPublisher,
        ChannelSubscriber,
        unitree_go_msg_dds__LowCmd_,
        LowCmd_,
        LowState_,
    )


@dataclass(frozen=True)
class Go2SdkConfig:
    """Hardware-side settings; gains and scale come from the sim's ActuationConfig (one truth)."""

    go2: Go2Config = Go2Config()
    lowcmd_rate_hz: float = 500.0  # the motor controller expects a steady lowcmd stream
    lowstate_timeout_s: float = 0.1  # no rt/lowstate this long -> "disconnected" fault, DAMP
    max_tilt: float = 1.047  # rad, base tilt beyond which the robot has fallen -> DAMP

    def __post_init__(self) -> None:
        if self.lowcmd_rate_hz <= 0 or self.lowstate_timeout_s <= 0:
            raise ValueError("lowcmd_rate_hz and lowstate_timeout_s must be > 0")


def quat_to_gravity(quat_wxyz) -> np.ndarray:
    """R_base^T (0, 0, -1) from a wxyz unit quaternion (the Go2 IMU's convention)."""
    w, x, y, z = np.asarray(quat_wxyz, dtype=np.float64) / np.linalg.norm(quat_wxyz)
    return np.array([-2 * (x * z - w * y), -2 * (y * z + w * x), -(1 - 2 * (x * x + y * y))])


class Go2SdkBackend(RobotBackend):
    """A real Go2 at 50 Hz policy rate; `publish_lowcmd()` runs `lowcmd_rate_hz` times a second.

    `write(cmd)` publishes one LowCmd on rt/lowcmd; `new_lowcmd()` makes an empty one (the SDK's
    default LowCmd_ on the robot). Feed every rt/lowstate message to `on_lowstate`.
    """

    def __init__(
        self, write, new_lowcmd=LowCmd, config: Go2SdkConfig | None = None, clock=time.monotonic
    ):
        self.config = config or Go2SdkConfig()
        self.spec = go2_spec(self.config.go2)
        self._write, self._new_lowcmd, self._clock = write, new_lowcmd, clock
        self._lock = threading.Lock()
        self._state = None
        self._state_time: float | None = None
        self._base_lin_vel: np.ndarray | None = None  # from an external estimator, base frame
        self._command = np.zeros(3)
        self._last_action = np.zeros(12)
        self._step = 0
        act = self.config.go2.actuation
        # the joint target (None: damped), start damped until reset()
        self._target: np.ndarray | None = None
        self._kp, self._kd = 0.0, act.damp_kd
        self.damped_reason: str | None = "not started: call reset()"
        self._subscriber: object | None = None  # the rt/lowstate subscriber, kept alive

    # --- inputs -----------------------------------------------------------------------------
    def on_lowstate(self, msg) -> None:
        with self._lock:
            self._state, self._state_time = msg, self._clock()

    def set_base_velocity(self, lin_vel_base) -> None:
        """Base linear velocity (m/s, base frame) from a state estimator (the IMU lacks it)."""
        v = np.asarray(lin_vel_base, dtype=np.float64)
        self._base_lin_vel = v if v.shape == (3,) and np.all(np.isfinite(v)) else None

    def set_command(self, command) -> None:
        c = np.asarray(command, dtype=np.float64)
        if c.shape != (3,) or not np.all(np.isfinite(c)):
            raise ValueError(f"go2 velocity command must be 3 finite values, got {command!r}")
        self._command = c

    # --- RobotBackend -----------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Observation:
        """Clear the damping latch if nothing is wrong and hold the default stance."""
        errors = [f for f in self.faults() if f.level >= FaultLevel.ERROR]
        if errors:
            raise RuntimeError(
                f"go2: cannot leave damping mode: {'; '.join(f.message for f in errors)}"
            )
        self.damped_reason = None
        self._step = 0
        self.act(Command(CommandKind.HOLD))
        return self.observe()

    def act(self, command: Command) -> None:
        validate_command(self.spec, command)
        act = self.config.go2.actuation
        with self._lock:
            if command.kind == CommandKind.DAMP or self.damped_reason is not None:
                self._target, self._kp, self._kd = None, 0.0, act.damp_kd
                self._last_action = np.zeros(12)
                return
            if command.kind == CommandKind.JOINT_POSITION:
                a = np.asarray(command.values, dtype=np.float64)
                self._target = DEFAULT_POSE_UNITREE + act.action_scale * a
                self._last_action = a
            elif command.kind == CommandKind.HOLD:
                self._target = DEFAULT_POSE_UNITREE.copy()
                self._last_action = np.zeros(12)
            else:
                raise ValueError(
                    f"go2 accepts JOINT_POSITION, HOLD or DAMP, got {command.kind.name}"
                )
            self._kp, self._kd = act.kp, act.kd
            self._step += 1

    def build_lowcmd(self):
        """The LowCmd for the current set-point, CRC filled in (damping when faulted)."""
        faults = [f for f in self.faults() if f.level >= FaultLevel.ERROR]
        if faults and self.damped_reason is None:
            self.damped_reason = "; ".join(f"{f.code}: {f.message}" for f in faults)
        with self._lock:
            damped = self.damped_reason is not None or self._target is None
            target, kp, kd = self._target, self._kp, self._kd
        if damped:
            kp, kd = 0.0, self.config.go2.actuation.damp_kd
        cmd = self._new_lowcmd()
        cmd.head[0], cmd.head[1] = 0xFE, 0xEF
        cmd.level_flag, cmd.gpio = 0xFF, 0
        for i in range(N_MOTORS):
            m = cmd.motor_cmd[i]
            if i < 12:
                m.mode, m.q, m.dq, m.tau = (
                    PMSM_MODE,
                    (POS_STOP if damped or target is None else float(target[i])),
                    0.0,
                    0.0,
                )
                m.kp, m.kd = float(kp), float(kd)
            else:
                m.mode, m.q, m.dq, m.tau, m.kp, m.kd = 0, POS_STOP, VEL_STOP, 0.0, 0.0, 0.0
        cmd.crc = lowcmd_crc(cmd)
        return cmd

    def publish_lowcmd(self) -> None:
        self._write(self.build_lowcmd())

    def observe(self) -> Observation:
        with self._lock:
            s = self._state
        if s is None:
            raise RuntimeError(
                "go2: no rt/lowstate received yet; is the robot on and the interface right?"
            )
        q = np.array([s.motor_state[i].q for i in range(12)], dtype=np.float64)
        dq = np.array([s.motor_state[i].dq for i in range(12)], dtype=np.float64)
        quat = np.asarray(s.imu_state.quaternion, dtype=np.float64)
        gyro = np.asarray(s.imu_state.gyroscope, dtype=np.float64)
        cfg = self.config.go2
        state = Go2State(
            base_lin_vel=self._base_lin_vel if self._base_lin_vel is not None else np.zeros(3),
            base_ang_vel=gyro,
            projected_gravity=quat_to_gravity(quat),
            command=self._command.copy(),
            joint_pos=q,
            joint_vel=dq,
            last_action=self._last_action.copy(),
            scan_heights=np.full(cfg.scan.nx * cfg.scan.ny, np.nan),
            step=self._step,
            control_dt=cfg.control_dt,
            gait_period=cfg.gait_period,
        )
        return Observation(
            stamp=time.time(),
            proprio=build_proprio(state),
            command=self._command.astype(np.float32),
            joint_pos=q.astype(np.float32),
            joint_vel=dq.astype(np.float32),
            privileged={
                "base_quat": quat,
                "base_ang_vel": gyro,
                "accelerometer": np.asarray(s.imu_state.accelerometer, dtype=np.float64),
            },
        )

    def faults(self) -> list[Fault]:
        out = []
        with self._lock:
            s, t = self._state, self._state_time
        if t is None or self._clock() - t > self.config.lowstate_timeout_s:
            age = "never received" if t is None else f"last one {self._clock() - t:.3f} s ago"
            out.append(
                Fault(
                    FaultLevel.ERROR,
                    "disconnected",
                    f"no rt/lowstate ({age}); check the network interface and the robot; "
                    "motors damped",
                )
            )
        elif s is not None:
            g = quat_to_gravity(s.imu_state.quaternion)
            tilt = float(np.arccos(np.clip(-g[2], -1.0, 1.0)))
            if tilt > self.config.max_tilt:
                out.append(
                    Fault(
                        FaultLevel.ERROR,
                        "fallen",
                        f"base tilt {tilt:.2f} rad > {self.config.max_tilt}; motors damped",
                    )
                )
        if self._base_lin_vel is None:
            out.append(
                Fault(
                    FaultLevel.WARN,
                    "no_velocity_estimate",
                    "base linear velocity unknown (no estimator input); proprio uses zeros",
                )
            )
        if self.damped_reason is not None and not any(f.level >= FaultLevel.ERROR for f in out):
            out.append(
                Fault(
                    FaultLevel.WARN,
                    "damped",
                    f"damping mode ({self.damped_reason}); call reset to stand",
                )
            )
        return out

    def close(self) -> None:
        """Leave the robot damped (it sinks slowly to the ground instead of collapsing)."""
        self.damped_reason = self.damped_reason or "closed"
        self.publish_lowcmd()


def connect_go2(
    network_interface: str, config: Go2SdkConfig | None = None, domain_id: int = 0
) -> Go2SdkBackend:
    """A `Go2SdkBackend` wired to the robot's DDS topics (needs unitree_sdk2py).

    Sport mode must be released first (the Unitree app or MotionSwitcherClient.ReleaseMode), as
    in the SDK's low-level examples; docs/hardware.md has the checklist.
    """
    if not network_interface:
        raise ValueError("network_interface is required (the NIC wired to the Go2, e.g. enp3s0)")
    init, publisher_cls, subscriber_cls, default_lowcmd, lowcmd_t, lowstate_t = import_sdk()
    init(domain_id, network_interface)
    pub = publisher_cls("rt/lowcmd", lowcmd_t)
    pub.Init()
    backend = Go2SdkBackend(pub.Write, default_lowcmd, config)
    sub = subscriber_cls("rt/lowstate", lowstate_t)
    sub.Init(backend.on_lowstate, 10)
    backend._subscriber = sub  # keep it alive
    return backend
