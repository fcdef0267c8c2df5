"""Messages of a SimDist graph -> Rerun log calls (no rclpy: live messages and bag messages alike).

`ViewerLogger.log(topic, msg, receive_ns)` takes a message as rclpy delivers it or as
`simdist_adapter.bags.EpisodeBag.messages()` decodes it (both have the same fields), unpacks it
with `robot_drivers.ros_msgs` (the one packing of the project) and logs it on two timelines:
`ros_time`, the message's header stamp (the receive time for unstamped messages; a duration for
sim time, which starts at 1 s, a timestamp for wall-clock time) and `tick`, control periods since
the first stamp seen. It returns the entities it logged, and `counts` keeps rows per entity, so a
test can compare a recording with what went in. Topics it does not show return [].

What is shown (entity paths in `simdist_viewer.layout`): camera images as ingested, as the model
sees them and SimForcing's predicted frames (at the times they predict); the Go2 height map (a
tensor, and points in the world); joint states; the planned chunk (the first action and the
chunk over the horizon; Go2 as joint targets, UR5e with the TCP path it implies) beside the
supervisor's command; predicted reward and value along the plan beside the realised reward;
the safety state (OK / HOLD / DAMP) and its reason; planner latency and fallbacks; diagnostics
level changes; the robot's MuJoCo bodies (optional, `RobotScene`). What the robot's actions mean
comes from its `RobotSpec` (`robot_drivers.specs`): joint-position actions are shown as joint
targets (`default_pose + action_scale * action`), end-effector deltas over their per-step caps
(`action_high`) with the TCP path they imply.
"""

from __future__ import annotations

import functools
import json
from collections import Counter

import numpy as np
import rerun as rr

from robot_drivers import ros_msgs
from robot_drivers.go2.config import Go2Config
from robot_drivers.go2.observation import HEIGHT_SCAN_OFFSET
from robot_drivers.interface import CommandKind
from robot_drivers.specs import robot_spec
from simdist_viewer import layout as L
from simdist_viewer.robot3d import RobotScene

SIM_TIME_LIMIT_NS = 10**15  # stamps below this (11.6 days) are sim time: a duration timeline
SAFETY_STATES = {"hold": "HOLD", "damp": "DAMP"}  # any other command kind is OK
LEVEL_NAMES = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}
TEXT_LEVELS = {0: "INFO", 1: "WARN", 2: "ERROR", 3: "WARN"}
PLANNER_LATENCY_KEYS = ("last_latency_ms", "latency_estimate_ms", "observation_to_action_ms")
PLANNER_COUNT_KEYS = ("policy_fallbacks", "deadline_misses", "failed_plans")


def _level(value) -> int:
    """A DiagnosticStatus level: bytes from rclpy, an int from rosbags."""
    return value[0] if isinstance(value, (bytes, bytearray)) else int(value)


def _float(text: str | None) -> float:
    if text is None:
        return float("nan")
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


class ViewerLogger:
    """Logs one graph's messages to a `RecordingStream`; one instance per recording."""

    def __init__(
        self,
        rec: rr.RecordingStream,
        robot: str,
        cameras=None,
        *,
        scene: RobotScene | None = None,
        image_every_n: int = 1,
    ):
        self.spec = robot_spec(robot)  # ValueError naming the known robots
        self.rec = rec
        self.robot = robot
        self.cameras = tuple(self.spec.cameras if cameras is None else cameras)
        self.period_ns = int(round(L.control_period_s(self.spec) * 1e9))
        self._joint_targets = self.spec.command_kind == CommandKind.JOINT_POSITION
        self._ee_deltas = self.spec.command_kind == CommandKind.EE_DELTA
        # joint targets: target = default pose + action scale * action
        self._default_pose = np.asarray(self.spec.default_pose, np.float64)
        # end-effector deltas: the per-step caps, translation (m) x3, rotation (rad) x3, gripper;
        # the chunk view's scale per element, and the translation cap of the TCP path
        self._step_caps = np.asarray(self.spec.action_high, np.float64)
        self.scene = scene
        self.image_every_n = max(1, int(image_every_n))
        self.counts: Counter = Counter()  # rows logged per entity (static rows not counted)
        self.skipped_images = 0  # images left out by image_every_n
        self.errors: Counter = Counter()  # topic -> messages that could not be unpacked
        self.last_error = ""
        self._origin_ns: int | None = None
        self._duration: bool | None = None
        self._named: set[str] = set()
        self._image_seen: Counter = Counter()
        self._tcp: np.ndarray | None = None
        self._base: tuple[np.ndarray, np.ndarray] | None = None
        self._safety: str | None = None
        self._status: dict[str, tuple[int, str]] = {}
        self._episode = None
        self._static_done = False
        self._handlers = {
            "/joint_states": self._joint_states,
            "/tcp_pose": self._tcp_pose,
            "/odom": self._odom,
            "/height_map": lambda m: self._height_map(m, "raw"),
            "/simdist/observation/height_map": lambda m: self._height_map(m, "model"),
            "/simdist/plan": self._plan,
            "/simdist/values": self._values,
            "/simdist/safe_command": self._safe_command,
            "/simdist/episode": self._episode_msg,
            "/simdist/adapter/status": self._adapter_status,
            "/diagnostics": self._diagnostics,
        }
        for cam in self.cameras:
            for prefix, kind in (
                ("/camera/{}/image_raw", "raw"),
                ("/simdist/observation/image/{}", "model"),
                ("/simdist/predicted_video/{}", "predicted"),
            ):
                self._handlers[prefix.format(cam)] = functools.partial(
                    self._image, camera=cam, kind=kind
                )

    # -- what it shows
    @property
    def topics(self) -> list[str]:
        """Every topic this logger shows (what a node subscribes to, what a bag view reads)."""
        return sorted(self._handlers)

    def topic_types(self) -> dict[str, str]:
        """topic -> ROS type ('pkg/msg/Name')."""
        types = {
            "/joint_states": "sensor_msgs/msg/JointState",
            "/tcp_pose": "geometry_msgs/msg/PoseStamped",
            "/odom": "nav_msgs/msg/Odometry",
            "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray",
            "/simdist/episode": "std_msgs/msg/String",
            "/simdist/adapter/status": "std_msgs/msg/String",
        }
        return {t: types.get(t, self._default_type(t)) for t in self._handlers}

    @staticmethod
    def _default_type(topic: str) -> str:
        if topic.startswith(("/simdist/plan", "/simdist/values", "/simdist/safe_command")):
            return "trajectory_msgs/msg/JointTrajectory"
        return "sensor_msgs/msg/Image"

    def log_static(self) -> None:
        """The robot's geometry (if a scene is given), once."""
        if self.scene is not None and not self._static_done:
            self.scene.log_static(self.rec)
            self.rec.log(L.WORLD, rr.ViewCoordinates.RIGHT_HAND_Z_UP, static=True)
        self._static_done = True

    def log(self, topic: str, msg, receive_ns: int) -> list[str]:
        """Log one message; returns the entities it was logged to ([] if not shown)."""
        handler = self._handlers.get(topic)
        if handler is None:
            return []
        if not self._static_done:
            self.log_static()
        stamp = self._stamp(msg, receive_ns)
        self._set_time(stamp)
        try:
            entities = handler(msg) or []
        except (ros_msgs.MessageError, ValueError, KeyError, TypeError, IndexError) as exc:
            self.errors[topic] += 1
            self.last_error = f"{topic}: {exc}"
            return []
        self.counts.update(entities)
        return entities

    # -- time
    @staticmethod
    def _stamp(msg, receive_ns: int) -> int:
        header = getattr(msg, "header", None)
        if header is not None:
            ns = ros_msgs.stamp_ns(header.stamp)
            if ns > 0:
                return ns
        return int(receive_ns)

    def _set_time(self, stamp_ns: int) -> None:
        if self._origin_ns is None:
            self._origin_ns = stamp_ns
            self._duration = stamp_ns < SIM_TIME_LIMIT_NS
        if self._duration:
            self.rec.set_time(L.ROS_TIME, duration=np.timedelta64(stamp_ns, "ns"))
        else:
            self.rec.set_time(L.ROS_TIME, timestamp=np.datetime64(stamp_ns, "ns"))
        tick = max(0, int(round((stamp_ns - self._origin_ns) / self.period_ns)))
        self.rec.set_time(L.TICK, sequence=tick)

    def _scalars(self, entity: str, values, names) -> str:
        if entity not in self._named:
            self.rec.log(entity, rr.SeriesLines(names=[str(n) for n in names]), static=True)
            self._named.add(entity)
        self.rec.log(entity, rr.Scalars(np.asarray(values, np.float64)))
        return entity

    # -- handlers: each returns the entities it logged
    def _image(self, msg, camera: str, kind: str) -> list[str]:
        key = (camera, kind)
        self._image_seen[key] += 1
        if (self._image_seen[key] - 1) % self.image_every_n:
            self.skipped_images += 1
            return []
        entity = L.camera_entity(camera, kind)
        self.rec.log(entity, rr.Image(ros_msgs.image_from_msg(msg)))
        return [entity]

    def _height_map(self, msg, kind: str) -> list[str]:
        hm = ros_msgs.height_map_from_msg(msg)
        entity = L.height_map_entity(kind)
        self.rec.log(entity, rr.Tensor(hm, dim_names=("x", "y")))
        out = [entity]
        if kind == "raw" and self._base is not None:  # the scan as points under the robot
            self.rec.log(
                L.HEIGHT_MAP_3D, rr.Points3D(self._scan_points(hm, self._base), radii=0.01)
            )
            out.append(L.HEIGHT_MAP_3D)
        return out

    def _scan_points(self, hm: np.ndarray, base: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Height scan (nx, ny) of `base_z - hit_z - offset` -> world points (yaw-aligned grid)
        under the base pose `base` (position, wxyz quaternion)."""
        scan = Go2Config().scan
        nx, ny = hm.shape
        xy = scan.grid_xy().reshape(ny, nx, 2).transpose(1, 0, 2).reshape(-1, 2)
        pos, quat = base
        w, x, y, z = quat
        yaw = np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
        c, s = np.cos(yaw), np.sin(yaw)
        world_xy = pos[:2] + xy @ np.array([[c, s], [-s, c]])
        heights = pos[2] - hm.reshape(-1) - HEIGHT_SCAN_OFFSET
        return np.c_[world_xy, heights]

    def _joint_states(self, msg) -> list[str]:
        names = list(msg.name)
        out = [self._scalars(L.JOINT_POSITION, msg.position, names)]
        if len(msg.velocity) == len(names) and names:
            out.append(self._scalars(L.JOINT_VELOCITY, msg.velocity, names))
        if self.scene is not None:
            self.scene.set_joints(names, msg.position)
            # a fixed base stands where its model puts it; a floating one waits for /odom
            if self.scene.free_qpos is None or self._base is not None:
                out += self.scene.log_poses(self.rec)
        return out

    def _tcp_pose(self, msg) -> list[str]:
        pos, _ = ros_msgs.pose_from_msg(msg)
        self._tcp = pos
        self.rec.log(L.TCP, rr.Points3D([pos], radii=0.01, colors=[[255, 200, 0]]))
        return [L.TCP]

    def _odom(self, msg) -> list[str]:
        p, o = msg.pose.pose.position, msg.pose.pose.orientation
        self._base = (np.array([p.x, p.y, p.z]), np.array([o.w, o.x, o.y, o.z]))
        if self.scene is not None:
            self.scene.set_base(*self._base)
        return []

    def _targets(self, values: np.ndarray) -> np.ndarray:
        """Joint-position actions -> joint targets (rad); other actions as they are."""
        if self._joint_targets and values.shape[-1] == len(self._default_pose):
            return self._default_pose + self.spec.action_scale * values
        return values

    def _plan(self, msg) -> list[str]:
        names = list(msg.joint_names)
        points = [list(p.positions) for p in msg.points if len(p.positions) == len(names)]
        if not points or not names:
            return []
        chunk = self._targets(np.asarray(points, np.float64))  # (T, A)
        out = [self._scalars(L.PLAN_FIRST, chunk[0], names)]
        # x: the horizon scaled to the width of y's range, so one 2-D view shows its shape
        shown, width = self._chunk_display(chunk)
        steps = np.arange(1, len(chunk) + 1, dtype=np.float64) * (width / len(chunk))
        strips = [np.c_[steps, -shown[:, a]] for a in range(shown.shape[1])]  # 2-D y points down
        self.rec.log(L.PLAN_CHUNK, rr.LineStrips2D(strips, labels=names))
        out.append(L.PLAN_CHUNK)
        if self._ee_deltas and self._tcp is not None and chunk.shape[1] >= 3:
            steps3 = chunk[:, :3]
            norms = np.linalg.norm(steps3, axis=1, keepdims=True)
            max_step = self._step_caps[0]  # m: the controller clips a step's translation norm
            steps3 = steps3 * np.minimum(1.0, max_step / np.maximum(norms, 1e-12))
            path = np.vstack([self._tcp, self._tcp + np.cumsum(steps3, axis=0)])
            self.rec.log(L.TCP_PATH, rr.LineStrips3D([path], colors=[[0, 200, 255]], radii=0.003))
            out.append(L.TCP_PATH)
        return out

    def _chunk_display(self, chunk: np.ndarray) -> tuple[np.ndarray, float]:
        """End-effector deltas: each element over its per-step cap (translation, rotation,
        gripper); joint targets in rad. Returns the values and the x extent of the horizon."""
        if self._ee_deltas and chunk.shape[1] == len(self._step_caps):
            return chunk / self._step_caps, 2.0
        return chunk, 4.0

    def _values(self, msg) -> list[str]:
        names = list(msg.joint_names)
        if "reward" not in names or "value" not in names or not msg.points:
            return []
        rv = np.asarray([list(p.positions) for p in msg.points], np.float64)
        r, v = rv[:, names.index("reward")], rv[:, names.index("value")]
        out = [self._scalars(L.VALUES_PREDICTED, [r[0], v[0]], ["predicted reward", "value"])]
        steps = np.arange(len(rv), dtype=np.float64)
        self.rec.log(  # 2-D views point y down: negated, so higher is up
            L.VALUES_ALONG_PLAN,
            rr.LineStrips2D([np.c_[steps, -r], np.c_[steps + 1, -v]], labels=["r^", "v^"]),
        )
        return out + [L.VALUES_ALONG_PLAN]

    def _safe_command(self, msg) -> list[str]:
        kind = str(msg.header.frame_id)
        state = SAFETY_STATES.get(kind, "OK")
        out = []
        if state != self._safety:
            self._safety = state
            self.rec.log(L.SAFETY_STATE, rr.StateChange(state=state))
            out.append(L.SAFETY_STATE)
        names = list(msg.joint_names)
        if state == "OK" and msg.points and len(msg.points[0].positions) == len(names):
            values = self._targets(np.asarray(msg.points[0].positions, np.float64))
            out.append(self._scalars(L.COMMAND, values, names))
        return out

    def _episode_msg(self, msg) -> list[str]:
        info = json.loads(msg.data)
        out = []
        if "reward" in info:
            out.append(self._scalars(L.VALUES_REALISED, [float(info["reward"])], ["reward"]))
        episode = info.get("episode")
        if episode != self._episode:
            self._episode = episode
            text = f"episode {episode} ({info.get('task', '')}, seed {info.get('seed')}) starts"
            self.rec.log(L.EPISODE_EVENTS, rr.TextLog(text, level="INFO"))
            out.append(L.EPISODE_EVENTS)
        if info.get("terminated") or info.get("truncated"):
            ok = bool(info.get("success"))
            text = f"episode {episode} ends after {info.get('step')} steps, success={ok}"
            self.rec.log(L.EPISODE_EVENTS, rr.TextLog(text, level="INFO" if ok else "WARN"))
            out.append(L.EPISODE_EVENTS)
        return out

    def _adapter_status(self, msg) -> list[str]:
        info = json.loads(msg.data)
        state = str(info.get("state", ""))
        fields = ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("state", "stamp"))
        entity = f"{L.ADAPTATION}/status"
        self.rec.log(entity, rr.TextLog(f"{state}: {fields}", level="INFO"))
        out = [entity]
        if info.get("heldout_candidate") is not None and info.get("heldout_deployed") is not None:
            out.append(
                self._scalars(
                    f"{L.ADAPTATION}/heldout_latent_loss",
                    [float(info["heldout_deployed"]), float(info["heldout_candidate"])],
                    ["deployed", "candidate"],
                )
            )
        return out

    def _diagnostics(self, msg) -> list[str]:
        out = []
        for status in msg.status:
            name, level, text = str(status.name), _level(status.level), str(status.message)
            values = {kv.key: kv.value for kv in status.values}
            node = name.split(":", 1)[0].strip() or "unknown"
            if self._status.get(name) != (level, text):
                self._status[name] = (level, text)
                entity = f"{L.DIAGNOSTICS}/{node}"
                self.rec.log(
                    entity,
                    rr.TextLog(f"[{LEVEL_NAMES.get(level, level)}] {name}: {text}",
                               level=TEXT_LEVELS.get(level, "INFO")),
                )  # fmt: skip
                out.append(entity)
                if name == "safety_supervisor: command":
                    self.rec.log(L.SAFETY_REASON, rr.TextLog(text, level=TEXT_LEVELS.get(level)))
                    out.append(L.SAFETY_REASON)
            if name == "planner: planning" and "last_latency_ms" in values:
                out.append(
                    self._scalars(
                        L.PLANNER_LATENCY,
                        [_float(values.get(k)) for k in PLANNER_LATENCY_KEYS],
                        PLANNER_LATENCY_KEYS,
                    )
                )
                out.append(
                    self._scalars(
                        L.PLANNER_COUNTS,
                        [_float(values.get(k)) for k in PLANNER_COUNT_KEYS],
                        PLANNER_COUNT_KEYS,
                    )
                )
        return out
