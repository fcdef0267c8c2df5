"""Conversions between the robot interface and standard ROS messages (the one packing module).

docs/observation_topics.md describes the topics; every node packs and unpacks through these
functions so the layout is defined once. Unpacking validates and raises `MessageError` (a
ValueError) with what is wrong and what was expected; nothing is silently reshaped.
"""

from __future__ import annotations

import importlib
import json
import math

import numpy as np
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry
from sensor_msgs.msg import Image, Imu, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from robot_drivers.go2.config import UNITREE_JOINT_NAMES
from robot_drivers.interface import Command, CommandKind, Observation, RobotSpec

UR5E_ACTION_NAMES = ("dx", "dy", "dz", "rx", "ry", "rz", "gripper")
# Go2 actions are per joint in Unitree order (FR, FL, RR, RL x hip, thigh, calf).
ACTION_NAMES = {"ur5e": UR5E_ACTION_NAMES, "go2": UNITREE_JOINT_NAMES}
# The sensor topics of each robot beyond joints, proprio and cameras: the arm's TCP pose; the
# quadruped's floating base (IMU, odometry) and height scan.
SENSOR_TOPICS = {"ur5e": ("/tcp_pose",), "go2": ("/imu", "/odom", "/height_map")}
# What a driver actually sent to the robot (command packing, stamped with the command's stamp,
# HOLD / DAMP when it applied the safe action): the supervisor's step limiter follows it.
APPLIED_COMMAND_TOPIC = "/simdist/robot/applied_command"
# History depth of the small per-tick streams the recorder keeps (proprio, episode, commands).
# A reliable KEEP_LAST writer overwrites what a reader has not yet acknowledged, so a recorder
# that stalls for more than `depth` ticks (a slow disk, a loaded CPU) loses them in delivery;
# 100 ticks are 2 s at 50 Hz for a few kilobytes per stream.
RECORDED_DEPTH = 100


def message_class(msgtype: str):
    """The rclpy message class of 'pkg/msg/Name' (for raw subscriptions and replays)."""
    pkg, _, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.msg"), name)


class MessageError(ValueError):
    """A message that does not match the documented packing."""


# --- stamps ------------------------------------------------------------------------------------
def stamp_msg(ns: int) -> Time:
    return Time(sec=int(ns // 1_000_000_000), nanosec=int(ns % 1_000_000_000))


def stamp_ns(stamp: Time) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def duration_msg(seconds: float) -> Duration:
    ns = int(round(seconds * 1e9))
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


# --- images and height map ---------------------------------------------------------------------
def image_to_msg(image: np.ndarray, stamp_ns_: int, frame_id: str) -> Image:
    """(H, W, 3) uint8 RGB -> rgb8 Image."""
    image = np.ascontiguousarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise MessageError(f"image must be (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
    h, w, _ = image.shape
    msg = Image(height=h, width=w, encoding="rgb8", is_bigendian=0, step=3 * w)
    msg.header.stamp = stamp_msg(stamp_ns_)
    msg.header.frame_id = frame_id
    msg.data = image.tobytes()
    return msg


def image_from_msg(msg: Image, expected_hw: tuple[int, int] | None = None) -> np.ndarray:
    """rgb8 (or bgr8, converted) Image -> (H, W, 3) uint8 RGB; checks encoding, step and size."""
    where = f"image on frame {msg.header.frame_id!r}"
    if msg.encoding not in ("rgb8", "bgr8"):
        raise MessageError(
            f"{where}: encoding {msg.encoding!r} is not supported, expected 'rgb8' (or 'bgr8')"
        )
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if h <= 0 or w <= 0:
        raise MessageError(f"{where}: empty image {h}x{w}")
    if step < 3 * w:
        raise MessageError(f"{where}: step {step} is smaller than 3 * width = {3 * w}")
    if len(msg.data) != step * h:
        raise MessageError(
            f"{where}: {len(msg.data)} data bytes, expected step * height = {step * h}"
        )
    if expected_hw is not None and tuple(expected_hw) != (h, w):
        raise MessageError(
            f"{where}: size {h}x{w} (HxW), expected {expected_hw[0]}x{expected_hw[1]}"
        )
    rows = np.frombuffer(bytes(msg.data), dtype=np.uint8).reshape(h, step)
    image = rows[:, : 3 * w].reshape(h, w, 3)
    if msg.encoding == "bgr8":
        image = image[:, :, ::-1]
    return np.ascontiguousarray(image)


def height_map_to_msg(height_map: np.ndarray, stamp_ns_: int, frame_id: str = "base") -> Image:
    """(rows, cols) float32 -> 32FC1 Image, row-major, little-endian."""
    hm = np.ascontiguousarray(height_map, dtype="<f4")
    if hm.ndim != 2:
        raise MessageError(f"height map must be 2-D (rows, cols), got shape {hm.shape}")
    msg = Image(
        height=hm.shape[0],
        width=hm.shape[1],
        encoding="32FC1",
        is_bigendian=0,
        step=4 * hm.shape[1],
    )
    msg.header.stamp = stamp_msg(stamp_ns_)
    msg.header.frame_id = frame_id
    msg.data = hm.tobytes()
    return msg


def height_map_from_msg(msg: Image, expected_shape: tuple[int, int] | None = None) -> np.ndarray:
    if msg.encoding != "32FC1":
        raise MessageError(f"height map encoding {msg.encoding!r}, expected '32FC1'")
    h, w = int(msg.height), int(msg.width)
    if expected_shape is not None and (h, w) != tuple(expected_shape):
        raise MessageError(
            f"height map is {h}x{w}, expected {expected_shape[0]}x{expected_shape[1]}"
        )
    if int(msg.step) != 4 * w or len(msg.data) != 4 * w * h:
        raise MessageError(
            f"height map data is {len(msg.data)} bytes (step {msg.step}), expected {4 * w * h}"
        )
    dtype = ">f4" if msg.is_bigendian else "<f4"
    hm = np.frombuffer(bytes(msg.data), dtype=dtype).reshape(h, w).astype(np.float32)
    if not np.all(np.isfinite(hm)):
        raise MessageError("height map contains NaN or Inf")
    return hm


# --- proprio (flat vector) ---------------------------------------------------------------------
def proprio_names(spec: RobotSpec) -> list[str]:
    """Element names of the proprio packing: "<term>[i]" per term, then "command[i]"."""
    names = [f"{t.name}[{i}]" for t in spec.proprio_terms for i in range(t.dim)]
    return names + [f"command[{i}]" for i in range(spec.command_dim)]


def proprio_to_msg(obs: Observation, spec: RobotSpec, stamp_ns_: int) -> JointState:
    proprio = np.asarray(obs.proprio, dtype=np.float64).ravel()
    if proprio.shape != (spec.proprio_dim,):
        raise MessageError(
            f"{spec.name}: proprio has {proprio.size} values, expected {spec.proprio_dim}"
        )
    values = [proprio]
    if spec.command_dim:
        command = (
            np.zeros(spec.command_dim)
            if obs.command is None
            else np.asarray(obs.command, np.float64)
        )
        if command.shape != (spec.command_dim,):
            raise MessageError(
                f"{spec.name}: command has shape {command.shape}, expected ({spec.command_dim},)"
            )
        values.append(command)
    return pack_proprio(
        proprio_names(spec), proprio, values[1] if spec.command_dim else None, stamp_ns_, spec.name
    )


def pack_proprio(names, proprio, command, stamp_ns_: int, frame_id: str) -> JointState:
    """Low-level packing from already named values (ingestion republishes what it received)."""
    values = np.concatenate(
        [np.asarray(proprio, np.float64).ravel()]
        + ([] if command is None else [np.asarray(command, np.float64).ravel()])
    )
    if len(names) != values.size:
        raise MessageError(f"{len(names)} proprio names for {values.size} values")
    msg = JointState(name=list(names), position=values.tolist())
    msg.header.stamp = stamp_msg(stamp_ns_)
    msg.header.frame_id = frame_id
    return msg


def split_proprio_msg(msg: JointState) -> tuple[np.ndarray, np.ndarray | None]:
    """Layout-agnostic unpack: (proprio float32, command float32 or None); checks names, values."""
    names = list(msg.name)
    if len(names) != len(msg.position):
        raise MessageError(f"proprio message has {len(names)} names but {len(msg.position)} values")
    values = np.asarray(msg.position, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        bad = [n for n, v in zip(names, values) if not math.isfinite(v)]
        raise MessageError(
            f"proprio contains NaN or Inf in {bad[:8]}{'...' if len(bad) > 8 else ''}"
        )
    is_cmd = np.array([n.startswith("command[") for n in names], dtype=bool)
    if is_cmd.any() and not is_cmd[int(np.argmax(is_cmd)) :].all():
        raise MessageError("proprio message: command[i] entries must come after all proprio terms")
    command = values[is_cmd].astype(np.float32) if is_cmd.any() else None
    return values[~is_cmd].astype(np.float32), command


def proprio_from_msg(msg: JointState, spec: RobotSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """Unpack and check the element names against the spec (a layout change is an error)."""
    expected = proprio_names(spec)
    if list(msg.name) != expected:
        got = list(msg.name)
        diff = next(
            (i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
            min(len(got), len(expected)),
        )
        raise MessageError(
            f"{spec.name}: proprio layout differs from the spec at element {diff}: "
            f"got {len(got)} names ({got[diff : diff + 3]}...), "
            f"expected {len(expected)} ({expected[diff : diff + 3]}...)"
        )
    return split_proprio_msg(msg)


# --- standard state messages -------------------------------------------------------------------
def joint_state_msg(names, position, velocity, stamp_ns_: int) -> JointState:
    msg = JointState(name=list(names), position=[float(v) for v in position])
    if velocity is not None:
        msg.velocity = [float(v) for v in velocity]
    msg.header.stamp = stamp_msg(stamp_ns_)
    return msg


def imu_msg(quat_wxyz, gyro, accel, stamp_ns_: int, frame_id: str = "base") -> Imu:
    """Base IMU; `accel=None` marks the acceleration unknown (covariance[0] = -1, per REP 145)."""
    msg = Imu()
    msg.header.stamp = stamp_msg(stamp_ns_)
    msg.header.frame_id = frame_id
    w, x, y, z = (float(v) for v in quat_wxyz)
    msg.orientation.w, msg.orientation.x, msg.orientation.y, msg.orientation.z = w, x, y, z
    msg.angular_velocity.x, msg.angular_velocity.y, msg.angular_velocity.z = (
        float(v) for v in gyro
    )
    if accel is None:
        msg.linear_acceleration_covariance[0] = -1.0
    else:
        msg.linear_acceleration.x, msg.linear_acceleration.y, msg.linear_acceleration.z = (
            float(v) for v in accel
        )
    return msg


def odometry_msg(pos, quat_wxyz, lin_vel_body, ang_vel_body, stamp_ns_: int) -> Odometry:
    msg = Odometry()
    msg.header.stamp = stamp_msg(stamp_ns_)
    msg.header.frame_id = "odom"
    msg.child_frame_id = "base"
    p = msg.pose.pose
    p.position.x, p.position.y, p.position.z = (float(v) for v in pos)
    p.orientation.w, p.orientation.x, p.orientation.y, p.orientation.z = (
        float(v) for v in quat_wxyz
    )
    t = msg.twist.twist
    t.linear.x, t.linear.y, t.linear.z = (float(v) for v in lin_vel_body)
    t.angular.x, t.angular.y, t.angular.z = (float(v) for v in ang_vel_body)
    return msg


def pose_msg(pos, quat_wxyz, stamp_ns_: int, frame_id: str = "base") -> PoseStamped:
    msg = PoseStamped()
    msg.header.stamp = stamp_msg(stamp_ns_)
    msg.header.frame_id = frame_id
    msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in pos)
    o = msg.pose.orientation
    o.w, o.x, o.y, o.z = (float(v) for v in quat_wxyz)
    return msg


def pose_from_msg(msg: PoseStamped) -> tuple[np.ndarray, np.ndarray]:
    p, o = msg.pose.position, msg.pose.orientation
    return np.array([p.x, p.y, p.z]), np.array([o.w, o.x, o.y, o.z])


def episode_msg(**fields) -> String:
    """Per-tick episode status for the recorder (JSON: task, seed, episode, step, reward, ...)."""
    return String(data=json.dumps(fields, sort_keys=True))


# --- commands ----------------------------------------------------------------------------------
def driver_topics(spec: RobotSpec) -> list[str]:
    """The topics a robot driver publishes for `spec` (MuJoCo or hardware), /clock aside: what a
    replay re-publishes so that ingestion and the planner recompute everything after them."""
    topics = ["/joint_states", "/simdist/robot/proprio", "/simdist/episode"]
    topics += [f"/camera/{cam}/image_raw" for cam in spec.cameras]
    return [*topics, *SENSOR_TOPICS[spec.name]]


def action_names(robot: str) -> list[str]:
    """Element names of a robot's action vector (the `joint_names` of a command message)."""
    if robot not in ACTION_NAMES:
        raise MessageError(f"unknown robot {robot!r}; expected one of {sorted(ACTION_NAMES)}")
    return list(ACTION_NAMES[robot])


def command_to_msg(command: Command, names, stamp_ns_: int, period_s: float) -> JointTrajectory:
    msg = JointTrajectory(joint_names=list(names))
    msg.header.stamp = stamp_msg(stamp_ns_)
    msg.header.frame_id = command.kind.value
    values = (
        []
        if command.kind in (CommandKind.HOLD, CommandKind.DAMP)
        else np.asarray(command.values, np.float64).tolist()
    )
    msg.points = [JointTrajectoryPoint(positions=values, time_from_start=duration_msg(period_s))]
    return msg


def command_from_msg(
    msg: JointTrajectory, spec: RobotSpec | None = None, finite: bool = True
) -> Command:
    """JointTrajectory -> Command (first point); MessageError for unknown kinds, sizes and, with
    `finite`, NaN / Inf (the safety supervisor reads without it: its own guard rejects them)."""
    try:
        kind = CommandKind(msg.header.frame_id)
    except ValueError:
        raise MessageError(
            f"command kind {msg.header.frame_id!r} unknown, "
            f"expected one of {[k.value for k in CommandKind]}"
        ) from None
    stamp = stamp_ns(msg.header.stamp) * 1e-9
    if kind in (CommandKind.HOLD, CommandKind.DAMP):
        return Command(kind=kind, stamp=stamp)
    if not msg.points:
        raise MessageError(f"{kind.value} command without points")
    values = np.asarray(msg.points[0].positions, dtype=np.float64)
    if spec is not None and values.shape != (spec.action_dim,):
        raise MessageError(
            f"{spec.name}: command has {values.size} values, expected {spec.action_dim}"
        )
    if finite and not np.all(np.isfinite(values)):
        raise MessageError(f"command contains NaN or Inf: {values.tolist()}")
    return Command(kind=kind, values=values.astype(np.float32), stamp=stamp)


# --- the planner's side: assemble one observation from the aligned topics ----------------------
class ObservationAssembler:
    """Collects `/simdist/observation/*` messages; returns an Observation once a stamp is complete.

    Arrival order does not matter; incomplete stamps older than the newest complete one are
    dropped, and at most `max_pending` stamps are kept.
    """

    def __init__(
        self, cameras, has_height_map: bool, spec: RobotSpec | None = None, max_pending: int = 8
    ):
        self.cameras = tuple(cameras)
        self.has_height_map = has_height_map
        self.spec = spec
        self.max_pending = max_pending
        self._pending: dict[int, dict] = {}

    def _slot(self, stamp: int) -> dict:
        slot = self._pending.setdefault(stamp, {"images": {}})
        while len(self._pending) > self.max_pending:
            del self._pending[min(self._pending)]
        return slot

    def add_proprio(self, msg: JointState) -> Observation | None:
        if self.spec is not None:
            proprio, command = proprio_from_msg(msg, self.spec)
        else:
            proprio, command = split_proprio_msg(msg)
        stamp = stamp_ns(msg.header.stamp)
        self._slot(stamp).update(proprio=proprio, command=command)
        return self._complete(stamp)

    def add_image(self, camera: str, msg: Image) -> Observation | None:
        if camera not in self.cameras:
            raise MessageError(f"unknown camera {camera!r}; expected one of {self.cameras}")
        stamp = stamp_ns(msg.header.stamp)
        self._slot(stamp)["images"][camera] = image_from_msg(msg)
        return self._complete(stamp)

    def add_height_map(self, msg: Image) -> Observation | None:
        stamp = stamp_ns(msg.header.stamp)
        shape = self.spec.height_map_shape if self.spec is not None else None
        self._slot(stamp)["height_map"] = height_map_from_msg(msg, shape)
        return self._complete(stamp)

    def _complete(self, stamp: int) -> Observation | None:
        slot = self._pending.get(stamp)
        if slot is None or "proprio" not in slot or len(slot["images"]) < len(self.cameras):
            return None
        if self.has_height_map and "height_map" not in slot:
            return None
        for old in [s for s in self._pending if s <= stamp]:
            del self._pending[old]
        return Observation(
            stamp=stamp * 1e-9,
            proprio=slot["proprio"],
            images=slot["images"],
            height_map=slot.get("height_map"),
            command=slot["command"],
        )
