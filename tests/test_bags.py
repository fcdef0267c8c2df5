"""Episode bags: the recorder node writes real DDS traffic to MCAP; an independent reader reads it.

Real DDS on loopback, private ROS domain; the recorder runs as its own process so it can be
interrupted like in the field.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from simdist_adapter.bags import (
    TYPESTORE,
    BagError,
    EpisodeBag,
    EpisodeBagWriter,
    EpisodeMeta,
    list_episode_bags,
    recover_bag,
    unfinalised_bags,
)
from simdist_adapter.recorder_node import RECORD_QOS

RECORDER = str(pathlib.Path(sys.executable).parent / "recorder_node")
BAG_TOOL = str(pathlib.Path(sys.executable).parent / "simdist-bag")


def _mcap_messages(bag_dir: pathlib.Path) -> dict[str, list]:
    """Every message of the bag decoded by mcap + mcap_ros2 (not rosbags)."""
    (mcap_file,) = bag_dir.glob("*.mcap")
    out: dict[str, list] = {}
    with open(mcap_file, "rb") as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        for _schema, channel, _message, decoded in reader.iter_decoded_messages():
            out.setdefault(channel.topic, []).append(decoded)
    return out


class Publisher:
    """The test's side of the graph: a driver-like node publishing an episode."""

    def __init__(self):
        rclpy.init()
        self.node = Node("bag_test_publisher")
        self.pubs = {
            "/simdist/episode": self.node.create_publisher(String, "/simdist/episode", RECORD_QOS),
            "/joint_states": self.node.create_publisher(JointState, "/joint_states", RECORD_QOS),
            "/camera/wrist/image_raw": self.node.create_publisher(
                Image, "/camera/wrist/image_raw", RECORD_QOS
            ),
            "/simdist/action": self.node.create_publisher(
                JointTrajectory, "/simdist/action", RECORD_QOS
            ),
        }

    def wait_for_recorder(self, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(p.get_subscription_count() > 0 for p in self.pubs.values()):
                return
            rclpy.spin_once(self.node, timeout_sec=0.05)
        raise TimeoutError("the recorder never subscribed to every topic")

    def tick(self, episode: int, step: int, last: bool):
        now = self.node.get_clock().now()
        stamp = now.to_msg()
        info = dict(task="peg", variant="real", seed=100 + episode, episode=episode, step=step,
                    reward=0.0, success=last, terminated=last, truncated=False,
                    stamp_ns=now.nanoseconds)  # fmt: skip
        self.pubs["/simdist/episode"].publish(String(data=json.dumps(info)))
        js = JointState(name=["j0", "j1"], position=[float(step), float(episode)])
        js.header.stamp = stamp
        self.pubs["/joint_states"].publish(js)
        img = Image(height=4, width=5, encoding="rgb8", step=15, data=bytes([step % 256]) * 60)
        img.header.stamp = stamp
        self.pubs["/camera/wrist/image_raw"].publish(img)
        act = JointTrajectory(
            joint_names=["dx"], points=[JointTrajectoryPoint(positions=[0.01 * step])]
        )
        act.header.stamp, act.header.frame_id = stamp, "ee_delta"
        self.pubs["/simdist/action"].publish(act)
        rclpy.spin_once(self.node, timeout_sec=0.02)

    def close(self):
        self.node.destroy_node()
        rclpy.shutdown()


@pytest.fixture
def recorder(tmp_path, ros_domain):
    procs = []

    def start(*params):
        extra = [arg for p in params for arg in ("-p", p)]
        proc = subprocess.Popen(
            [RECORDER, "--ros-args", "-p", f"bag_dir:={tmp_path / 'bags'}",
             "-p", "checkpoint:=/ck/v1", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_for(predicate, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError("condition not reached")


def test_recorder_writes_one_finalised_bag_per_episode_readable_by_mcap(tmp_path, recorder):
    proc = recorder()
    pub = Publisher()
    try:
        pub.wait_for_recorder()
        for step in range(6):
            pub.tick(episode=0, step=step, last=step == 5)
        pub.tick(episode=1, step=0, last=False)  # a new episode finalises the first bag
        _wait_for(lambda: len(list_episode_bags(tmp_path / "bags")) == 2)
        for step in range(1, 3):
            pub.tick(episode=1, step=step, last=False)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # the interrupted second episode is finalised too
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        pub.close()

    first, second = list_episode_bags(tmp_path / "bags")
    with EpisodeBag(first) as bag:
        assert (bag.meta.task, bag.meta.seed, bag.meta.episode) == ("peg", 100, 0)
        assert bag.meta.success is True and bag.meta.complete and bag.meta.steps == 5
        assert bag.meta.checkpoint == "/ck/v1"
        assert bag.topics["/camera/wrist/image_raw"] == "sensor_msgs/msg/Image"
        positions = [m.data.position.tolist() for m in bag.messages(["/joint_states"])]
        assert positions == [[float(s), 0.0] for s in range(6)]
    decoded = _mcap_messages(first)
    assert set(decoded) >= {
        "/simdist/episode",
        "/joint_states",
        "/camera/wrist/image_raw",
        "/simdist/action",
    }
    assert set(decoded) == set(EpisodeBag(first).topics)  # every recorded topic decodes
    assert [m.position for m in decoded["/joint_states"]] == [[float(s), 0.0] for s in range(6)]
    assert [bytes(m.data)[0] for m in decoded["/camera/wrist/image_raw"]] == list(range(6))
    assert [m.points[0].positions[0] for m in decoded["/simdist/action"]] == pytest.approx(
        [0.01 * s for s in range(6)]
    )
    assert json.loads(decoded["/simdist/episode"][-1].data)["success"] is True

    with EpisodeBag(second) as bag:  # interrupted mid-episode: readable, marked incomplete
        assert bag.meta.episode == 1 and bag.meta.success is None and not bag.meta.complete
        assert len(list(bag.messages(["/joint_states"]))) == 3
    assert len(_mcap_messages(second)["/joint_states"]) == 3


def test_max_bags_caps_the_bags_of_a_run_and_files_nothing_into_an_earlier_episode(
    tmp_path, recorder
):
    proc = recorder("max_bags:=2")
    pub = Publisher()
    try:
        pub.wait_for_recorder()
        for episode in range(4):  # a robot that ends its episodes at once
            for step in range(2):
                pub.tick(episode=episode, step=step, last=step == 1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
    finally:
        pub.close()
    bags = list_episode_bags(tmp_path / "bags")
    assert len(bags) == 2
    for episode, path in enumerate(bags):
        with EpisodeBag(path) as bag:
            assert bag.meta.episode == episode
            positions = [m.data.position.tolist() for m in bag.messages(["/joint_states"])]
            assert positions == [[0.0, float(episode)], [1.0, float(episode)]]


def test_sigterm_finalises_the_open_bag_and_a_sigkilled_one_is_recovered(tmp_path, recorder):
    pub = Publisher()
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            proc = recorder("flush_period_s:=0.1")
            pub.wait_for_recorder()
            for step in range(3):
                pub.tick(episode=7 if sig == signal.SIGTERM else 8, step=step, last=False)
            time.sleep(0.5)
            proc.send_signal(sig)
            proc.communicate(timeout=30)
            if (
                sig == signal.SIGTERM
            ):  # a clean exit leaves the graph at once; the next recorder is new
                _wait_for(lambda: all(p.get_subscription_count() == 0 for p in pub.pubs.values()))
        reports = []
        pub.node.create_subscription(
            DiagnosticArray,
            "/diagnostics",
            lambda m: reports.extend(
                s.message for s in m.status if s.name == "recorder: unfinalised_bags"
            ),
            10,
        )
        next_recorder = recorder()  # it names the killed bag on /diagnostics
        end = time.monotonic() + 30
        while not reports and time.monotonic() < end:
            rclpy.spin_once(pub.node, timeout_sec=0.1)
        next_recorder.send_signal(signal.SIGINT)
        next_recorder.communicate(timeout=30)
    finally:
        pub.close()
    bags = sorted((tmp_path / "bags").iterdir(), key=lambda p: "ep0008" in p.name)
    terminated, killed = bags
    with EpisodeBag(terminated) as bag:
        assert bag.meta.episode == 7 and len(list(bag.messages(["/joint_states"]))) == 3
    assert len(_mcap_messages(terminated)["/camera/wrist/image_raw"]) == 3
    with pytest.raises(BagError, match="never finalised"):
        EpisodeBag(killed)

    # simdist-bag recover rebuilds it: every message written before the last flush is back
    # (flush_period_s 0.1; the kill came 0.5 s after the last tick)
    assert reports and "1 unfinalised bag(s)" in reports[0] and "simdist-bag recover" in reports[0]
    out = subprocess.run(
        [BAG_TOOL, "recover", "--all", str(tmp_path / "bags")], capture_output=True, text=True
    )
    assert out.returncode == 0 and f"recovered {killed}" in out.stdout, out.stderr
    with EpisodeBag(killed) as bag:
        assert bag.meta.episode == 8 and bag.meta.extra["recovered"] and not bag.meta.complete
        positions = [m.data.position.tolist() for m in bag.messages(["/joint_states"])]
        assert positions == [[float(step), 8.0] for step in range(3)]
    assert len(_mcap_messages(killed)["/camera/wrist/image_raw"]) == 3  # the independent reader
    assert (killed / f"{killed.name}.mcap.unfinalised").is_file()  # the original is kept
    again = subprocess.run([BAG_TOOL, "recover", str(killed)], capture_output=True, text=True)
    assert again.returncode == 1 and "already finalised" in again.stderr


def _small_bag(path: pathlib.Path, n: int = 300) -> pathlib.Path:
    t = TYPESTORE.types
    with EpisodeBagWriter(
        path, EpisodeMeta(task="peg", seed=1, success=False, complete=True)
    ) as bag:
        bag.add_topic("/joint_states", "sensor_msgs/JointState")
        for k in range(n):
            msg = t["sensor_msgs/msg/JointState"](
                header=t["std_msgs/msg/Header"](
                    stamp=t["builtin_interfaces/msg/Time"](sec=k, nanosec=0), frame_id=""),
                name=["a"], position=np.array([float(k)]), velocity=np.zeros(0), effort=np.zeros(0),
            )  # fmt: skip
            bag.write("/joint_states", (k + 1) * 1000, msg)
    return path


def test_reader_round_trip_and_metadata_fallback(tmp_path):
    path = _small_bag(tmp_path / "ep")
    (path / "episode.json").unlink()  # the metadata also lives in metadata.yaml
    with EpisodeBag(path) as bag:
        assert bag.meta.seed == 1 and bag.meta.success is False and bag.message_count == 300
        stamps = [m.stamp_ns for m in bag.messages()]
        assert stamps == [(k + 1) * 1000 for k in range(300)]
        with pytest.raises(BagError, match=r"no topic\(s\) \['/odom'\]"):
            list(bag.messages(["/odom"]))
        assert list(bag.messages([])) == []  # no topic asked for: no message (not all)
    with pytest.raises(BagError, match="the bag is closed"):
        list(bag.messages())


@pytest.mark.parametrize("damage", ["truncate_half", "truncate_tail", "overwrite_middle"])
def test_truncated_or_corrupt_bag_gives_a_clear_error(tmp_path, damage):
    path = _small_bag(tmp_path / "ep")
    (mcap_file,) = path.glob("*.mcap")
    data = bytearray(mcap_file.read_bytes())
    if damage == "truncate_half":
        data = data[: len(data) // 2]
    elif damage == "truncate_tail":
        data = data[:-10]
    else:
        data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    mcap_file.write_bytes(bytes(data))
    with pytest.raises(BagError, match=r"truncated or corrupt") as err:
        with EpisodeBag(path) as bag:
            list(bag.messages())
    assert str(path) in str(err.value)


def test_writer_refuses_overwrite_and_unknown_types(tmp_path):
    path = _small_bag(tmp_path / "ep", n=1)
    with pytest.raises(BagError, match="already exists"):
        EpisodeBagWriter(path, EpisodeMeta(task="peg"))
    with EpisodeBagWriter(tmp_path / "other", EpisodeMeta(task="peg")) as bag:
        with pytest.raises(BagError, match="not a ROS 2 Kilted type"):
            bag.add_topic("/x", "my_msgs/msg/Custom")
        with pytest.raises(BagError, match="was not declared"):
            bag.write_raw("/y", 1, b"\x00\x01\x00\x00")
        bag.add_topic("/z", "std_msgs/msg/String")
    assert os.path.isfile(tmp_path / "other" / "metadata.yaml")
    bag.flush()  # a closed bag has nothing pending
    with pytest.raises(BagError, match="the bag is closed"):
        bag.write_raw("/z", 2, b"\x00\x01\x00\x00")


_KILLED_WRITER = """
import os, signal, sys
from rosbags.typesys.stores.ros2_kilted import std_msgs__msg__String as String
from simdist_adapter.bags import EpisodeBagWriter, EpisodeMeta
bag = EpisodeBagWriter(sys.argv[1], EpisodeMeta(task="peg", episode=3, seed=9))
bag.add_topic("/x", "std_msgs/msg/String")
for i in range(100):
    bag.write("/x", 1000 + i, String(data=f"m{i}"))
    if i == 59:
        bag.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_loses_only_what_followed_its_last_flush(tmp_path):
    path = tmp_path / "ep"
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=False)
    assert [p.name for p in unfinalised_bags(tmp_path)] == ["ep"]
    recovery = recover_bag(path)
    assert recovery.messages == 60 and recovery.topics == 1
    with EpisodeBag(path) as bag:
        assert (bag.meta.episode, bag.meta.seed, bag.meta.complete) == (3, 9, False)
        assert [m.data.data for m in bag.messages(["/x"])] == [f"m{i}" for i in range(60)]
    assert unfinalised_bags(tmp_path) == []
    with pytest.raises(BagError, match="already finalised"):
        recover_bag(path)


@pytest.mark.parametrize("cut", [0, 4, 8, None])
def test_a_bag_cut_before_its_first_record_recovers_empty_and_garbage_is_refused(tmp_path, cut):
    """A writer killed as it created the bag leaves its MCAP file empty, cut inside the magic, or
    holding only the header (`cut` None: the chunk was still in memory): nothing reached the
    disk, the recovered bag is empty and readable. A file that is not an MCAP is refused."""
    path = tmp_path / "ep"
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=False)
    mcap_file = path / "ep.mcap"
    data = mcap_file.read_bytes()
    # after the magic: the header record (opcode 0x01, 8-byte length, content)
    assert data[8] == 1
    header_end = 8 + 1 + 8 + int.from_bytes(data[9:17], "little")
    mcap_file.write_bytes(data[:cut] if cut is not None else data[:header_end])
    recovery = recover_bag(path)
    assert (recovery.messages, recovery.topics) == (0, 0)
    with EpisodeBag(path) as bag:
        assert (bag.meta.episode, bag.meta.complete, bag.message_count) == (3, False, 0)
    garbage = tmp_path / "junk"
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(garbage)], check=False)
    (garbage / "junk.mcap").write_bytes(b"not an mcap file at all")
    with pytest.raises(BagError, match="no complete channel record"):
        recover_bag(garbage)


def test_recovery_stops_at_a_record_cut_short(tmp_path):
    path = tmp_path / "ep"
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=False)
    mcap_file = path / "ep.mcap"
    mcap_file.write_bytes(mcap_file.read_bytes()[:-5])  # the write the crash interrupted
    recovery = recover_bag(path)
    assert recovery.truncated and 0 < recovery.messages <= 60
    with EpisodeBag(path) as bag:
        assert len(list(bag.messages(["/x"]))) == recovery.messages
