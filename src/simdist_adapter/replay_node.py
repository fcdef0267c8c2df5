"""Replay: publish a recorded episode bag at real time (or `rate` x real time) with `/clock`.

Messages go out as the recorded CDR bytes, in recorded order, spaced by their recorded receive
times divided by `rate`; before each new time `/clock` is published with the bag time, so nodes
with `use_sim_time` (ingestion, planner) run on the logged timeline: open-loop evaluation on
real data. `topics` / `exclude_topics` choose what is replayed. The graphs' parameter files list
the driver's topics (`robot_drivers.ros_msgs.driver_topics`), so ingestion and the planner
recompute everything after them and no recorded action is published on top of theirs; a listed
topic the bag lacks (a hardware bag has no `/simdist/episode`) is skipped with a warning, and a
list of which the bag has none is an error. Messages come in time order; a jump forward in bag
time by more than `max_gap_s` (a bag cut from two runs) is replayed on from the new time at once
and reported (WARN) instead of waited out; the nodes on /clock see the jump. The node exits 0
when the bag is done (the launcher then stops the graph).

With `answer_topic` set (the graphs set `/simdist/action`), replay runs in lockstep instead of
at `rate`: after a tick's message on `tick_topic` (the driver's proprio, which completes a tick)
it publishes nothing of a later time until a message on `answer_topic` carries that tick's
stamp, so a planner slower than the recording answers every observation, as it did live, on any
machine. While it waits it publishes the tick's messages again every `answer_republish_s` (with
their /clock), as the lockstep simulator does for late joiners: a subscriber whose DDS match came
after the first copy still gets the tick. An answer that does not come within
`answer_timeout_s` is reported (WARN, counted) and replay goes on. The bag's last tick is not
waited for (the episode's end goes unanswered live). A bag without `tick_topic` is replayed at
`rate`, with a warning.
"""

from __future__ import annotations

import os
import sys
import time

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.described import Param
from robot_drivers.diagnostics import Diagnostics, Level
from robot_drivers.node_params import NodeParams
from simdist_adapter.bags import BagError, EpisodeBag

QOS = QoSProfile(
    depth=100,
    history=HistoryPolicy.KEEP_LAST,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

PARAMS = (
    Param("bag", "", "episode bag directory to replay", read_only=True),
    Param("rate", 1.0, "playback speed: 1 = real time, 2 = twice as fast", 0.01, 100.0),
    Param(
        "topics",
        [""],
        "topics to replay (empty: all recorded topics; the graphs replay the driver's)",
        read_only=True,
    ),
    Param(
        "exclude_topics",
        ["/clock", "/rosout", "/parameter_events", "/diagnostics"],
        "recorded topics not replayed",
        read_only=True,
    ),
    Param("publish_clock", True, "publish /clock with the bag time"),
    Param(
        "max_gap_s",
        1.0,
        "a step in bag time larger than this (s) is a clock jump: replay goes on from the new "
        "time at once (WARN, counted) instead of waiting it out",
        0.0,
        3600.0,
    ),
    Param(
        "answer_topic",
        "",
        "lockstep: wait for a JointTrajectory stamped with each tick before replaying on "
        "(empty: replay at rate, not waiting)",
        read_only=True,
    ),
    Param(
        "tick_topic",
        "/simdist/robot/proprio",
        "lockstep: the JointState topic whose message completes a tick (its stamp is answered)",
        read_only=True,
    ),
    Param(
        "answer_timeout_s",
        10.0,
        "lockstep: longest wait for a tick's answer (then WARN, counted, and replay goes on)",
        0.1,
        600.0,
    ),
    Param(
        "answer_republish_s",
        1.0,
        "lockstep: publish the waiting tick's messages again this often (late joiners)",
        0.05,
        60.0,
    ),
    Param(
        "start_delay_s",
        1.0,
        "wall time to wait before the first message (after wait_for_subscribers)",
        0.0,
        60.0,
    ),
    Param(
        "wait_for_subscribers",
        [""],
        "'<topic>' or '<topic>@<node>': must have a subscriber (that node) before playing, "
        "up to wait_timeout_s",
        read_only=True,
    ),
    Param(
        "wait_for_ready",
        "",
        "latched std_msgs/Bool topic that must say true before playing (the launch description "
        "sets the recorder's when recording), up to wait_timeout_s; '' = do not wait",
        read_only=True,
    ),
    Param(
        "wait_timeout_s",
        60.0,
        "longest wait for wait_for_subscribers; then replay fails",
        0.0,
        600.0,
    ),
)


class ReplayNode(Node):
    def __init__(self, **kwargs):
        super().__init__("replay", **kwargs)
        self.params = NodeParams(self, PARAMS)
        self.diag = Diagnostics(self, hardware_id="replay")
        if not self.params["bag"]:
            raise ValueError("parameter 'bag' is required: the episode bag directory to replay")
        self.bag = EpisodeBag(self.params["bag"])
        listed = [t for t in self.params["topics"] if t]
        wanted = [t for t in listed if t in self.bag.topics] if listed else list(self.bag.topics)
        if listed and not wanted:
            raise ValueError(
                f"none of the topics {listed} is in {self.bag.path} "
                f"(it has {sorted(self.bag.topics)})"
            )
        missing = sorted(set(listed) - set(wanted))
        if missing:
            self.get_logger().warning(f"{self.bag.path} has no {missing}; replaying the rest")
        self.topics = [t for t in wanted if t not in set(self.params["exclude_topics"])]
        self._pubs = {
            t: self.create_publisher(ros_msgs.message_class(self.bag.topics[t]), t, QOS)
            for t in self.topics
        }
        self._clock_pub = self.create_publisher(Clock, "/clock", QOS)
        self.published = 0
        self.clock_jumps = 0
        self.unanswered = 0  # lockstep: ticks whose answer did not come in answer_timeout_s
        self._period_s = None
        self._answered: set[int] = set()  # lockstep: stamps the answer topic carried
        self._ready = not self.params["wait_for_ready"]
        if not self._ready:
            latched = QoSProfile(
                depth=1,
                reliability=ReliabilityPolicy.RELIABLE,
                durability=DurabilityPolicy.TRANSIENT_LOCAL,
            )
            self.create_subscription(Bool, self.params["wait_for_ready"], self._on_ready, latched)
        self.lockstep = bool(self.params["answer_topic"])
        if self.lockstep:
            self.create_subscription(
                JointTrajectory,
                self.params["answer_topic"],
                lambda m: self._answered.add(ros_msgs.stamp_ns(m.header.stamp)),
                QOS,
            )
            tick = self.params["tick_topic"]
            replayed = tick in self.topics
            self._ticks = sum(1 for _ in self.bag.raw_messages([tick])) if replayed else 0
            if not self._ticks:
                self.lockstep = False
                self.get_logger().warning(
                    f"{self.bag.path} has no {tick} to answer: replaying at rate, not in lockstep"
                )

    def period_s(self) -> float:
        """The bag's usual message spacing (median of the first 100 gaps), paced after a jump."""
        if self._period_s is None:
            stamps = [m.stamp_ns for _, m in zip(range(101), self.bag.raw_messages(self.topics))]
            gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]) if b > a)
            self._period_s = gaps[len(gaps) // 2] * 1e-9 / self.params["rate"] if gaps else 0.0
        return self._period_s

    def play(self, should_stop=lambda: False) -> int:
        """Publish the bag; returns how many messages went out."""
        self._wait_for_subscribers(should_stop)
        time.sleep(self.params["start_delay_s"])
        anchor_ns, start_wall, last_clock = None, time.monotonic(), None
        previous_ns: int | None = None
        pending: tuple[int, int] | None = None  # lockstep: (bag time, stamp) of the open tick
        tick_msgs: list = []  # lockstep: the messages of the newest bag time (republished)
        ticks_seen = 0
        for msg in self.bag.raw_messages(self.topics):
            if should_stop():
                break
            rclpy.spin_once(self, timeout_sec=0.0)  # parameter sets (rate) and services stay live
            self.params.apply()
            if pending is not None and msg.stamp_ns > pending[0]:
                self._await_answer(pending[1], tick_msgs, should_stop)
                pending = None
                anchor_ns, start_wall = msg.stamp_ns, time.monotonic()  # no catching up
            gap = None if previous_ns is None else (msg.stamp_ns - previous_ns) * 1e-9
            if anchor_ns is None or gap > self.params["max_gap_s"]:
                # The bag's time jumps: replay on from here without the long wait; nodes on
                # /clock see the jump.
                if anchor_ns is not None:
                    self.clock_jumps += 1
                    self.diag.set(
                        "clock",
                        Level.WARN,
                        f"bag time jumped {gap:+.3f} s at {msg.stamp_ns} ns (max_gap_s="
                        f"{self.params['max_gap_s']}): replaying on from there",
                        jumps=self.clock_jumps,
                    )
                anchor_ns = msg.stamp_ns
                start_wall = time.monotonic() + (0.0 if gap is None else self.period_s())
            previous_ns = msg.stamp_ns
            due = start_wall + (msg.stamp_ns - anchor_ns) * 1e-9 / self.params["rate"]
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if msg.stamp_ns != last_clock:
                tick_msgs = []
            tick_msgs.append(msg)
            if self.params["publish_clock"] and msg.stamp_ns != last_clock:
                self._clock_pub.publish(self._clock_msg(msg.stamp_ns))
            last_clock = msg.stamp_ns
            self._pubs[msg.topic].publish(msg.data)
            self.published += 1
            if self.lockstep and msg.topic == self.params["tick_topic"]:
                ticks_seen += 1
                if ticks_seen < self._ticks:  # the last tick goes unanswered live
                    stamp = deserialize_message(msg.data, JointState).header.stamp
                    pending = (msg.stamp_ns, ros_msgs.stamp_ns(stamp))
        self.diag.set(
            "replay", Level.OK, f"replayed {self.published} messages from {self.bag.path}"
        )
        return self.published

    @staticmethod
    def _clock_msg(stamp_ns: int) -> Clock:
        clock = Clock()
        clock.clock.sec, clock.clock.nanosec = divmod(stamp_ns, 1_000_000_000)
        return clock

    def _await_answer(self, stamp: int, tick_msgs: list, should_stop) -> None:
        """Lockstep: spin until the answer topic carries `stamp` or answer_timeout_s passes,
        publishing the tick's messages `tick_msgs` again every answer_republish_s."""
        start = time.monotonic()
        deadline, again = start + self.params["answer_timeout_s"], start
        while stamp not in self._answered and not should_stop():
            if time.monotonic() - again >= self.params["answer_republish_s"]:
                again = time.monotonic()
                if self.params["publish_clock"] and tick_msgs:
                    self._clock_pub.publish(self._clock_msg(tick_msgs[0].stamp_ns))
                for msg in tick_msgs:
                    self._pubs[msg.topic].publish(msg.data)
            if time.monotonic() > deadline:
                self.unanswered += 1
                self.diag.set(
                    "lockstep",
                    Level.WARN,
                    f"no answer on {self.params['answer_topic']} to the tick stamped {stamp} ns "
                    f"in {self.params['answer_timeout_s']} s: replaying on",
                    unanswered=self.unanswered,
                )
                return
            rclpy.spin_once(self, timeout_sec=0.01)
        self._answered.discard(stamp)

    def _subscribed(self, topic: str, node: str) -> bool:
        names = [info.node_name for info in self.get_subscriptions_info_by_topic(topic)]
        return node in names if node else bool(names)

    def _on_ready(self, msg: Bool) -> None:
        self._ready = self._ready or bool(msg.data)

    def _wait_for_subscribers(self, should_stop) -> None:
        """Until every wait_for_subscribers entry has its subscriber and wait_for_ready said
        true (a recorder that would otherwise miss the first ticks), up to wait_timeout_s."""
        wanted = [
            entry.partition("@")[::2] for entry in self.params["wait_for_subscribers"] if entry
        ]
        deadline = time.monotonic() + self.params["wait_timeout_s"]
        while not should_stop():
            missing = [f"{t}@{n}" if n else t for t, n in wanted if not self._subscribed(t, n)]
            if not self._ready:
                missing.append(f"true on {self.params['wait_for_ready']}")
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"still waiting for {missing} after {self.params['wait_timeout_s']} s"
                )
            rclpy.spin_once(self, timeout_sec=0.05)


def main(args=None):
    with rclpy.init(args=args):
        node = None
        try:
            node = ReplayNode()
            node.play(should_stop=lambda: not rclpy.ok())
            time.sleep(0.5)  # let reliable publishers flush to slow subscribers
        except (KeyboardInterrupt, ExternalShutdownException):
            pass
        except (
            BagError,
            ValueError,
        ) as exc:  # a bad bag or setting: one line (SIMDIST_DEBUG=1: trace)
            if os.environ.get("SIMDIST_DEBUG"):
                raise
            print(f"replay: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
        finally:
            if node is not None:
                node.bag.close()
                node.destroy_node()


if __name__ == "__main__":
    main()
