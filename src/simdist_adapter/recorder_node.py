"""Episode recorder: every topic of the graph into one rosbag2 MCAP bag per episode.

Topics are discovered continuously and subscribed raw (the CDR bytes on the wire go to the bag
untouched). With `split_episodes` (the MuJoCo robot publishes `/simdist/episode` every tick) a
bag opens when a new episode id appears and is finalised, with task, seed and success in its
metadata, when the next episode starts or the recorder stops; otherwise one bag covers the whole
run. SIGINT and SIGTERM finalise the open bag before the process exits (only SIGKILL cannot).
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import time

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions

from robot_drivers.diagnostics import Diagnostics, Level
from robot_drivers.node_params import NodeParams, Param
from simdist_adapter.bags import TYPESTORE, BagError, EpisodeBagWriter, EpisodeMeta, ros_type_name

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
    Param("split_episodes", True, "one bag per /simdist/episode id (false: one bag for the whole run)"),
    Param("exclude_topics", ["/rosout", "/parameter_events"], "topics never recorded"),
    Param("discovery_period_s", 0.2, "how often new topics are looked for", 0.01, 10.0),
)
EPISODE_TOPIC = "/simdist/episode"


def bag_name(task: str, episode: int, seed) -> str:
    """Unique, sortable directory name of one episode's bag."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{task or 'episode'}_{stamp}_{os.getpid()}_ep{episode:04d}_seed{seed if seed is not None else 'na'}"


class RecorderNode(Node):
    def __init__(self, **kwargs):
        super().__init__("recorder", **kwargs)
        self.params = NodeParams(self, PARAMS)
        self.diag = Diagnostics(self, hardware_id="recorder")
        self._subscribed: dict[str, str] = {}  # topic -> type
        self._bag: EpisodeBagWriter | None = None
        self._episode_id = None
        self.finished: list[pathlib.Path] = []
        self._dropped = 0
        self.create_timer(self.params["discovery_period_s"], self._discover)
        if not self.params["split_episodes"]:
            self._open(EpisodeMeta(task=self.params["task"], checkpoint=self.params["checkpoint"]))
        self.diag.set("recording", Level.OK, "waiting for topics", bag_dir=self.params["bag_dir"])

    def _discover(self) -> None:
        self.params.apply()
        exclude = set(self.params["exclude_topics"])
        for topic, types in self.get_topic_names_and_types():
            if topic in self._subscribed or topic in exclude or not types:
                continue
            try:
                msgtype = ros_type_name(types[0])
            except BagError as exc:
                self.diag.set("topics", Level.WARN, f"not recording {topic}: {exc}")
                self._subscribed[topic] = ""
                continue
            cls = _message_class(msgtype)
            self.create_subscription(cls, topic, lambda data, t=topic: self._on_message(t, data), RECORD_QOS, raw=True)
            self._subscribed[topic] = msgtype
            self.get_logger().info(f"recording {topic} [{msgtype}]")

    def _on_message(self, topic: str, data: bytes) -> None:
        stamp = self.get_clock().now().nanoseconds
        if topic == EPISODE_TOPIC and self.params["split_episodes"]:
            self._on_episode(data, stamp)
        if self._bag is None:
            self._dropped += 1
            return
        if not self._bag.has_topic(topic):
            self._bag.add_topic(topic, self._subscribed[topic])
        self._bag.write_raw(topic, stamp, data)

    def _on_episode(self, data: bytes, stamp: int) -> None:
        """A new episode id closes the running bag and opens the next one; a terminal tick sets success."""
        msg = TYPESTORE.deserialize_cdr(data, "std_msgs/msg/String")
        try:
            info = json.loads(msg.data)
            episode = info["episode"]
        except (ValueError, KeyError, TypeError) as exc:
            self.diag.set("episode", Level.WARN, f"unreadable episode message {msg.data!r}: {exc}")
            return
        if episode != self._episode_id:
            self._close()
            self._episode_id = episode
            self._open(
                EpisodeMeta(
                    task=str(info.get("task") or self.params["task"]),
                    seed=info.get("seed"),
                    episode=int(episode),
                    variant=str(info.get("variant", "")),
                    robot=str(info.get("robot", "")),
                    checkpoint=self.params["checkpoint"],
                )
            )
        meta = self._bag.meta
        meta.steps = max(meta.steps, int(info.get("step", 0)))
        if info.get("terminated") or info.get("truncated"):
            meta.success = bool(info.get("success", False))
            meta.extra.update(terminated=bool(info.get("terminated")), truncated=bool(info.get("truncated")))
            meta.complete = True

    def _open(self, meta: EpisodeMeta) -> None:
        path = pathlib.Path(self.params["bag_dir"]) / bag_name(meta.task, meta.episode, meta.seed)
        self._bag = EpisodeBagWriter(path, meta)
        self.diag.set("recording", Level.OK, f"recording episode {meta.episode} to {path}", bag=str(path))

    def _close(self) -> None:
        """Finalise the open bag (idempotent)."""
        bag, self._bag = self._bag, None
        if bag is None:
            return
        if not self.params["split_episodes"]:
            bag.meta.complete = True
        bag.close()
        self.finished.append(bag.path)
        self.get_logger().info(f"finalised {bag.path} ({bag.message_count} messages, success={bag.meta.success})")
        self.diag.set("recording", Level.OK, f"finalised {bag.path}", bags=len(self.finished), dropped=self._dropped)

    def shutdown(self) -> None:
        self._close()


def _message_class(msgtype: str):
    """The rclpy message class of 'pkg/msg/Name'."""
    import importlib

    pkg, _, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.msg"), name)


def main(args=None):
    # Own signal handling: SIGINT/SIGTERM only set a flag, the loop exits and the bag is finalised.
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
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
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
