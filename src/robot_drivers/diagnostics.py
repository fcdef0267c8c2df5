"""A small /diagnostics publisher (diagnostic_updater is not on PyPI).

A node keeps named statuses (OK / WARN / ERROR / STALE with key-values) and publishes them as one
DiagnosticArray about once a second on a steady-clock timer (so it keeps reporting while sim time
is paused in lockstep), and at once when a status changes level, so an operator sees a fault
without waiting (a changed message at WARN/ERROR at most 10 times a second). A status set with
`stale_after_s` (one refreshed regularly) is reported STALE when it stops being refreshed.
"""

from __future__ import annotations

import enum
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType
from rclpy.qos import QoSProfile, ReliabilityPolicy


class Level(enum.IntEnum):
    OK = 0
    WARN = 1
    ERROR = 2
    STALE = 3


class Diagnostics:
    """Named health statuses of one node, published on /diagnostics."""

    def __init__(self, node, hardware_id: str = "", period_s: float = 1.0):
        self._node = node
        self._hardware_id = hardware_id
        self._status: dict[str, tuple[Level, str, dict, float, float | None]] = {}
        self._last_push = 0.0
        self._pub = node.create_publisher(
            DiagnosticArray,
            "/diagnostics",
            QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
        )
        self._timer = node.create_timer(
            period_s, self.publish, clock=Clock(clock_type=ClockType.STEADY_TIME)
        )

    def set(
        self, name: str, level: Level, message: str, *, stale_after_s: float | None = None, **values
    ) -> None:
        """Record a status; publishes immediately if its level changed. A status given
        `stale_after_s` (one that should be refreshed regularly) reads STALE when it is not."""
        previous = self._status.get(name)
        now = time.monotonic()
        self._status[name] = (Level(level), message, values, now, stale_after_s)
        changed = previous is None or previous[0] != level
        if (
            previous is not None
            and not changed
            and level >= Level.WARN
            and previous[1] != message
            and now - self._last_push > 0.1
        ):
            self._last_push = (
                now  # a new problem at the same level: show it, at most 10 times a second
            )
            self.publish()
        if changed:
            if level == Level.ERROR:
                self._node.get_logger().error(f"{name}: {message}")
            elif level == Level.WARN:
                self._node.get_logger().warning(f"{name}: {message}")
            self.publish()

    def level(self, name: str) -> Level | None:
        entry = self._status.get(name)
        return None if entry is None else entry[0]

    def message(self, name: str) -> str:
        entry = self._status.get(name)
        return "" if entry is None else entry[1]

    def publish(self) -> None:
        now = time.monotonic()
        msg = DiagnosticArray()
        msg.header.stamp = self._node.get_clock().now().to_msg()
        for name, (level, message, values, updated, stale_after_s) in self._status.items():
            if stale_after_s is not None and now - updated > stale_after_s:
                level, message = (
                    Level.STALE,
                    f"no update for {now - updated:.1f} s (last: {message})",
                )
            msg.status.append(
                DiagnosticStatus(
                    level=bytes([int(level)]),
                    name=f"{self._node.get_name()}: {name}",
                    message=message,
                    hardware_id=self._hardware_id,
                    values=[KeyValue(key=str(k), value=str(v)) for k, v in values.items()],
                )
            )
        self._pub.publish(msg)

    def destroy(self) -> None:
        self._node.destroy_timer(self._timer)


class CommandSourceWatch:
    """Warns on /diagnostics (status `command_source`) while more than one publisher is on a
    robot's command topic: only the safety supervisor should command the robot, and any process
    that joins the ROS domain can publish there (docs/hardware.md). Checked about once a second
    on a steady-clock timer."""

    def __init__(self, node, diag: Diagnostics, topic: str, period_s: float = 1.0):
        self._node, self._diag, self._topic = node, diag, topic
        self._timer = node.create_timer(
            period_s, self.check, clock=Clock(clock_type=ClockType.STEADY_TIME)
        )

    def check(self) -> int:
        """Publishers on the topic now (and the status they imply)."""
        count = self._node.count_publishers(self._topic)
        if count > 1:
            self._diag.set(
                "command_source",
                Level.WARN,
                f"{count} publishers on {self._topic}: only the safety supervisor should "
                "command the robot",
                publishers=count,
            )
        else:
            self._diag.set("command_source", Level.OK, f"{count} publisher on {self._topic}")
        return count


class SourceNodes:
    """Remembers which nodes publish each input topic, so a status about a silent stream names
    the node that went quiet. DDS may list a killed node's publisher until its lease expires, or
    drop it at once; the names seen while the stream was fresh stay either way."""

    def __init__(self, node, topics: dict[str, str]):
        self._node = node
        self._topics = topics  # key (stream name) -> topic
        self._seen: dict[str, list[str]] = {k: [] for k in topics}
        self._asked: dict[str, float] = {}  # key -> monotonic time of the last graph query

    def refresh(self, key: str) -> None:
        """Call while `key`'s stream is fresh (asks the ROS graph at most once a second once it
        knows a name)."""
        now = time.monotonic()
        if self._seen[key] and now - self._asked.get(key, -1.0) < 1.0:
            return  # known names are re-checked once a second; unknown ones at every call
        self._asked[key] = now
        names = sorted(
            f"{i.node_namespace.rstrip('/')}/{i.node_name}"
            for i in self._node.get_publishers_info_by_topic(self._topics[key])
            if not i.node_name.startswith("_NODE_NAME_UNKNOWN")  # its graph info not here yet
        )
        if names:
            self._seen[key] = names

    def describe(self, key: str) -> str:
        names = self._seen[key]
        return f"{self._topics[key]} from {', '.join(names) if names else 'no node seen yet'}"
