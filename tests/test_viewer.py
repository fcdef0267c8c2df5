"""The Rerun viewer (docs/viewer.md): what goes in comes out of a recording read by Rerun's reader.

A bag written with the project's own writer and message packing is logged by `simdist-view bag`
into an .rrd; the viewer node in a live ROS graph (test-published topics on a private domain)
writes a recording whose rows match what it received and counts its queue's drops on
/diagnostics; its parameters are ranged; the web viewer renders non-blank panels in headless
Chromium (slow).
"""

from __future__ import annotations

import datetime
import http.server
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
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


class _DelayedPage(http.server.BaseHTTPRequestHandler):
    """A page showing the viewer in a frame whose load event waits `delay_s` (a hidden image
    that answers late): Chromium's --screenshot fires on load, and the viewer's WebAssembly
    needs real seconds to start and draw."""

    viewer_url = ""
    delay_s = 0.0

    def do_GET(self):
        if self.path.startswith("/late"):
            time.sleep(self.delay_s)
            body, kind = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "image/gif"
        else:
            body = (
                '<html><body style="margin:0;overflow:hidden">'
                f'<iframe src="{self.viewer_url}" style="display:block;border:0;'
                'width:1280px;height:800px"></iframe>'
                '<img src="/late" style="display:none"></body></html>'
            ).encode()
            kind = "text/html"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def screenshot_web_viewer(bag_root, graph, out_png, tmp_path, delay_s=25.0) -> None:
    """`simdist-view bag --web` served locally, opened in headless Chromium, saved as a PNG."""
    web, grpc = _free_port(), _free_port()
    view = subprocess.Popen(
        [str(pathlib.Path(sys.executable).parent / "simdist-view"), "bag", str(bag_root),
         "--web", "--port", str(web), "--grpc-port", str(grpc), "--graph", graph,
         "--serve-s", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    page = None
    try:
        lines = []
        while not any(line.startswith("web viewer:") for line in lines):
            line = view.stdout.readline()
            assert line, "simdist-view ended early:\n" + "".join(lines)
            lines.append(line)
        proxy = urllib.parse.quote(f"rerun+http://127.0.0.1:{grpc}/proxy", safe="")
        handler = type("Page", (_DelayedPage,), {
            "viewer_url": f"http://127.0.0.1:{web}/?url={proxy}", "delay_s": delay_s,
        })  # fmt: skip
        page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=page.serve_forever, daemon=True).start()
        shot = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--enable-unsafe-swiftshader", "--use-angle=swiftshader",
             f"--user-data-dir={tmp_path / 'chromium'}", f"--screenshot={out_png}",
             "--window-size=1280,800", f"http://127.0.0.1:{page.server_address[1]}/"],
            capture_output=True, text=True, timeout=delay_s + 90,
        )  # fmt: skip
        assert shot.returncode == 0 and out_png.is_file(), shot.stderr[-2000:]
    finally:
        if page is not None:
            page.shutdown()
        view.terminate()
        view.wait(timeout=30)


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
