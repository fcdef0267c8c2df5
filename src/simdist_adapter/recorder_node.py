"""Episode recorder: every topic of the graph into one rosbag2 MCAP bag per episode.

Topics are discovered continuously and subscribed raw (the CDR bytes on the wire go to the bag
untouched). With `split_episodes` (the MuJoCo robot publishes `/simdist/episode` every tick) a
bag opens when a new episode id appears and is finalised, with task, seed and success in its
metadata, shortly after the next episode starts or when the recorder stops; otherwise one bag
covers the whole run. SIGINT and SIGTERM finalise the open bag before the process exits (only
SIGKILL cannot).
Once every `ready_topics` subscription has matched a publisher and `ready_settle_s` has passed,
`/simdist/recorder/ready` (latched) says so: a lockstep simulator waits for it before its first
tick (DDS discovery under load can take seconds, and the first ticks' actions would otherwise go
unrecorded). The settle covers discovery's other half: our reader matching a writer does not mean
that writer has matched our reader yet, and a volatile writer does not resend what it sent before.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import struct
import time
from typing import Any

import rclpy
from rclpy.clock import Clock, ClockType
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rclpy.subscription import Subscription
from rosbags.interfaces import Nodetype
from std_msgs.msg import Bool

from robot_drivers import ros_msgs
from robot_drivers.described import Param
from robot_drivers.diagnostics import Diagnostics, Level
from robot_drivers.node_params import NodeParams
from simdist_adapter.bags import (
    TYPESTORE,
    BagError,
    EpisodeBagWriter,
    EpisodeMeta,
    ros_type_name,
    unfinalised_bags,
)
from simdist_planner.ros.launch_description import RECORDER_READY_TOPIC

# Deep, reliable queues: a recorder that falls behind must buffer, not drop.
RECORD_QOS = QoSProfile(
    depth=200,
    history=HistoryPolicy.KEEP_LAST,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

PARAMS = (
    Param("bag_dir", "bags", "directory episode bags are written into"),
    Param("task", "", "task name stored in each episode's metadata (the episode topic's wins)"),
    Param("checkpoint", "", "checkpoint the planner ran, stored in the metadata"),
    Param(
        "split_episodes", True, "one bag per /simdist/episode id (false: one bag for the whole run)"
    ),
    Param("exclude_topics", ["/rosout", "/parameter_events"], "topics never recorded"),
    Param(
        "expected_topics",
        [
            "/simdist/episode std_msgs/msg/String",
            "/simdist/robot/proprio sensor_msgs/msg/JointState",
            "/simdist/observation/proprio sensor_msgs/msg/JointState",
            "/simdist/action trajectory_msgs/msg/JointTrajectory",
            "/simdist/plan trajectory_msgs/msg/JointTrajectory",
            "/simdist/values trajectory_msgs/msg/JointTrajectory",
            "/simdist/safe_command trajectory_msgs/msg/JointTrajectory",
            "/simdist/robot/applied_command trajectory_msgs/msg/JointTrajectory",
            "/clock rosgraph_msgs/msg/Clock",
            "/joint_states sensor_msgs/msg/JointState",
        ],
        "'<topic> <type>' subscribed at start-up, before any publisher exists, so their first "
        "messages are kept",
        read_only=True,
    ),
    Param(
        "ready_topics",
        [""],
        "expected topics whose publishers must be matched before /simdist/recorder/ready says true",
        read_only=True,
    ),
    Param(
        "ready_settle_s",
        1.0,
        "after the last ready topic matched, wait this long (wall s) before saying "
        "ready: the publishers' side of discovery may lag ours",
        0.0,
        30.0,
    ),
    Param("discovery_period_s", 0.2, "how often new topics are looked for", 0.01, 10.0),
    Param(
        "flush_period_s",
        1.0,
        "open bags are flushed to disk this often (wall s): a killed recorder loses at most "
        "the messages of this last period (simdist-bag recover rebuilds the rest)",
        0.05,
        60.0,
    ),
    Param(
        "max_bags",
        1000,
        "episode bags one run writes at most; later episodes are not recorded (WARN); 0 = no cap",
        0,
        1_000_000,
    ),
    Param(
        "grace_s",
        1.0,
        "an ended episode's bag stays open this long (wall s) for late messages",
        0.0,
        60.0,
    ),
)
EPISODE_TOPIC = "/simdist/episode"
MAX_HELD = 5000  # messages waiting for their episode; beyond this the oldest are dropped


def bag_name(task: str, episode: int, seed) -> str:
    """Unique, sortable directory name of one episode's bag."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    seed_name = seed if seed is not None else "na"
    return f"{task or 'episode'}_{stamp}_{os.getpid()}_ep{episode:04d}_seed{seed_name}"


def header_stamp_ns(msgtype: str, cdr: bytes) -> int | None:
    """The header stamp of a raw CDR message whose first field is a std_msgs/Header, else None."""
    fields = TYPESTORE.fielddefs[msgtype][1]
    if not fields or fields[0][1] != (Nodetype.NAME, "std_msgs/msg/Header") or len(cdr) < 12:
        return None
    order = "<" if cdr[1] else ">"
    sec, nanosec = struct.unpack_from(order + "iI", cdr, 4)
    return sec * 1_000_000_000 + nanosec


class RecorderNode(Node):
    """Routes each message into the bag of the episode its header stamp belongs to.

    Messages of one tick arrive on separate subscriptions in any order, so a stamped message is
    held until an episode message with a stamp >= its own says which episode that is; an ended
    episode's bag stays open `grace_s` for late messages (the action answering its last tick).
    """

    def __init__(self, **kwargs):
        super().__init__("recorder", **kwargs)
        self.params = NodeParams(self, PARAMS)
        self.diag = Diagnostics(self, hardware_id="recorder")
        self._subscribed: dict[str, str] = {}  # topic -> type ("" = not recordable)
        self._subscriptions_of: dict[str, Subscription] = {}  # topic -> its raw subscription
        self._bags: list[EpisodeBagWriter] = []  # open bags, oldest first; the last is current
        self._starts: dict[int, int] = {}  # id(bag) -> first tick stamp of its episode
        self._closing: dict[int, float] = {}  # id(bag) -> wall time it is finalised at
        # (topic, receive ns, cdr, header ns; None: unstamped, before any episode)
        self._held: list[tuple[str, int, bytes, int | None]] = []
        self._episode_id = None
        self._episode_stamp = -1  # newest tick stamp announced on /simdist/episode
        self.finished: list[pathlib.Path] = []
        self._dropped = 0
        self._flushed_at = time.monotonic()
        self._capped_from: int | None = None  # max_bags reached: nothing stamped >= this is kept
        self.stopped: str | None = None  # why recording stopped for good (a write failed)
        self._expect_topics()
        # the ready topics without a publisher yet; None once ready was published
        self._unmatched: list[str] | None = [t for t in self.params["ready_topics"] if t]
        self._matched_at: float | None = None  # monotonic time the last ready topic matched
        unknown = sorted(set(self._unmatched) - set(self._subscriptions_of))
        if unknown:
            raise ValueError(f"ready_topics {unknown} are not among the recordable expected_topics")
        latched = QoSProfile(
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self._pub_ready = self.create_publisher(Bool, RECORDER_READY_TOPIC, latched)
        steady = Clock(
            clock_type=ClockType.STEADY_TIME
        )  # sim time may stand still (lockstep, replay)
        self.create_timer(self.params["discovery_period_s"], self._discover, clock=steady)
        self.create_timer(0.1, self._housekeeping, clock=steady)
        if not self.params["split_episodes"]:
            self._open(
                EpisodeMeta(task=self.params["task"], checkpoint=self.params["checkpoint"]), start=0
            )
        self.diag.set("recording", Level.OK, "waiting for topics", bag_dir=self.params["bag_dir"])
        crashed = unfinalised_bags(self.params["bag_dir"])
        if crashed:  # a recorder before this one was killed before finalising them
            self.diag.set(
                "unfinalised_bags",
                Level.ERROR,
                f"{len(crashed)} unfinalised bag(s) in {self.params['bag_dir']} (a recorder was "
                f"killed): recover them with simdist-bag recover --all {self.params['bag_dir']}",
                bags=" ".join(p.name for p in crashed),
            )

    def _expect_topics(self) -> None:
        """Subscribe to the graph's known topics now: discovery would miss their first messages."""
        for entry in self.params["expected_topics"]:
            if not entry:
                continue
            topic, _, msgtype = entry.partition(" ")
            if not topic.startswith("/") or not msgtype:
                raise ValueError(
                    f"expected_topics entry {entry!r} must look like '/topic pkg/msg/Type'"
                )
            self._subscribe(topic, msgtype.strip())

    def _discover(self) -> None:
        self.params.apply()
        exclude = set(self.params["exclude_topics"])
        for topic, types in self.get_topic_names_and_types():
            if topic not in self._subscribed and topic not in exclude and types:
                self._subscribe(topic, types[0])

    def _subscribe(self, topic: str, msgtype: str) -> None:
        try:
            msgtype = ros_type_name(msgtype)
            cls = ros_msgs.message_class(msgtype)
        except (BagError, ImportError, AttributeError) as exc:
            self.diag.set("topics", Level.WARN, f"not recording {topic} [{msgtype}]: {exc}")
            self._subscribed[topic] = ""
            return
        self._subscriptions_of[topic] = self.create_subscription(
            cls, topic, lambda data, t=topic: self._on_message(t, data), RECORD_QOS, raw=True
        )
        self._subscribed[topic] = msgtype
        self.get_logger().info(f"recording {topic} [{msgtype}]")

    def _on_message(self, topic: str, data: bytes) -> None:
        if self.stopped:
            return
        try:
            self._record(topic, data)
        except OSError as exc:
            self._io_failed(exc)

    def _io_failed(self, exc: OSError) -> None:
        """A write failed (disk full, file too large, device gone): stop recording for good and
        say so at ERROR; the node stays up, so control goes on. Open bags are finalised if the
        disk still takes their summary, else left for `simdist-bag recover`, which keeps every
        message up to their last flush."""
        self.stopped = f"{type(exc).__name__}: {exc}"
        unfinalised = []
        for bag in list(self._bags):
            try:
                self._finalise(bag)
            except OSError:  # _finalise took it off the open bags before closing it
                unfinalised.append(str(bag.path))
        self._held = []
        hint = (
            f"; unfinalised: {' '.join(unfinalised)} (simdist-bag recover --all "
            f"{self.params['bag_dir']})"
            if unfinalised
            else ""
        )
        self.diag.set(
            "recording",
            Level.ERROR,
            f"recording stopped, a write failed: {self.stopped}{hint}",
            bags=len(self.finished),
        )
        self.get_logger().error(f"recording stopped, a write failed: {self.stopped}{hint}")

    def _record(self, topic: str, data: bytes) -> None:
        received = self.get_clock().now().nanoseconds
        if not self.params["split_episodes"]:
            self._write(self._bags[-1], topic, received, data)
            return
        if topic == EPISODE_TOPIC:
            self._on_episode(data, received)
            return
        stamp = header_stamp_ns(self._subscribed[topic], data)
        if stamp is None or stamp == 0:  # unstamped: belongs to whatever episode runs now
            stamp = self._episode_stamp if self._bags else None
        if stamp is not None and 0 <= stamp <= self._episode_stamp:
            self._route(topic, received, data, stamp)
        else:
            self._held.append((topic, received, data, stamp))
            if (
                len(self._held) > MAX_HELD
            ):  # no episode announced for a long time: keep memory bounded
                self._held.pop(0)
                self._dropped += 1
                self.diag.set("recording", Level.WARN,
                              "no /simdist/episode message routes the held messages "
                              f"(split_episodes is on); dropped {self._dropped}")  # fmt: skip

    def _route(self, topic: str, received: int, data: bytes, stamp: int) -> None:
        """Write into the newest open bag whose episode started at or before `stamp`."""
        if self._capped_from is not None and stamp >= self._capped_from:
            self._dropped += 1  # an episode past max_bags: never filed into an earlier bag
            return
        for bag in reversed(self._bags):
            if self._starts[id(bag)] <= stamp:
                self._write(bag, topic, received, data)
                return
        self._dropped += 1  # older than every open episode: its bag is already finalised

    def _write(self, bag: EpisodeBagWriter, topic: str, received: int, data: bytes) -> None:
        if not bag.has_topic(topic):
            bag.add_topic(topic, self._subscribed[topic])
        bag.write_raw(topic, received, data)

    def _on_episode(self, data: bytes, received: int) -> None:
        """A new episode id opens the next bag, a terminal tick sets success; routes held data."""
        # a std_msgs/String: the typestore builds its message classes at run time (typed object)
        msg: Any = TYPESTORE.deserialize_cdr(data, "std_msgs/msg/String")
        try:
            info = json.loads(msg.data)
            episode, stamp = info["episode"], int(info.get("stamp_ns", received))
        except (ValueError, KeyError, TypeError) as exc:
            self.diag.set("episode", Level.WARN, f"unreadable episode message {msg.data!r}: {exc}")
            return
        new = episode != self._episode_id
        if new:
            if self._bags:  # the ended episode keeps its bag a moment for late messages
                self._closing[id(self._bags[-1])] = time.monotonic() + self.params["grace_s"]
            self._episode_id = episode
            cap = self.params["max_bags"]
            opened = len(self.finished) + len(self._bags)  # bags of this run so far
            if cap and opened >= cap:
                if self._capped_from is None:
                    self._capped_from = stamp
                self.diag.set(
                    "recording",
                    Level.WARN,
                    f"max_bags={cap} episode bags written: episode {episode} and later are "
                    "not recorded",
                    bags=opened,
                )
        if self._capped_from is not None:
            self._episode_stamp = max(self._episode_stamp, stamp)
            self._route_held()
            return
        if new:
            meta = EpisodeMeta(
                task=str(info.get("task") or self.params["task"]),
                seed=info.get("seed"),
                episode=int(episode),
                variant=str(info.get("variant", "")),
                robot=str(info.get("robot", "")),
                checkpoint=self.params["checkpoint"],
            )
            self._open(meta, start=stamp)
        bag = self._bags[-1]
        self._write(bag, EPISODE_TOPIC, received, data)
        if new:  # the ended episode's ticks, then the new one's header, channel and first tick
            for open_bag in self._bags:  # on disk at once, oldest first: a recorder killed
                open_bag.flush()  # before its next flush leaves bags that recover with no gap
        meta = bag.meta
        meta.steps = max(meta.steps, int(info.get("step", 0)))
        if info.get("terminated") or info.get("truncated"):
            meta.success = bool(info.get("success", False))
            meta.extra.update(
                terminated=bool(info.get("terminated")), truncated=bool(info.get("truncated"))
            )
            meta.complete = True
        self._episode_stamp = max(self._episode_stamp, stamp)
        self._route_held()

    def _route_held(self) -> None:
        held, self._held = self._held, []
        for topic, rec, raw, st in held:
            st = self._episode_stamp if st is None else st
            if st <= self._episode_stamp:
                self._route(topic, rec, raw, st)
            else:
                self._held.append((topic, rec, raw, st))

    def _open(self, meta: EpisodeMeta, start: int) -> None:
        path = pathlib.Path(self.params["bag_dir"]) / bag_name(meta.task, meta.episode, meta.seed)
        bag = EpisodeBagWriter(path, meta)
        self._bags.append(bag)
        self._starts[id(bag)] = start
        self.diag.set(
            "recording", Level.OK, f"recording episode {meta.episode} to {path}", bag=str(path)
        )

    def _housekeeping(self) -> None:
        if self._unmatched is not None:
            self._announce_ready()
        if self.stopped:
            return
        try:
            self._flush_and_finalise()
        except OSError as exc:
            self._io_failed(exc)

    def _flush_and_finalise(self) -> None:
        now = time.monotonic()
        if now - self._flushed_at >= self.params["flush_period_s"]:
            self._flushed_at = now
            for bag in self._bags:
                bag.flush()
        for bag in [b for b in self._bags if self._closing.get(id(b), float("inf")) <= now]:
            self._finalise(bag)

    def _announce_ready(self) -> None:
        """Publish ready (once), ready_settle_s after every ready topic has matched a publisher."""
        if self._unmatched is None:
            return  # published already
        self._unmatched = [
            t for t in self._unmatched if self._subscriptions_of[t].get_publisher_count() == 0
        ]
        if self._unmatched:
            self.diag.set("ready", Level.OK, f"waiting for publishers on {self._unmatched}")
            return
        now = time.monotonic()
        if self._matched_at is None:
            self._matched_at = now
        settle = self.params["ready_settle_s"]
        if now - self._matched_at < settle:
            self.diag.set(
                "ready", Level.OK, f"every ready topic has its publisher; settling {settle} s"
            )
            return
        self._pub_ready.publish(Bool(data=True))
        self.diag.set("ready", Level.OK, "every ready topic has its publisher")
        self._unmatched = None

    def _finalise(self, bag: EpisodeBagWriter) -> None:
        self._bags.remove(bag)
        self._closing.pop(id(bag), None)
        self._starts.pop(id(bag), None)
        if not self.params["split_episodes"]:
            bag.meta.complete = True
        bag.close()
        self.finished.append(bag.path)
        self.get_logger().info(
            f"finalised {bag.path} ({bag.message_count} messages, success={bag.meta.success})"
        )
        self.diag.set(
            "recording",
            Level.OK,
            f"finalised {bag.path}",
            bags=len(self.finished),
            dropped=self._dropped,
        )

    def shutdown(self) -> None:
        """Route what is still held into the current episode, then finalise every open bag."""
        if self.stopped:
            return
        try:
            if self._bags:
                for topic, rec, raw, _ in self._held:
                    self._write(self._bags[-1], topic, rec, raw)
            self._held = []
            for bag in list(self._bags):
                self._finalise(bag)
        except OSError as exc:
            self._io_failed(exc)


def main(args=None):
    # Own signal handling: SIGINT/SIGTERM only set a flag, the loop exits and the bag is finalised.
    with rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO):
        stop = []
        signal.signal(signal.SIGINT, lambda *_: stop.append(1))
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        node = RecorderNode()
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        try:
            while not stop and rclpy.ok():
                executor.spin_once(timeout_sec=0.1)
        finally:
            node.shutdown()
            executor.shutdown()
            node.destroy_node()


if __name__ == "__main__":
    main()
