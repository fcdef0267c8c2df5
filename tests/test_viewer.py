"""The Rerun viewer (docs/viewer.md): what goes in comes out of a recording read by Rerun's reader.

A bag written with the project's own writer and message packing is logged by `simdist-view bag`
into an .rrd; the viewer node in a live ROS graph (test-published topics on a private domain)
writes a recording whose rows match what it received and counts its queue's drops on
/diagnostics; its parameters are ranged; the web viewer renders non-blank panels in headless
Chromium (slow).
"""

from __future__ import annotations

import base64
import datetime
import fcntl
import json
import os
import pathlib
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter

import numpy as np
import psutil
import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from PIL import Image as PILImage
from rclpy.exceptions import InvalidParameterValueException
from rclpy.parameter import Parameter
from rclpy.serialization import serialize_message
from rerun.chunk import RrdReader
from sensor_msgs.msg import Image
from std_msgs.msg import String

from robot_drivers import ros_msgs
from robot_drivers.interface import Command, CommandKind
from robot_drivers.ur5e.scene import ARM_JOINTS
from robot_ros_helpers import RosHarness
from simdist_adapter.bags import EpisodeBagWriter, EpisodeMeta
from simdist_viewer import layout as L
from simdist_viewer.cli import main as view_main
from simdist_viewer.viewer_node import ViewerNode

ROOT = pathlib.Path(__file__).resolve().parents[1]
UR5E_PERIOD_NS = 200_000_000
CAMS = ("wrist", "overhead", "side")
ACTIONS = list(ros_msgs.UR5E_ACTION_NAMES)


def rrd_rows(path: pathlib.Path) -> Counter:
    """Non-static rows per entity of the first recording in an .rrd, read by Rerun's reader."""
    rows: Counter = Counter()
    for chunk in RrdReader(path).stream():
        if not chunk.is_static:
            rows[chunk.entity_path.lstrip("/")] += chunk.num_rows
    return rows


def timeline_values(path: pathlib.Path, entity: str, timeline: str) -> list:
    out = []
    for chunk in RrdReader(path).stream():
        if chunk.entity_path == "/" + entity and not chunk.is_static:
            assert timeline in chunk.timeline_names
            out += chunk.to_record_batch().column(timeline).to_pylist()
    return out


def rrd_static_entities(path: pathlib.Path) -> set[str]:
    return {c.entity_path.lstrip("/") for c in RrdReader(path).stream() if c.is_static}


def ur5e_tick(k: int, stamp: int, rng, *, hold: bool = False) -> list[tuple[str, object]]:
    """The messages of one UR5e control tick, packed by robot_drivers.ros_msgs."""
    image = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
    msgs: list[tuple[str, object]] = [
        (f"/camera/{c}/image_raw", ros_msgs.image_to_msg(image, stamp, f"{c}_camera")) for c in CAMS
    ]
    msgs += [
        (f"/simdist/observation/image/{c}", ros_msgs.image_to_msg(image[:8, :8], stamp, c))
        for c in CAMS
    ]
    q = rng.normal(size=6)
    msgs.append(("/joint_states", ros_msgs.joint_state_msg(ARM_JOINTS, q, q * 0.1, stamp)))
    msgs.append(("/tcp_pose", ros_msgs.pose_msg([0.1, 0.5, 0.3], [1, 0, 0, 0], stamp)))
    chunk = rng.normal(scale=0.01, size=(5, 7))
    plan = ros_msgs.command_to_msg(
        Command(CommandKind.EE_DELTA, chunk[0].astype(np.float32)), ACTIONS, stamp, 0.2
    )
    plan.points = [type(plan.points[0])(positions=row.tolist()) for row in chunk]
    msgs.append(("/simdist/plan", plan))
    values = ros_msgs.command_to_msg(Command(CommandKind.EE_DELTA, np.zeros(2)), [], stamp, 0.2)
    values.joint_names = ["reward", "value"]
    values.points = [type(plan.points[0])(positions=[0.1 * i, 1.0 + i]) for i in range(5)]
    msgs.append(("/simdist/values", values))
    kind = CommandKind.HOLD if hold else CommandKind.EE_DELTA
    msgs.append(
        (
            "/simdist/safe_command",
            ros_msgs.command_to_msg(Command(kind, chunk[0]), ACTIONS, stamp, 0.2),
        )
    )
    msgs.append(
        (
            "/simdist/episode",
            ros_msgs.episode_msg(
                task="peg", episode=0, seed=3, step=k, reward=0.5 * k, stamp_ns=stamp
            ),
        )
    )
    return msgs


def diag_msg(stamp: int, latency_ms: float, level: int, text: str) -> DiagnosticArray:
    msg = DiagnosticArray()
    msg.header.stamp = ros_msgs.stamp_msg(stamp)
    msg.status = [
        DiagnosticStatus(
            level=bytes([0]),
            name="planner: planning",
            message="planning with MPPI",
            values=[
                KeyValue(key="last_latency_ms", value=f"{latency_ms:.2f}"),
                KeyValue(key="latency_estimate_ms", value="10.0"),
                KeyValue(key="policy_fallbacks", value="0"),
            ],
        ),
        DiagnosticStatus(level=bytes([level]), name="safety_supervisor: command", message=text),
    ]
    return msg


def _type_name(msg) -> str:
    """'pkg/msg/Name' of an rclpy message."""
    return f"{type(msg).__module__.split('.')[0]}/msg/{type(msg).__name__}"


def write_peg_bag(root: pathlib.Path, ticks: int = 12) -> tuple[pathlib.Path, Counter]:
    """An episode bag of `ticks` UR5e ticks (HOLD at tick 6) plus diagnostics; topic counts."""
    rng = np.random.default_rng(0)
    meta = EpisodeMeta(task="peg", seed=3, episode=0, robot="ur5e", variant="real")
    path = root / "peg_ep0000"
    sent: Counter = Counter()
    with EpisodeBagWriter(path, meta) as bag:
        for k in range(ticks):
            stamp = 1_000_000_000 + k * UR5E_PERIOD_NS
            msgs = ur5e_tick(k, stamp, rng, hold=(k == 6))
            if k % 5 == 0:
                msgs.append(("/diagnostics", diag_msg(stamp, 5.0 + k, 2 if k == 5 else 0, f"t{k}")))
            for topic, msg in msgs:
                if not bag.has_topic(topic):
                    bag.add_topic(
                        topic, type(msg).__module__.split(".")[0] + "/msg/" + type(msg).__name__
                    )
                bag.write_raw(topic, stamp, serialize_message(msg))
                sent[topic] += 1
        meta.complete, meta.success, meta.steps = True, False, ticks
    return path, sent


def test_bag_view_logs_every_message_of_a_bag_into_an_rrd_that_rerun_reads_back(tmp_path):
    ticks = 12
    bag, sent = write_peg_bag(tmp_path / "run", ticks)
    rrd = tmp_path / "view.rrd"
    assert view_main(["bag", str(tmp_path / "run"), "--rrd", str(rrd)]) == 0
    rows = rrd_rows(rrd)
    for cam in CAMS:
        assert rows[L.camera_entity(cam, "raw")] == sent[f"/camera/{cam}/image_raw"] == ticks
        assert rows[L.camera_entity(cam, "model")] == ticks
    assert rows[L.JOINT_POSITION] == rows[L.JOINT_VELOCITY] == sent["/joint_states"]
    assert rows[L.PLAN_FIRST] == rows[L.PLAN_CHUNK] == rows[L.TCP_PATH] == ticks
    assert rows[L.VALUES_PREDICTED] == rows[L.VALUES_ALONG_PLAN] == ticks
    assert rows[L.VALUES_REALISED] == ticks
    assert rows[L.COMMAND] == ticks - 1  # the HOLD tick carries no values
    assert rows[L.SAFETY_STATE] == 3  # OK, HOLD at tick 6, OK again
    assert rows[L.PLANNER_LATENCY] == sent["/diagnostics"] == 3
    assert rows[L.SAFETY_REASON] == 3  # t0, t5 (ERROR), t10: each message a change
    assert rows[L.EPISODE_EVENTS] == 1
    assert rows[L.ROBOT_3D + "/wrist_3_link"] == ticks  # the arm's bodies move with the joints
    assert any(e.startswith(L.ROBOT_3D) for e in rrd_static_entities(rrd))  # its geometry
    # timelines: one tick per control period, starting at the first stamp
    assert sorted(timeline_values(rrd, L.PLAN_FIRST, L.TICK)) == list(range(ticks))
    ros_time = sorted(timeline_values(rrd, L.PLAN_FIRST, L.ROS_TIME))
    assert ros_time == [  # sim time: a duration since 0, the header stamps
        datetime.timedelta(microseconds=(1_000_000_000 + k * UR5E_PERIOD_NS) // 1000)
        for k in range(ticks)
    ]


def test_bag_view_adds_an_adaptation_runs_rounds_to_the_same_recording(tmp_path):
    write_peg_bag(tmp_path / "run", 3)
    results = tmp_path / "results.json"
    rounds = [
        {"deployed": True, "reason": "held-out loss fell", "heldout_deployed": 2.0,
         "heldout_candidate": 0.5},
        {"deployed": False, "reason": "round skipped: too few windows",
         "heldout_deployed": None, "heldout_candidate": None},
    ]  # fmt: skip
    curve = [{"real_episodes": n, "success_rate": r} for n, r in ((0, 0.1), (10, 0.2), (20, 0.4))]
    predicted = {"pretrained": [0.0, 0.0, 0.1, 0.1], "adapted": [0.1, 0.2, 0.2, 0.4]}
    probe = {"label": "joint_pos[2]", "real": [0.1, 0.2, 0.3, 0.4], "predicted": predicted}
    results.write_text(
        json.dumps(
            {"methods": {"simdist": {"curve": curve, "rounds": rounds}}, "probe_trajectory": probe}
        )
    )
    rrd = tmp_path / "view.rrd"
    args = ["bag", str(tmp_path / "run"), "--rrd", str(rrd), "--results", str(results), "--no-3d"]
    assert view_main(args) == 0
    rows = rrd_rows(rrd)
    assert rows["adaptation/simdist/success_rate"] == 3
    assert rows["adaptation/simdist/heldout_latent_loss"] == 1  # the skipped round has none
    assert rows["adaptation/simdist/rounds"] == 2
    assert sorted(timeline_values(rrd, "adaptation/simdist/success_rate", L.REAL_EPISODES)) == [
        0,
        10,
        20,
    ]
    assert rows["adaptation/probe_trajectory"] == 4  # real and both predictions per step
    assert timeline_values(rrd, "adaptation/probe_trajectory", L.FUTURE_STEP) == [0, 1, 2, 3]
    assert rows[L.JOINT_POSITION] == 3 and not any(e.startswith(L.ROBOT_3D) for e in rows)
    assert view_main(["bag", str(tmp_path / "nothing"), "--rrd", str(rrd)]) == 1  # one line


# -- the viewer node, live -------------------------------------------------------------------
def _viewer(ros: RosHarness, tmp_path, **params) -> ViewerNode:
    overrides = [Parameter(k, value=v) for k, v in {"mode": "none", **params}.items()]
    return ros.add(ViewerNode(context=ros.context, parameter_overrides=overrides))


def _queue_status(diags) -> list[dict]:
    """Key-values of every `viewer: queue` status received."""
    return [
        {kv.key: kv.value for kv in s.values}
        for a in diags
        for s in a.status
        if s.name == "viewer: queue"
    ]


def _publishers(ros: RosHarness) -> dict:
    pubs = {}
    for topic, msg in ur5e_tick(0, 1, np.random.default_rng(0)):
        pubs[topic] = ros.probe.create_publisher(type(msg), topic, 10)
    pubs["/diagnostics"] = ros.probe.create_publisher(DiagnosticArray, "/diagnostics", 10)
    return pubs


def test_viewer_node_records_what_it_received_and_reports_no_drops_at_a_low_rate(
    tmp_path, ros_domain
):
    ros = RosHarness(ros_domain)
    rrd = tmp_path / "live.rrd"
    try:
        node = _viewer(ros, tmp_path, recording=str(rrd), robot_3d=True)
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        pubs = _publishers(ros)
        assert ros.spin_until(
            lambda: all(p.get_subscription_count() for p in pubs.values()), 10.0
        ), "the viewer did not subscribe to every topic"
        rng, ticks, sent = np.random.default_rng(1), 15, Counter()
        for k in range(ticks):
            stamp = 1_000_000_000 + k * UR5E_PERIOD_NS
            msgs = ur5e_tick(k, stamp, rng, hold=k in (4, 5))
            if k % 5 == 0:
                msgs.append(("/diagnostics", diag_msg(stamp, 3.0, 0, f"t{k}")))
            for topic, msg in msgs:
                pubs[topic].publish(msg)
                sent[topic] += 1
            ros.spin_for(0.05)
        assert ros.spin_until(
            lambda: all(node.received[t] >= n for t, n in sent.items()) and node.idle(), 10.0
        ), f"received {dict(node.received)}, sent {dict(sent)}"
        assert ros.spin_until(lambda: any(s["logged"] != "0" for s in _queue_status(diags)), 3.0)
        counts = dict(node.logger.counts)
        received = Counter(node.received)
    finally:
        ros.close()  # destroys the node: the recording is finalised
    own = received.pop("/diagnostics") - sent.pop("/diagnostics")  # the viewer's own, too
    assert received == sent and own >= 1  # best effort on one machine at this rate loses none
    statuses = _queue_status(diags)
    assert statuses and all(s["dropped"] == "0" for s in statuses)
    rows = rrd_rows(rrd)
    assert {e: rows[e] for e in counts} == counts  # the recording holds what the node logged
    for cam in CAMS:
        assert rows[L.camera_entity(cam, "raw")] == received[f"/camera/{cam}/image_raw"]
        assert rows[L.camera_entity(cam, "model")] == received[f"/simdist/observation/image/{cam}"]
    assert rows[L.JOINT_POSITION] == received["/joint_states"] == ticks
    assert rows[L.PLAN_CHUNK] == rows[L.VALUES_PREDICTED] == ticks
    assert rows[L.COMMAND] == ticks - 2 and rows[L.SAFETY_STATE] == 3  # OK, HOLD, OK
    assert rows[L.PLANNER_LATENCY] == 3  # the planner's statuses among all diagnostics
    assert rows[L.ROBOT_3D + "/wrist_3_link"] == ticks
    assert any(e.startswith(L.ROBOT_3D) for e in rrd_static_entities(rrd))
    assert RrdReader(rrd).blueprints(), "the .rrd carries the graph's layout"


def test_viewer_node_drops_the_oldest_when_its_queue_is_full_and_says_so(tmp_path, ros_domain):
    ros = RosHarness(ros_domain)
    try:
        node = _viewer(ros, tmp_path, queue_size=1, robot_3d=False)
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        pubs = _publishers(ros)
        assert ros.spin_until(lambda: all(p.get_subscription_count() for p in pubs.values()), 10.0)
        rng, end, k = np.random.default_rng(2), time.monotonic() + 20.0, 0
        while node.dropped == 0 and time.monotonic() < end:  # bursts, faster than it logs
            for _ in range(10):
                for topic, msg in ur5e_tick(k, 1_000_000_000 + k * UR5E_PERIOD_NS, rng):
                    pubs[topic].publish(msg)
                k += 1
            ros.spin_for(0.05)
        assert node.dropped > 0
        assert ros.spin_until(
            lambda: any(int(s["dropped"]) > 0 for s in _queue_status(diags)), 5.0
        ), "the drops never reached /diagnostics"
        levels = [s.level[0] for a in diags for s in a.status if s.name == "viewer: queue"]
        assert 1 in levels  # WARN once it dropped
        s = _queue_status(diags)[-1]
        assert int(s["received"]) >= int(s["logged"]) + int(s["dropped"])
    finally:
        ros.close()


def test_viewer_parameters_are_ranged_and_refused_out_of_range(tmp_path, ros_domain):
    ros = RosHarness(ros_domain)
    try:
        node = _viewer(ros, tmp_path, robot_3d=False)
        result = node.set_parameters([Parameter("image_every_n", value=0)])[0]
        assert not result.successful and "range" in result.reason.lower()
        assert node.set_parameters([Parameter("image_every_n", value=3)])[0].successful
        node._report()  # applies it, as its timer does
        assert node.params["image_every_n"] == 3
        descriptor = node.describe_parameter("queue_size")
        assert descriptor.integer_range[0].from_value == 1 and descriptor.read_only
        with pytest.raises((ValueError, InvalidParameterValueException), match="queue_size"):
            ViewerNode(
                context=ros.context,
                parameter_overrides=[Parameter("queue_size", value=0)],
            )
        with pytest.raises(ValueError, match="mode"):
            ViewerNode(context=ros.context, parameter_overrides=[Parameter("mode", value="tv")])
    finally:
        ros.close()


def _listen_ips(pid: int, port: int) -> set[str]:
    """The addresses process `pid` listens on at TCP `port`."""
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


@pytest.mark.parametrize("bind", [None, "0.0.0.0"], ids=["default", "open"])
def test_viewer_node_servers_listen_on_loopback_unless_bind_opens_them(tmp_path, ros_domain, bind):
    """mode web: the gRPC server (in the node's process) and the web viewer (its child) listen
    on 127.0.0.1 by default and on every interface with bind 0.0.0.0; the page is served."""
    grpc, web = _free_port(), _free_port()
    extra = {} if bind is None else {"bind": bind}
    want = {bind or "127.0.0.1"}
    ros = RosHarness(ros_domain)
    try:
        node = _viewer(ros, tmp_path, mode="web", grpc_port=grpc, web_port=web, robot_3d=False,
                       **extra)  # fmt: skip
        assert _listen_ips(os.getpid(), grpc) == want
        assert _listen_ips(node.web.pid, web) == want
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        assert node.uri == f"rerun+http://127.0.0.1:{grpc}/proxy"
        server = psutil.Process(node.web.pid)
        with pytest.raises(ValueError, match="bind must be an IP address"):
            ViewerNode(
                context=ros.context, parameter_overrides=[Parameter("bind", value="anywhere")]
            )
    finally:
        ros.close()
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE  # closed with it


def test_simdist_view_web_listens_on_loopback_unless_bind_opens_it(tmp_path):
    """`simdist-view bag --web`: both servers on 127.0.0.1; `--bind 0.0.0.0` opens them."""
    write_peg_bag(tmp_path / "run", 3)
    for flags, want in (([], {"127.0.0.1"}), (["--bind", "0.0.0.0"], {"0.0.0.0"})):
        web, grpc = _free_port(), _free_port()
        view = subprocess.Popen(
            [str(pathlib.Path(sys.executable).parent / "simdist-view"), "bag",
             str(tmp_path / "run"), "--web", "--port", str(web), "--grpc-port", str(grpc),
             "--no-3d", "--serve-s", "60", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            lines = []
            while not any(line.startswith("web viewer:") for line in lines):
                line = view.stdout.readline()
                assert line, "simdist-view ended early:\n" + "".join(lines)
                lines.append(line)
            procs = [psutil.Process(view.pid), *psutil.Process(view.pid).children(recursive=True)]
            assert set().union(*(_listen_ips(p.pid, grpc) for p in procs)) == want
            assert set().union(*(_listen_ips(p.pid, web) for p in procs)) == want
        finally:
            view.terminate()
            view.wait(timeout=30)
    assert view_main(["bag", str(tmp_path / "run"), "--web", "--bind", "localhost"]) == 1


# -- the web viewer in headless Chromium -----------------------------------------------------
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
GO2_PERIOD_NS = 20_000_000
SCREENSHOTS = os.environ.get("SIMDIST_VIEWER_SCREENSHOTS", "")  # e.g. docs/viewer: keep them


def write_go2_bag(root: pathlib.Path, ticks: int = 30) -> pathlib.Path:
    """A Go2 episode bag: joints, odometry, height maps, plans of 25 joint-target steps."""
    rng = np.random.default_rng(0)
    names = list(ros_msgs.action_names("go2"))
    meta = EpisodeMeta(task="go2_flat", seed=1, episode=0, robot="go2", variant="sim")
    path = root / "go2_ep0000"
    with EpisodeBagWriter(path, meta) as bag:
        for k in range(ticks):
            stamp = 1_000_000_000 + k * GO2_PERIOD_NS
            phase = np.sin(0.3 * k + np.arange(12))
            hm = (0.05 * np.sin(np.arange(21)[:, None] / 3 + k / 10) + np.zeros((21, 15))).astype(
                np.float32
            )
            chunk = 0.5 * np.sin(0.3 * (k + np.arange(25))[:, None] + np.arange(12))
            plan = ros_msgs.command_to_msg(
                Command(CommandKind.JOINT_POSITION, chunk[0]), names, stamp, 0.02
            )
            plan.points = [type(plan.points[0])(positions=row.tolist()) for row in chunk]
            values = ros_msgs.command_to_msg(Command(CommandKind.HOLD), [], stamp, 0.02)
            values.joint_names = ["reward", "value"]
            values.points = [
                type(plan.points[0])(positions=[0.5 + 0.1 * np.sin(i), 5.0 - 0.1 * i])
                for i in range(25)
            ]
            msgs = [
                ("/joint_states", ros_msgs.joint_state_msg(names, 0.3 * phase, phase, stamp)),
                (
                    "/odom",
                    ros_msgs.odometry_msg(
                        [0.01 * k, 0, 0.3], [1, 0, 0, 0], [0.5, 0, 0], [0] * 3, stamp
                    ),
                ),
                ("/height_map", ros_msgs.height_map_to_msg(hm, stamp)),
                ("/simdist/observation/height_map", ros_msgs.height_map_to_msg(hm, stamp)),
                ("/simdist/plan", plan),
                ("/simdist/values", values),
                (
                    "/simdist/safe_command",
                    ros_msgs.command_to_msg(
                        Command(CommandKind.JOINT_POSITION, chunk[0]), names, stamp, 0.02
                    ),
                ),
                (
                    "/simdist/episode",
                    ros_msgs.episode_msg(
                        task="go2_flat",
                        episode=0,
                        seed=1,
                        step=k,
                        reward=float(rng.uniform(0.4, 0.6)),
                        stamp_ns=stamp,
                    ),
                ),  # fmt: skip
            ]
            if k % 10 == 0:
                msgs.append(("/diagnostics", diag_msg(stamp, 12.0 + k / 10, 0, "forwarding plans")))
            for topic, msg in msgs:
                if not bag.has_topic(topic):
                    bag.add_topic(topic, _type_name(msg))
                bag.write_raw(topic, stamp, serialize_message(msg))
        meta.complete, meta.steps = True, ticks
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def screenshot_web_viewer(bag_root, graph, out_png, tmp_path, delay_s=25.0) -> None:
    """`simdist-view bag --web` served locally, opened in headless Chromium, saved as a PNG."""
    web, grpc = _free_port(), _free_port()
    view = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "simdist-view"), "bag", str(bag_root),
         "--web", "--port", str(web), "--grpc-port", str(grpc), "--graph", graph,
         "--serve-s", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lines = []
        while not any(line.startswith("web viewer:") for line in lines):
            line = view.stdout.readline()
            assert line, "simdist-view ended early:\n" + "".join(lines)
            lines.append(line)
        screenshot_url(web_viewer_url(web, grpc), out_png, tmp_path, delay_s)
    finally:
        view.terminate()
        view.wait(timeout=30)


def web_viewer_url(web_port: int, grpc_port: int) -> str:
    """The web viewer on `web_port` showing the view of the gRPC server on `grpc_port`."""
    proxy = urllib.parse.quote(f"rerun+http://127.0.0.1:{grpc_port}/proxy", safe="")
    return f"http://127.0.0.1:{web_port}/?url={proxy}"


class HeadlessChromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
    NUL-terminated JSON, commands on its fd 3, replies on its fd 4), so the test picks the moment
    of a screenshot: the viewer's WebAssembly needs real seconds to start and draw, and a live
    view never stops loading (Chromium's `--screenshot` waits for a load event)."""

    def __init__(self, tmp_path, size=(1280, 800)):
        to_r, self._to = os.pipe()
        self._from, from_w = os.pipe()
        # high copies: the child's dup2 onto 3 and 4 cannot overwrite one with the other
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_r, from_w)]
        for fd in (to_r, from_w):
            os.close(fd)
        self._log = (tmp_path / "chromium.log").open("w")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--enable-unsafe-swiftshader", "--use-angle=swiftshader",
             f"--user-data-dir={tmp_path / 'chromium'}", "--remote-debugging-pipe",
             f"--window-size={size[0]},{size[1]}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            close_fds=False,  # Python's own descriptors are not inherited (PEP 446); 3 and 4 are
            preexec_fn=lambda: [os.dup2(fd, n) for n, fd in zip((3, 4), ends)],
        )  # fmt: skip
        for fd in ends:
            os.close(fd)
        self._id, self._buf, self._session, self.size = 0, b"", None, size

    def call(self, method: str, params: dict | None = None, timeout_s: float = 120.0) -> dict:
        """Send one command (to the attached page, if any) and return its result."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if self._session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self._session
        os.write(self._to, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + timeout_s
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    assert "error" not in reply, f"{method}: {reply['error']}"
                    return reply["result"]
            left = end - time.monotonic()
            assert left > 0, f"Chromium did not answer {method} in {timeout_s} s"
            if select.select([self._from], [], [], left)[0]:
                chunk = os.read(self._from, 1 << 20)
                assert chunk, f"Chromium closed its pipe (exit {self.proc.poll()})"
                self._buf += chunk

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        width, height = self.size  # the page's viewport, whatever the window's decorations
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def screenshot(self, out_png: pathlib.Path) -> pathlib.Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        out_png.write_bytes(base64.b64decode(data))
        return out_png

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("Browser.close", timeout_s=30.0)
                self.proc.wait(timeout=30)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to, self._from):
            os.close(fd)
        self._log.close()


def screenshot_url(
    viewer_url: str, out_png, tmp_path, delay_s=25.0, until=None, timeout_s=0.0, every_s=10.0
) -> None:
    """`viewer_url` in headless Chromium (1280 x 800), saved as a PNG after `delay_s`; with
    `until` (PNG path -> bool), taken again every `every_s` until it holds or `timeout_s` more
    seconds have passed (the last one is kept either way). Within those `timeout_s`, a capture
    Chromium does not answer in 120 s (its renderer busy on a loaded machine) is asked again;
    a late answer to it is skipped by its id."""
    chromium = HeadlessChromium(tmp_path)
    try:
        chromium.open(viewer_url)
        time.sleep(delay_s)
        end = time.monotonic() + timeout_s
        while True:
            try:
                chromium.screenshot(out_png)
            except AssertionError as missed:
                if time.monotonic() >= end or "did not answer" not in str(missed):
                    raise
                continue
            if until is None or until(out_png) or time.monotonic() >= end:
                break
            time.sleep(every_s)
    finally:
        chromium.close()


def blank_panels(png: pathlib.Path, rows: int, cols: int) -> list[tuple[int, int, float]]:
    """Cells of a rows x cols grid over the viewer (below its top bar, above its time panel)
    whose pixels hardly vary: an unrendered viewer is one flat colour with a loading line."""
    gray = np.asarray(PILImage.open(png).convert("L"), np.float32)
    body = gray[40:620]
    h, w = body.shape
    out = []
    for r in range(rows):
        for c in range(cols):
            cell = body[r * h // rows : (r + 1) * h // rows, c * w // cols : (c + 1) * w // cols]
            if cell.std() < 8.0:
                out.append((r, c, float(cell.std())))
    return out


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (make chromium)"
)
@pytest.mark.parametrize("graph", ["peg", "go2_flat"])
def test_web_viewer_shows_every_panel_of_the_layout_in_headless_chromium(tmp_path, graph):
    root = tmp_path / "run"
    if graph == "peg":
        write_peg_bag(root, 20)
    else:
        write_go2_bag(root, 30)
    png = tmp_path / f"{graph}.png"
    screenshot_web_viewer(root, graph, png, tmp_path)
    assert PILImage.open(png).size == (1280, 800)
    blank = blank_panels(png, rows=3, cols=4)
    assert not blank, f"blank panels (row, column, pixel std) in {png}: {blank}"
    if SCREENSHOTS:  # docs/viewer/<graph>.png, palette-reduced to stay small
        target = pathlib.Path(SCREENSHOTS) / f"{graph}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        PILImage.open(png).convert("RGB").quantize(colors=96).save(target, optimize=True)


@pytest.mark.slow  # launches a graph; the viewer node's own tests stay in make test
def test_view_true_in_a_launched_graph_records_the_robot_the_plan_and_the_safety_state(
    tmp_path, ros_domain
):
    """`simdist launch go2_flat view:=true`: the viewer node started by the launch description
    logs the graph's ticks; Rerun's reader finds the joints, the plan and the executed command
    (one row per tick or close to it), the safety state and the robot's bodies."""
    import yaml  # noqa: PLC0415 - only this graph test edits a parameter file

    from simdist_planner.ros import launch_description as desc  # noqa: PLC0415
    from test_faults import _go2_checkpoint  # noqa: PLC0415 - the faults suite's tiny Go2 model

    steps = 30
    data = yaml.safe_load(desc.config_path("go2_flat").read_text())
    data["planner"]["ros__parameters"].update(num_samples=16, num_elites=4, iterations=1, horizon=4)
    data["mujoco_driver"]["ros__parameters"]["max_steps"] = steps
    rrd = tmp_path / "view.rrd"
    data["viewer"]["ros__parameters"].update(recording=str(rrd), mode="none")
    params = tmp_path / "go2_flat_view.yaml"
    params.write_text(yaml.safe_dump(data))
    out = subprocess.run(
        [str(pathlib.Path(sys.executable).parent / "simdist"), "launch", "go2_flat",
         f"checkpoint:={_go2_checkpoint(tmp_path / 'ck')}", f"params_file:={params}",
         f"domain:={ros_domain}", "view:=true", "episodes:=1", "record:=true",
         f"bag_dir:={tmp_path / 'bags'}"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "started viewer (pid" in out.stderr
    rows = rrd_rows(rrd)

    def count(prefix: str) -> int:
        return max((n for e, n in rows.items() if e.startswith(prefix)), default=0)

    for entity in (L.JOINT_POSITION, L.PLAN_FIRST, L.COMMAND):
        assert count(entity) >= steps - 5, (entity, sorted(rows.items())[:20])
    assert count(L.SAFETY_STATE) >= 1  # a state change (OK / HOLD / DAMP) is one row
    assert any(e.startswith(L.ROBOT_3D) for e in rrd_static_entities(rrd) | set(rows))


def test_predicted_frames_and_adapter_progress_sit_beside_the_real_ones(tmp_path):
    """SimForcing's predicted frames go beside the camera's real frame of the same tick, and the
    adapter's progress (its JSON status) becomes a log line plus the held-out losses."""
    import rerun as rr  # noqa: PLC0415 - only this test drives the logger directly

    from simdist_viewer.core import ViewerLogger  # noqa: PLC0415

    rrd = tmp_path / "core.rrd"
    rec = rr.RecordingStream(L.APPLICATION_ID)
    rec.save(str(rrd))
    logger = ViewerLogger(rec, "ur5e", ["wrist"])
    stamp = 1_000_000_000
    frame = np.zeros((64, 64, 3), np.uint8)
    frame[10:20, 10:20] = 255
    for k in range(3):
        t = stamp + k * UR5E_PERIOD_NS
        logger.log("/camera/wrist/image_raw", ros_msgs.image_to_msg(frame, t, "wrist"), t)
        predicted = ros_msgs.image_to_msg(np.roll(frame, k, axis=1), t, "wrist")
        assert logger.log("/simdist/predicted_video/wrist", predicted, t) == [
            L.camera_entity("wrist", "predicted")
        ]
    losses = {"heldout_deployed": 0.2, "heldout_candidate": 0.05}
    for state, extra in (("adapting", {"round": 1}), ("deployed", losses)):
        status = String(data=json.dumps({"state": state, "stamp": 0.0, **extra}))
        logger.log("/simdist/adapter/status", status, stamp)
    rec.flush()
    rec.disconnect()
    rows = rrd_rows(rrd)
    assert rows[L.camera_entity("wrist", "predicted")] == 3
    assert rows[L.camera_entity("wrist", "raw")] == 3
    assert rows["adaptation/status"] == 2
    assert rows["adaptation/heldout_latent_loss"] == 1  # only the round that has both losses
    assert timeline_values(rrd, L.camera_entity("wrist", "predicted"), L.TICK) == [0, 1, 2]


# -- the live peg graph with the video-prediction node, in the web viewer ----------------------
def _tiny_student(root: pathlib.Path) -> str:
    """A SimForcing student (sim conditioning on) trained for a few steps on synthetic 64 x 64
    UR5e windows by `simforcing-train`'s own `run`: the checkpoint layout the node loads."""
    from sim_video_world_model.config import Variant  # noqa: PLC0415 - only this test trains one
    from sim_video_world_model.paired_data import (  # noqa: PLC0415
        SyntheticWorldConfig,
        synthetic_pairs,
    )
    from sim_video_world_model.train import run  # noqa: PLC0415
    from simforcing_helpers import tiny_run_config  # noqa: PLC0415

    root.mkdir(parents=True, exist_ok=True)
    data = str(root / "pairs.h5")
    synthetic_pairs(2, num_frames=5, steps=4, stride=4, cfg=SyntheticWorldConfig(size=64)).save(
        data
    )
    cfg = tiny_run_config(steps=2, batch_size=2)
    run(cfg, data, str(root / "run"), ["autoencoder", "teacher", "student"], [Variant.FULL],
        resume=False)  # fmt: skip
    return str(root / "run" / "student_full")


def _video_graph_params(tmp_path, info: dict, guidance: float, web: int, grpc: int):
    """config/peg.yaml with a CPU-sized MPPI, the cameras at the student's image size (the node
    then predicts at its own size), the student's guidance w, and the viewer serving the web
    viewer on free ports with the `side` camera only (its three panels large enough to see)."""
    import yaml  # noqa: PLC0415 - only the graph tests edit a parameter file

    from simdist_planner.ros import launch_description as desc  # noqa: PLC0415

    h, w = (int(v) for v in info["image_size"])
    data = yaml.safe_load(desc.config_path("peg").read_text())
    data["planner"]["ros__parameters"].update(num_samples=64, num_elites=8, iterations=2)
    data["mujoco_driver"]["ros__parameters"].update(image_height=h, image_width=w)
    data["ingestion"]["ros__parameters"].update(camera_height=h, camera_width=w)
    data["video_prediction"]["ros__parameters"].update(
        camera="side", sim_steps=1, real_steps=10, guidance=guidance
    )
    data["viewer"]["ros__parameters"].update(
        mode="web", grpc_port=grpc, web_port=web, cameras=["side"]
    )
    path = tmp_path / "peg_video.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# the `side` camera's panels of the UR5e layout with cameras [side] at 1280 x 800 (left, top,
# right, bottom; fractions of the page): the camera, then the prediction, two columns to its right
SIDE_CAMERA_BOX = (0.01, 0.11, 0.19, 0.42)
SIDE_PREDICTED_BOX = (0.41, 0.11, 0.59, 0.42)


def panel_content(png: pathlib.Path, box: tuple[float, float, float, float]) -> float:
    """Share of a box's pixels that differ from the page's background (its commonest grey): an
    image fills the box, an empty panel's 'No data available.' is about 1 %."""
    gray = np.asarray(PILImage.open(png).convert("L"), np.int16)
    background = np.bincount(gray.ravel()).argmax()
    h, w = gray.shape
    left, top, right, bottom = box
    cell = gray[int(top * h) : int(bottom * h), int(left * w) : int(right * w)]
    return float((np.abs(cell - background) > 12).mean())


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (make chromium)"
)
def test_live_peg_graph_predicts_the_side_camera_and_the_web_viewer_shows_it_beside_the_real(
    tmp_path, ros_domain
):
    """`simdist launch peg video:=true view:=true` (MuJoCo robot in lockstep, a tiny random
    planner): the video-prediction node serves a SimForcing student at the table's settings
    (N_s 1, N_r 10), publishes predicted frames of the side camera at the student's image size
    that are not flat, and the viewer's web viewer, opened in headless Chromium, shows the
    camera, the model input and the prediction side by side.

    The student: `SIMFORCING_CHECKPOINT` (e.g. a `simforcing-eval` run's `winner`) at
    `SIMFORCING_GUIDANCE` (default 0.6, the node's, or 0 for a student without sim
    conditioning), else one trained here for a few steps on synthetic windows.
    `SIMDIST_VIEWER_SCREENSHOTS=docs/viewer` keeps the screenshot as `peg_video.png`."""
    from checkpoint_helpers import make_checkpoint  # noqa: PLC0415 - the tiny UR5e world model

    student = os.environ.get("SIMFORCING_CHECKPOINT") or _tiny_student(tmp_path / "sf")
    info = json.loads((pathlib.Path(student) / "config.json").read_text())["info"]
    conditioned = bool(info.get("sim_conditioning"))
    guidance = float(os.environ.get("SIMFORCING_GUIDANCE", 0.6 if conditioned else 0.0))
    web, grpc = _free_port(), _free_port()
    params = _video_graph_params(tmp_path, info, guidance, web, grpc)
    log = (tmp_path / "launch.log").open("w")
    launcher = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "simdist"), "launch", "peg", "robot:=sim",
         f"checkpoint:={make_checkpoint(tmp_path / 'ck')}", "video:=true",
         f"video_checkpoint:={student}", "view:=true", f"params_file:={params}",
         f"domain:={ros_domain}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def launch_log() -> str:
        if not log.closed:
            log.flush()
        return (tmp_path / "launch.log").read_text()[-4000:]

    ros = RosHarness(ros_domain)
    try:
        topic = "/simdist/predicted_video/side"
        statuses = ros.collect(String, f"{topic}/status", depth=100)
        frames = ros.collect(Image, topic, depth=100)

        def done() -> list[dict]:
            return [s for s in (json.loads(m.data) for m in statuses) if s.get("ok")]

        assert ros.spin_until(lambda: len(done()) >= 2 or launcher.poll() is not None, 400.0), (
            f"no predictions; statuses {[m.data for m in statuses][-5:]}\n{launch_log()}"
        )
        assert launcher.poll() is None, launch_log()
        errors = [
            s["error"]
            for s in (json.loads(m.data) for m in statuses)
            if not s.get("ok") and "no image received yet" not in s["error"]
        ]
        assert not errors, errors
        job = done()[-1]
        assert (job["sim_steps"], job["real_steps"], job["guidance"]) == (1, 10, guidance)
        assert 1 <= job["frames"] <= int(info["num_frames"]) - 1 and job["latency_s"] > 0
        assert ros.spin_until(lambda: len(frames) >= job["frames"], 10.0)
        for msg in frames[-job["frames"] :]:
            image = ros_msgs.image_from_msg(msg)
            assert image.shape == (*info["image_size"], 3) and msg.encoding == "rgb8"
            assert image.std() > 2.0, "a flat predicted frame"
        print(f"video node latency_s per job: {[s['latency_s'] for s in done()]}")

        png = tmp_path / "peg_video.png"
        # The lockstep graph is paused (its driver stopped: no tick, no new frame) while the
        # page is taken: a live stream on a loaded machine keeps the software-rendered page busy
        # catching up, and Chromium then answers no capture. The web viewer replays the view
        # from the start, so the page is taken again until the prediction panel shows.
        launch_log()  # flushed
        started = (tmp_path / "launch.log").read_text()
        driver = re.search(r"started mujoco_driver \(pid (\d+)\)", started)
        assert driver, launch_log()
        os.kill(int(driver.group(1)), signal.SIGSTOP)
        try:
            screenshot_url(
                web_viewer_url(web, grpc), png, tmp_path, delay_s=30.0, every_s=15.0,
                until=lambda shot: panel_content(shot, SIDE_PREDICTED_BOX) > 0.5,
                timeout_s=300.0,
            )  # fmt: skip
        finally:
            os.kill(int(driver.group(1)), signal.SIGCONT)
        assert launcher.poll() is None, launch_log()
    finally:
        ros.close()
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        finally:
            log.close()
    assert launcher.returncode == 0, launch_log()
    assert PILImage.open(png).size == (1280, 800)
    shown = {box: panel_content(png, box) for box in (SIDE_CAMERA_BOX, SIDE_PREDICTED_BOX)}
    assert min(shown.values()) > 0.5, f"the camera or the prediction is not shown: {shown}, {png}"
    if SCREENSHOTS:
        target = pathlib.Path(SCREENSHOTS) / "peg_video.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        PILImage.open(png).convert("RGB").quantize(colors=96).save(target, optimize=True)
