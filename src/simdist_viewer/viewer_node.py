"""Viewer node: the graph's topics, live, in Rerun (docs/viewer.md). Off the control path.

It only subscribes (best effort, so no publisher ever waits for it), and its callbacks only put
the message on a bounded queue: one logging thread turns messages into Rerun log calls
(`core.ViewerLogger`) on the ROS clock (`use_sim_time` respected: header stamps first, the node
clock for unstamped messages). When the queue is full the oldest message is dropped and counted;
`/diagnostics` (status `viewer: queue`) reports received, logged, dropped and skipped counts.
Nothing in the graph depends on this node.

The view goes to a gRPC server a native viewer connects to (`mode` grpc:
`rerun rerun+http://localhost:9876/proxy`), to that server plus a web viewer (`web`,
http://localhost:<web_port>), to a spawned native viewer (`spawn`), or nowhere (`none`); and,
with `recording`, also into an .rrd file (finalised when the node stops).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, deque

import rclpy
import rerun as rr
from rclpy.clock import Clock, ClockType
from rclpy.exceptions import InvalidParameterValueException
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rerun.sinks import LogSinkLike

from robot_drivers import ros_msgs
from robot_drivers.described import Param
from robot_drivers.diagnostics import Diagnostics, Level
from robot_drivers.node_params import NodeParams
from robot_drivers.node_spin import spin_until_shutdown
from simdist_planner.ros.launch_description import GRAPHS
from simdist_viewer import layout as L
from simdist_viewer.core import ViewerLogger
from simdist_viewer.robot3d import RobotScene
from simdist_viewer.serve import LOCAL_BIND, WebViewerServer, check_bind, grpc_server, spawn_viewer

MODES = ("grpc", "web", "spawn", "none")
PARAMS = (
    Param(
        "graph",
        "peg",
        "graph whose topics are shown, with its layout",
        read_only=True,
        choices=tuple(GRAPHS),
    ),
    Param(
        "cameras",
        ["auto"],
        "cameras shown; ['auto'] = the graph robot's cameras, [''] = none",
        read_only=True,
    ),
    Param(
        "mode",
        "grpc",
        "grpc: serve the view on grpc_port for a native viewer; web: also serve the web viewer "
        "on web_port; spawn: start a native viewer; none: only the recording",
        read_only=True,
        choices=MODES,
    ),
    Param("recording", "", ".rrd file the view is also written to ('' = none)", read_only=True),
    Param("grpc_port", 9876, "gRPC port of the view (modes grpc, web, spawn)", 1024, 65535, True),
    Param("web_port", 9090, "HTTP port of the web viewer (mode web)", 1024, 65535, True),
    Param(
        "bind",
        LOCAL_BIND,
        "IP address the gRPC and web servers listen on: 127.0.0.1 this machine only, "
        "0.0.0.0 every interface",
        read_only=True,
    ),
    Param(
        "queue_size",
        256,
        "messages waiting for the logging thread; when full the oldest is dropped (counted)",
        1,
        100_000,
        True,
    ),
    Param("image_every_n", 1, "log every n-th image of each image topic", 1, 1000),
    Param("robot_3d", True, "show the robot's MuJoCo bodies in 3D", read_only=True),
)
QOS = QoSProfile(
    depth=10,
    history=HistoryPolicy.KEEP_LAST,
    reliability=ReliabilityPolicy.BEST_EFFORT,  # a publisher never waits for the viewer
    durability=DurabilityPolicy.VOLATILE,
)
IMAGE_TOPICS = ("/camera/", "/simdist/observation/image/", "/simdist/predicted_video/")


def _check(name: str, value, values: dict) -> str | None:
    return check_bind(value) if name == "bind" else None


class ViewerNode(Node):
    """Subscribes to the graph's topics and logs them to Rerun from one thread."""

    def __init__(self, **kwargs):
        super().__init__("viewer", **kwargs)
        self.params = NodeParams(self, PARAMS, _check)
        self.web: WebViewerServer | None = None
        p = self.params.values
        graph = p["graph"]
        robot = L.graph_robot(graph)
        cameras = None if list(p["cameras"]) == ["auto"] else [c for c in p["cameras"] if c]
        self.rec = rr.RecordingStream(
            L.APPLICATION_ID, recording_id=f"{graph}-{os.getpid()}-{time.time_ns()}"
        )
        self.uri = self._connect(L.blueprint(graph, cameras))
        scene = RobotScene(robot) if p["robot_3d"] else None
        self.logger = ViewerLogger(self.rec, robot, cameras, scene=scene)
        self.logger.log_static()
        self.received: Counter = Counter()  # per topic, what the callbacks got
        self.dropped = 0
        self.skipped_images = 0
        self.logged = 0
        self.failed = 0
        self._image_counts: Counter = Counter()
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._busy = False
        for topic, msgtype in self.logger.topic_types().items():
            self.create_subscription(
                ros_msgs.message_class(msgtype), topic, lambda m, t=topic: self._enqueue(t, m), QOS
            )
        self.diag = Diagnostics(self, hardware_id="viewer")
        self.diag.set("view", Level.OK, f"graph {graph}, mode {p['mode']}", uri=self.uri,
                      recording=p["recording"])  # fmt: skip
        self._report()
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(1.0, self._report, clock=steady)
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="rerun-logger", daemon=True
        )
        self._thread.start()

    def _connect(self, blueprint) -> str:
        """Attach the sinks the parameters ask for; returns where a viewer connects ('' none)."""
        p = self.params.values
        sinks: list[LogSinkLike] = []
        uri = ""
        if p["recording"]:
            sinks.append(rr.FileSink(p["recording"]))
        if p["mode"] in ("grpc", "web"):
            server, uri = grpc_server(p["bind"], p["grpc_port"])
            sinks.append(server)
        elif p["mode"] == "spawn":
            uri = spawn_viewer(p["bind"], p["grpc_port"])
            sinks.append(rr.GrpcSink(uri))
        if sinks:
            self.rec.set_sinks(*sinks, default_blueprint=blueprint)
        if p["mode"] == "web":
            self.web = WebViewerServer(p["bind"], p["web_port"], uri)
            self.get_logger().info(f"web viewer: {self.web.url}")
        elif uri:
            self.get_logger().info(f"view: rerun {uri}")
        return uri

    # -- executor thread: never blocks
    def _enqueue(self, topic: str, msg) -> None:
        self.received[topic] += 1
        if topic.startswith(IMAGE_TOPICS):
            self._image_counts[topic] += 1
            if (self._image_counts[topic] - 1) % self.params["image_every_n"]:
                self.skipped_images += 1
                return
        now = self.get_clock().now().nanoseconds
        with self._cond:
            if len(self._queue) >= self.params["queue_size"]:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append((topic, msg, now))
            self._cond.notify()

    def _report(self) -> None:
        self.params.apply()
        level = Level.WARN if self.dropped else Level.OK
        text = (
            "logging to Rerun"
            if not self.dropped
            else "the logging thread fell behind: oldest messages dropped"
        )
        self.diag.set(
            "queue",
            level,
            text,
            received=sum(self.received.values()),
            logged=self.logged,
            dropped=self.dropped,
            queued=len(self._queue),
            skipped_images=self.skipped_images,
            failed=self.failed + sum(self.logger.errors.values()),
        )

    # -- logging thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait(0.5)
                if not self._queue:
                    return  # stopped and drained
                topic, msg, now = self._queue.popleft()
                self._busy = True
            try:
                self.logger.log(topic, msg, now)
                self.logged += 1
            except Exception as exc:  # noqa: BLE001 - a bad message must not end the view
                self.failed += 1
                self.get_logger().warning(f"cannot log {topic}: {exc}", throttle_duration_sec=5)
            finally:
                self._busy = False

    def idle(self) -> bool:
        """Nothing queued and nothing being logged."""
        with self._cond:
            return not self._queue and not self._busy

    def close(self) -> None:
        """Log what is queued, stop the thread, finalise the recording. Idempotent."""
        thread = getattr(self, "_thread", None)
        if thread is None:  # closed, or __init__ failed before it
            return
        with self._cond:
            self._stop = True
            self._cond.notify()
        thread.join(timeout=30)
        self._thread = None
        self.rec.flush()
        self.rec.disconnect()
        if self.web is not None:
            self.web.close()

    def destroy_node(self):
        self.close()
        return super().destroy_node()


def main(args=None):
    with rclpy.init(args=args):
        try:
            node = ViewerNode()
        except (ValueError, InvalidParameterValueException) as exc:  # one line, no traceback
            print(exc, flush=True)
            raise SystemExit(1) from None
        spin_until_shutdown(node)


if __name__ == "__main__":
    main()
