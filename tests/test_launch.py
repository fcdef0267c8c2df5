"""Launch description -> command lines; launch files use the description; the launcher supervises.

The supervision tests start real node processes on a private ROS domain.
"""

import ast
import importlib
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import rclpy
import yaml
from rclpy.parameter import Parameter

from checkpoint_helpers import make_checkpoint
from robot_drivers import ros_msgs
from robot_drivers.specs import robot_spec
from simdist_adapter.bags import TYPESTORE, EpisodeBagWriter, EpisodeMeta
from simdist_adapter.replay_node import ReplayNode
from simdist_planner.planning.config import PLANNER_FIELDS, planner_config_for
from simdist_planner.ros import launch_description as desc
from simdist_planner.ros import launcher

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIMDIST = str(pathlib.Path(sys.executable).parent / "simdist")


def test_sim_graph_command_lines(tmp_path):
    graph = desc.resolve(
        "peg", {"checkpoint": str(tmp_path / "ck"), "record": "yes", "domain": "42"}
    )
    names = [n.name for n in graph.nodes]
    assert names == ["mujoco_driver", "ingestion", "safety_supervisor", "planner", "recorder"]
    assert graph.env == {"ROS_DOMAIN_ID": "42", "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
    planner = next(n for n in graph.nodes if n.name == "planner")
    cmd = launcher.command_line(planner)
    assert pathlib.Path(cmd[0]).name == "planner_node"
    tail = cmd[1:]
    assert tail[:5] == [
        "--ros-args",
        "-r",
        "__node:=planner",
        "--params-file",
        str(ROOT / "config" / "peg.yaml"),
    ]
    pairs = [tail[i + 1] for i, t in enumerate(tail) if t == "-p"]
    assert "use_sim_time:=true" in pairs and "lockstep:=true" in pairs
    assert f"checkpoint:={tmp_path / 'ck'}" in pairs and "device:=cpu" in pairs
    driver = next(n for n in graph.nodes if n.name == "mujoco_driver")
    assert driver.overrides["task"] == "peg" and driver.overrides["variant"] == "real"
    assert driver.overrides["seed"] == 0 and driver.overrides["lockstep"] is True
    assert (
        driver.overrides["wait_for_ready"] == desc.RECORDER_READY_TOPIC
    )  # recording: tick 0 waits for the recorder


def test_go2_graphs_take_the_stand_ins_speed_and_panel_friction():
    graph = desc.resolve("go2_slope", {"checkpoint": "/ck", "speed": "0.3", "friction": "0.12"})
    driver = next(n for n in graph.nodes if n.name == "mujoco_driver")
    assert driver.overrides["task"] == "slippery_slope"
    assert driver.overrides["speed"] == 0.3 and driver.overrides["panel_friction"] == 0.12
    assert "-p" in launcher.command_line(driver) and "speed:=0.3" in launcher.command_line(driver)
    default = desc.resolve("go2_flat", {"checkpoint": "/ck"}).nodes[0]
    assert default.overrides["speed"] == 0.0 and default.overrides["panel_friction"] == 0.0
    with pytest.raises(ValueError, match="friction:=0.12: panel_friction applies to slippery"):
        desc.resolve("go2_flat", {"checkpoint": "/ck", "friction": "0.12"})
    with pytest.raises(ValueError, match="friction:=0.12: panel_friction applies to slippery"):
        desc.resolve("go2_slope", {"checkpoint": "/ck", "variant": "sim", "friction": "0.12"})
    with pytest.raises(ValueError, match="speed:='fast' must be a float"):
        desc.resolve("go2_slope", {"checkpoint": "/ck", "speed": "fast"})
    with pytest.raises(ValueError, match="unknown argument"):  # the UR5e graphs have neither
        desc.resolve("peg", {"checkpoint": "/ck", "speed": "0.3"})


def test_real_and_replay_graphs_swap_the_robot_side():
    real = desc.resolve(
        "go2_slope", {"robot": "real", "checkpoint": "/ck", "network_interface": "eth1"}
    )
    assert [n.name for n in real.nodes] == [
        "go2_driver",
        "ingestion",
        "safety_supervisor",
        "planner",
    ]
    assert real.nodes[0].overrides == {"use_sim_time": False, "network_interface": "eth1"}
    real_rec = desc.resolve(
        "peg", {"robot": "real", "checkpoint": "/ck", "robot_ip": "10.0.0.2", "record": "true"}
    )
    assert real_rec.nodes[-1].overrides["split_episodes"] is False  # hardware announces no episodes
    assert next(n for n in real.nodes if n.name == "planner").overrides["lockstep"] is False
    replay = desc.resolve("peg", {"robot": "replay", "bag": "/bags/ep0", "checkpoint": "/ck"})
    assert [n.name for n in replay.nodes] == ["replay", "ingestion", "planner"]
    assert replay.nodes[0].overrides == {"use_sim_time": False, "bag": "/bags/ep0"}
    assert replay.nodes[2].overrides["use_sim_time"] is True
    recorded = desc.resolve(
        "peg", {"robot": "replay", "bag": "/bags/ep0", "checkpoint": "/ck", "record": "true"}
    )  # the replay's first tick waits for the recorder, as the lockstep simulator's does
    assert recorded.nodes[0].overrides["wait_for_ready"] == desc.RECORDER_READY_TOPIC
    recorder = next(n for n in recorded.nodes if n.name == "recorder")
    assert "safety_supervisor" not in {n.name for n in recorded.nodes}
    ready = yaml.safe_load(desc.config_path("peg").read_text())["recorder"]["ros__parameters"]
    assert "/simdist/safe_command" in ready["ready_topics"]  # the live graph's list
    assert recorder.overrides["ready_topics"] == [
        t for t in ready["ready_topics"] if t != "/simdist/safe_command"
    ]
    # the sim task depends on the variant: Go2 slope trains on go2_slope, runs on slippery_slope
    sim = desc.resolve("go2_slope", {"checkpoint": "/ck", "variant": "sim"})
    assert sim.nodes[0].overrides["task"] == "go2_slope"
    assert "wait_for_ready" not in sim.nodes[0].overrides  # nothing records: no reason to wait


def test_override_strings_round_trip_through_yaml_types():
    node = desc.ResolvedNode(
        "n", "x", pathlib.Path("p.yaml"), {"a": "1", "b": "", "c": True, "d": 0.5, "e": "on"}
    )
    pairs = dict(p.split(":=", 1) for p in desc.ros_args(node)[6::2])
    assert {k: yaml.safe_load(v) for k, v in pairs.items()} == {
        "a": "1",
        "b": "",
        "c": True,
        "d": 0.5,
        "e": "on",
    }


@pytest.mark.parametrize(
    "given, message",
    [
        ({"checkpoint": "/ck", "robot": "moon"}, "robot:='moon' must be one of"),
        ({"checkpoint": "/ck", "speed": "1"}, "unknown argument(s) ['speed']"),
        ({}, "checkpoint:=<dir> is required"),
        ({"checkpoint": "/ck", "robot": "real"}, "robot:=real needs robot_ip"),
        ({"checkpoint": "/ck", "record": "maybe"}, "record:='maybe' must be true or false"),
        ({"checkpoint": "/ck", "seed": "-3"}, "seed:='-3' must be a non-negative integer"),
        ({"checkpoint": "/ck", "domain": "300"}, "domain id 0..232"),
        ({"checkpoint": "/ck", "robot": "replay"}, "robot:=replay needs bag"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(given, message):
    with pytest.raises(ValueError, match=None) as err:
        desc.resolve("peg", given)
    assert message in str(err.value)


def test_sim_graphs_keep_dds_discovery_on_this_machine_unless_asked():
    sim = desc.resolve("peg", {"checkpoint": "/ck", "domain": "7"})
    assert sim.env == {"ROS_DOMAIN_ID": "7", "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
    replay = desc.resolve("go2_slope", {"checkpoint": "/ck", "robot": "replay", "bag": "/b"})
    assert replay.env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    real = desc.resolve("peg", {"checkpoint": "/ck", "robot": "real", "robot_ip": "10.0.0.2"})
    assert "ROS_AUTOMATIC_DISCOVERY_RANGE" not in real.env  # hardware: the environment's
    wide = desc.resolve("peg", {"checkpoint": "/ck", "discovery": "subnet"})
    assert wide.env["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "SUBNET"
    with pytest.raises(ValueError, match="discovery:='lan' must be one of"):
        desc.resolve("peg", {"checkpoint": "/ck", "discovery": "lan"})


def test_keystore_runs_every_node_in_its_enclave_with_security_enforced(tmp_path):
    """SROS2 (real ROS installs): keystore:=DIR gives each node --enclave /simdist/<node> and
    the DDS-Security environment; a keystore missing an enclave is refused by name."""
    keystore = tmp_path / "keystore"
    args = {"checkpoint": "/ck", "robot": "real", "robot_ip": "10.0.0.2", "record": "true"}
    with pytest.raises(ValueError, match="not an SROS2 keystore"):
        desc.resolve("peg", {**args, "keystore": str(keystore)})
    names = [n.name for n in desc.resolve("peg", args).nodes]
    for name in names[:-1]:
        (keystore / "enclaves" / "simdist" / name).mkdir(parents=True)
    with pytest.raises(ValueError, match=f"no enclave\\(s\\) \\['/simdist/{names[-1]}'\\]"):
        desc.resolve("peg", {**args, "keystore": str(keystore)})
    (keystore / "enclaves" / "simdist" / names[-1]).mkdir()
    graph = desc.resolve("peg", {**args, "keystore": str(keystore)})
    assert graph.env["ROS_SECURITY_KEYSTORE"] == str(keystore)
    assert (graph.env["ROS_SECURITY_ENABLE"], graph.env["ROS_SECURITY_STRATEGY"]) == (
        "true",
        "Enforce",
    )
    for node in graph.nodes:
        tail = desc.ros_args(node)
        assert tail[tail.index("--enclave") + 1] == f"/simdist/{node.name}"
    plain = desc.resolve("peg", args)
    assert not any("--enclave" in desc.ros_args(n) for n in plain.nodes)
    assert not any(k.startswith("ROS_SECURITY") for k in plain.env)


def test_launcher_cli_reports_bad_arguments():
    out = subprocess.run(
        [SIMDIST, "launch", "peg", "checkpoint:=/ck", "robot=sim"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "must look like name:=value" in out.stderr


def _declared(module: str, robot: str, preset: str = ""):
    """The parameters a node declares, with their defaults (the planner's: for `robot` with
    `preset`)."""
    mod = importlib.import_module(module)
    if not hasattr(mod, "node_params"):
        return {p.name: p.default for p in mod.PARAMS}
    params = mod.node_params(robot, preset) if preset else mod.node_params(robot)
    return {p.name: p.default for p in params}


NODE_MODULES = {
    "mujoco_driver": "robot_drivers.mujoco_driver_node",
    "ur5e_driver": "robot_drivers.ur5e_rtde_driver_node",
    "go2_driver": "robot_drivers.go2_sdk_driver_node",
    "video_prediction": "sim_video_world_model.video_node",
    "adapter": "simdist_adapter.adapter_node",
    "planner": "simdist_planner.ros.planner_node",
    "recorder": "simdist_adapter.recorder_node",
    "viewer": "simdist_viewer.viewer_node",
    "replay": "simdist_adapter.replay_node",
    "ingestion": "robot_drivers.ingestion_node",
    "safety_supervisor": "robot_drivers.safety_node",
}


@pytest.mark.parametrize("graph", sorted(desc.GRAPHS))
def test_config_files_hold_only_what_the_graph_changes_from_the_node_defaults(graph):
    """config/<graph>.yaml has a section per node of the graph, and in it only declared
    parameters whose value differs from the node's default (for the graph's robot and, for the
    planner, its planner_preset), typed like the default: a default lives in one place, and a
    change of it reaches every graph that does not change it on purpose."""
    data = yaml.safe_load(desc.config_path(graph).read_text())
    robot = desc.GRAPHS[graph].robot
    nodes = {n.name for n in desc.GRAPHS[graph].nodes} - (
        {"video_prediction"} if robot == "go2" else set()
    )
    assert set(data) == nodes, f"{graph}.yaml sections {sorted(data)} != nodes {sorted(nodes)}"
    for node in sorted(nodes):
        section = data[node]["ros__parameters"]
        preset = section.get("planner_preset", "") if node == "planner" else ""
        declared = _declared(NODE_MODULES[node], robot, preset)
        assert set(section) <= set(declared), (
            f"{graph}.yaml {node}: {set(section) - set(declared)} not declared"
        )
        for key, value in section.items():
            assert type(value) is type(declared[key]), (
                f"{graph}.yaml {node}.{key}: {value!r} vs {declared[key]!r}"
            )
            assert value != declared[key], (
                f"{graph}.yaml {node}.{key}: {value!r} is the node's default; leave it out"
            )
    for node in ("mujoco_driver", "adapter", "safety_supervisor"):  # the graph's robot
        default = _declared(NODE_MODULES[node], robot)["robot"]
        assert data[node]["ros__parameters"].get("robot", default) == robot, node


@pytest.mark.parametrize("graph", sorted(desc.GRAPHS))
def test_the_planner_takes_its_settings_from_the_preset_the_graph_names(graph):
    """A graph's planner section names its robot and preset and no MPPI value, so the node's
    defaults (the preset's PlannerConfig factory, the robot's control rate) are what it runs:
    go2_flat's official preset cannot keep an old value of a preset setting."""
    robot = desc.GRAPHS[graph].robot
    section = yaml.safe_load(desc.config_path(graph).read_text())["planner"]["ros__parameters"]
    assert section == {
        "robot": robot,
        "planner_preset": "official" if graph == "go2_flat" else robot,
    }
    preset = section["planner_preset"]
    declared = _declared(NODE_MODULES["planner"], robot, preset)
    factory = planner_config_for(robot_spec(robot), preset)
    for field in PLANNER_FIELDS:
        assert declared[field] == getattr(factory, field), f"planner.{field}"
    assert declared["control_rate_hz"] == robot_spec(robot).control_rate_hz
    if preset == "official":  # the official controller differs from the self-trained Go2 preset
        own = _declared(NODE_MODULES["planner"], robot)
        assert {k for k in declared if declared[k] != own[k]} == {
            "temperature", "warm_start", "value_discount_offset", "clamp_actions"
        }  # fmt: skip
        return
    # the node's defaults follow the robot: a Go2 graph's planner differs from a UR5e graph's
    other = _declared(NODE_MODULES["planner"], "ur5e" if robot == "go2" else "go2")
    assert {k for k in declared if declared[k] != other[k]} == {
        "control_rate_hz", "max_observation_age_s", "policy_noise_std", "temperature", "init_std",
        "horizon",
    }  # fmt: skip


def test_launch_arguments_are_typed_as_the_parameters_they_set():
    graph = desc.resolve(
        "go2_slope",
        {"checkpoint": "/ck", "seed": "3", "speed": "1", "friction": "0.13", "lockstep": "on"},
    )
    driver = next(n for n in graph.nodes if n.name == "mujoco_driver").overrides
    assert driver["seed"] == 3 and driver["episodes"] == 0 and driver["lockstep"] is True
    assert driver["speed"] == 1.0 and type(driver["speed"]) is float
    assert driver["panel_friction"] == 0.13 and driver["variant"] == "real"


def test_launch_files_parse_and_read_the_shared_description():
    helper = ast.parse((ROOT / "launch" / "_simdist_graph.py").read_text())
    calls = {
        f"{n.func.value.id}.{n.func.attr}"
        for n in ast.walk(helper)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
    }
    assert {"desc.resolve", "desc.graph_args"} <= calls
    imports = {a.name for n in ast.walk(helper) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert {"launch_description", "Node", "DeclareLaunchArgument", "OpaqueFunction"} <= imports
    for graph in desc.GRAPHS:
        tree = ast.parse((ROOT / "launch" / f"{graph}.launch.py").read_text())
        funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "generate_launch_description" in funcs
        (ret,) = [
            n for n in ast.walk(funcs["generate_launch_description"]) if isinstance(n, ast.Return)
        ]
        assert isinstance(ret.value, ast.Call) and ret.value.func.id == "generate"
        assert [a.value for a in ret.value.args] == [graph]


# -- supervision: real node processes ------------------------------------------------------------


def _replay_bag(path, seconds: int):
    """A bag whose replay takes `seconds` (one /joint_states message per second)."""

    t = TYPESTORE.types
    msg = t["sensor_msgs/msg/JointState"](
        header=t["std_msgs/msg/Header"](
            stamp=t["builtin_interfaces/msg/Time"](sec=1, nanosec=0), frame_id=""
        ),
        name=["a"],
        position=np.zeros(1),
        velocity=np.zeros(0),
        effort=np.zeros(0),
    )
    with EpisodeBagWriter(path, EpisodeMeta(task="peg")) as bag:
        bag.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        for k in range(seconds):
            bag.write("/joint_states", (1 + k) * 1_000_000_000, msg)


def _started_pids(output: str) -> dict[str, int]:
    pids = {}
    for line in output.splitlines():
        if line.startswith("[simdist] started "):
            name, pid = line[len("[simdist] started ") :].split(" (pid ")
            pids[name] = int(pid.rstrip(")"))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launcher_exits_non_zero_when_a_node_dies_and_stops_the_others(tmp_path, ros_domain):
    checkpoint = make_checkpoint(tmp_path / "ck")
    out = subprocess.run(
        [SIMDIST, "launch", "peg", "robot:=replay", f"bag:={tmp_path / 'missing'}",
         f"checkpoint:={checkpoint}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode == 1, log
    assert "node replay died with exit code 1" in log
    assert "[replay] replay: " in log and "not a bag directory" in log  # one line, no trace
    assert "[replay] Traceback" not in log
    pids = _started_pids(out.stderr)
    assert set(pids) == {"replay", "ingestion", "planner"}
    assert not any(_alive(p) for p in pids.values()), "a node outlived the launcher"


def test_a_checkpoint_that_cannot_be_loaded_ends_the_graph_with_one_line(tmp_path, ros_domain):
    _replay_bag(tmp_path / "ep", seconds=120)
    out = subprocess.run(
        [SIMDIST, "launch", "peg", "robot:=replay", f"bag:={tmp_path / 'ep'}",
         f"checkpoint:={tmp_path / 'nonexistent'}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode == 1, log
    assert "planner: cannot load checkpoint" in log and "wait_for_checkpoint" in log
    assert "node planner died with exit code 1" in log and "[planner] Traceback" not in log


@pytest.mark.slow  # launches a graph and kills its recorder
def test_a_killed_recorder_is_respawned_and_control_goes_on(tmp_path, ros_domain):
    _replay_bag(tmp_path / "ep", seconds=120)
    checkpoint = make_checkpoint(tmp_path / "ck")
    proc = subprocess.Popen(
        [SIMDIST, "launch", "peg", "robot:=replay", f"bag:={tmp_path / 'ep'}",
         f"checkpoint:={checkpoint}", "record:=true", f"bag_dir:={tmp_path / 'bags'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    head = _read_until(proc, "started recorder (pid")
    time.sleep(8.0)  # every node up
    assert proc.poll() is None, proc.communicate()
    os.kill(_started_pids(head)["recorder"], signal.SIGKILL)
    time.sleep(4.0)
    assert proc.poll() is None, "the graph stopped with the recorder"
    proc.send_signal(signal.SIGINT)
    stdout, rest = proc.communicate(timeout=60)
    stderr = head + rest
    assert proc.returncode == 0, stdout + stderr
    assert "node recorder exited with code -9; respawning it" in stderr
    assert stderr.count("started recorder (pid") == 2
    pids = _started_pids(stderr)  # the newest pid of each node
    assert set(pids) == {"replay", "ingestion", "planner", "recorder"}
    assert not any(_alive(p) for p in pids.values())


def _read_until(proc, marker: str) -> str:
    """The launcher's stderr up to the line holding `marker` (the rest stays unread)."""
    text = ""
    while marker not in text:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"the launcher ended before {marker!r}:\n{text}")
        text += line
    return text


def test_supervisor_escalates_and_dumps_the_stack_of_a_node_that_ignores_signals(tmp_path, capsys):
    """A node deaf to SIGINT and SIGTERM gets SIGABRT, which prints where it hangs, then dies."""
    script = tmp_path / "deaf_node"
    script.write_text(
        f"#!{sys.executable}\n"
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "def hang_here():\n"
        "    print('deaf and up', flush=True)\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "hang_here()\n"
    )
    script.chmod(0o755)
    graph = desc.ResolvedGraph(
        graph="deaf",
        args={},
        env={},
        nodes=(desc.ResolvedNode("deaf", str(script), tmp_path / "none.yaml"),),
    )
    logs = []
    sup = launcher.Supervisor(graph, launcher.Escalation(0.5, 0.5, 5.0), log=logs.append)
    sup.start()  # the launcher's own environment (PYTHONFAULTHANDLER) and output pump
    output, deadline = "", time.monotonic() + 30.0
    while "[deaf] deaf and up" not in output and time.monotonic() < deadline:
        time.sleep(0.05)
        output += capsys.readouterr().out
    assert "[deaf] deaf and up" in output, output
    sup.shutdown()
    output += capsys.readouterr().out
    assert sup.procs["deaf"].returncode == -signal.SIGABRT, output
    assert logs[-2:] == ["escalating to SIGTERM for ['deaf']", "escalating to SIGABRT for ['deaf']"]
    assert "in hang_here" in output, output


def _wait_for_nodes(names: set[str], proc: subprocess.Popen, timeout_s: float) -> None:
    """Until every named node is discovered on this test's ROS domain (or fail with the output)."""
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        probe = rclpy.create_node("sigint_probe", context=context)
        deadline = time.monotonic() + timeout_s
        while not names <= set(probe.get_node_names()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, (
                f"nodes not up: {names - set(probe.get_node_names())}"
            )
            time.sleep(0.2)
        probe.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)


def test_launcher_forwards_sigint_to_every_node(tmp_path, ros_domain):
    _replay_bag(tmp_path / "ep", seconds=120)
    checkpoint = make_checkpoint(tmp_path / "ck")
    proc = subprocess.Popen(
        [SIMDIST, "launch", "peg", "robot:=replay", f"bag:={tmp_path / 'ep'}",
         f"checkpoint:={checkpoint}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # SIGINT only once every node is in the ROS graph: the test is about a running graph, not
    # about a signal racing a node's start-up
    _wait_for_nodes({"replay", "ingestion", "planner"}, proc, timeout_s=60.0)
    time.sleep(1.0)  # their spin loops running
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout + stderr
    assert "stop requested; forwarding SIGINT" in stderr
    assert "escalating" not in stderr, f"a node ignored SIGINT:\n{stderr}\n{stdout[-6000:]}"
    pids = _started_pids(stderr)
    assert len(pids) == 3 and not any(_alive(p) for p in pids.values())


@pytest.mark.parametrize("graph", sorted(desc.GRAPHS))
def test_replay_defaults_to_the_drivers_topics(graph):
    """A replayed graph recomputes what follows the driver: the replay publishes only the
    driver's topics, never recorded observations or actions on top of the recomputed ones."""
    section = yaml.safe_load(desc.config_path(graph).read_text())["replay"]["ros__parameters"]
    robot = desc.GRAPHS[graph].robot
    assert section["topics"] == ros_msgs.driver_topics(robot_spec(robot))
    assert not any(
        t.startswith(("/simdist/observation", "/simdist/action")) for t in section["topics"]
    )


def test_replay_skips_listed_topics_the_bag_lacks_and_refuses_a_list_it_has_none_of(tmp_path):
    _replay_bag(tmp_path / "ep", seconds=2)
    rclpy.init()
    try:
        driver = ros_msgs.driver_topics(robot_spec("ur5e"))
        node = ReplayNode(
            parameter_overrides=[
                Parameter("bag", value=str(tmp_path / "ep")),
                Parameter("topics", value=driver),
            ]
        )
        assert node.topics == ["/joint_states"]  # the bag's only driver topic
        node.destroy_node()
        with pytest.raises(ValueError, match="none of the topics"):
            ReplayNode(
                parameter_overrides=[
                    Parameter("bag", value=str(tmp_path / "ep")),
                    Parameter("topics", value=["/tcp_pose"]),
                ]
            )
    finally:
        rclpy.shutdown()


def _tick_bag(path, ticks: int, period_ns: int):
    """A bag of `ticks` driver ticks: proprio (JointState) stamped with its own bag time."""
    t = TYPESTORE.types
    with EpisodeBagWriter(path, EpisodeMeta(task="peg")) as bag:
        bag.add_topic("/simdist/robot/proprio", "sensor_msgs/msg/JointState")
        for k in range(ticks):
            ns = 1_000_000_000 + k * period_ns
            stamp = t["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9)
            msg = t["sensor_msgs/msg/JointState"](
                header=t["std_msgs/msg/Header"](stamp=stamp, frame_id=""),
                name=["a"], position=np.zeros(1), velocity=np.zeros(0), effort=np.zeros(0),
            )  # fmt: skip
            bag.write("/simdist/robot/proprio", ns, msg)


def test_lockstep_replay_waits_for_each_ticks_answer_and_goes_on_after_a_missing_one(
    tmp_path, ros_domain
):
    """With answer_topic set, a tick's successor is published only after its answer came (here
    0.2 s late, where the bag spaces ticks 20 ms apart). A tick whose first copy went unheard
    (a late joiner) is published again and answered then; a tick left unanswered costs
    answer_timeout_s, is counted, and replay goes on; the last tick is not waited for."""
    from rclpy.executors import SingleThreadedExecutor  # noqa: PLC0415
    from sensor_msgs.msg import JointState  # noqa: PLC0415
    from trajectory_msgs.msg import JointTrajectory  # noqa: PLC0415

    ticks, late, silent = 6, 2, 4  # tick indices: answered on its second copy / never
    _tick_bag(tmp_path / "ep", ticks, 20_000_000)
    rclpy.init()  # on ros_domain (ROS_DOMAIN_ID)
    events: list[tuple[str, int]] = []
    try:
        answerer = rclpy.create_node("answerer")
        pub = answerer.create_publisher(JointTrajectory, "/simdist/action", 100)

        def answer(stamp_msg, ns: int) -> None:
            out = JointTrajectory()
            out.header.stamp = stamp_msg
            events.append(("answer", ns))
            pub.publish(out)

        def on_tick(m: JointState) -> None:
            ns = ros_msgs.stamp_ns(m.header.stamp)
            copies = events.count(("tick", ns))
            events.append(("tick", ns))
            k = len({n for kind, n in events if kind == "tick"}) - 1
            if k == late and copies == 0 or k in (silent, ticks - 1):
                return  # the late tick's first copy, the silent tick and the last
            if ("answer", ns) not in events:
                threading.Timer(0.2, answer, (m.header.stamp, ns)).start()

        answerer.create_subscription(JointState, "/simdist/robot/proprio", on_tick, 100)
        executor = SingleThreadedExecutor()
        executor.add_node(answerer)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        node = ReplayNode(
            parameter_overrides=[
                Parameter("bag", value=str(tmp_path / "ep")),
                Parameter("answer_topic", value="/simdist/action"),
                Parameter("answer_timeout_s", value=2.0),
                Parameter("answer_republish_s", value=0.5),
                Parameter("start_delay_s", value=0.0),
                Parameter("wait_for_subscribers", value=["/simdist/robot/proprio@answerer"]),
            ],
        )
        assert node.play() == ticks and node.unanswered == 1
        time.sleep(0.5)
        node.destroy_node()
        executor.shutdown()
    finally:
        rclpy.shutdown()
    stamps = list(dict.fromkeys(ns for kind, ns in events if kind == "tick"))
    assert len(stamps) == ticks
    assert events.count(("tick", stamps[late])) >= 2  # published again while waiting
    assert events.count(("tick", stamps[0])) == 1  # an answered tick goes out once
    for k, ns in enumerate(stamps[:-1]):
        later = events.index(("tick", stamps[k + 1]))
        if k == silent:
            assert ("answer", ns) not in events[:later]
        else:  # the next tick only after this one's answer
            assert events.index(("answer", ns)) < later, events


def test_a_replay_waiting_for_ready_plays_only_once_it_says_true(tmp_path, ros_domain):
    from std_msgs.msg import Bool  # noqa: PLC0415

    _replay_bag(tmp_path / "ep", seconds=1)
    rclpy.init()
    try:
        params = [
            Parameter("bag", value=str(tmp_path / "ep")),
            Parameter("wait_for_ready", value=desc.RECORDER_READY_TOPIC),
            Parameter("wait_timeout_s", value=1.0),
            Parameter("start_delay_s", value=0.0),
        ]
        node = ReplayNode(parameter_overrides=params)
        with pytest.raises(TimeoutError, match="true on /simdist/recorder/ready"):
            node.play()
        assert node.published == 0
        latched = rclpy.qos.QoSProfile(
            depth=1, durability=rclpy.qos.DurabilityPolicy.TRANSIENT_LOCAL
        )
        ready = rclpy.create_node("ready")
        ready.create_publisher(Bool, desc.RECORDER_READY_TOPIC, latched).publish(Bool(data=True))
        node.destroy_node()
        params[2] = Parameter("wait_timeout_s", value=60.0)  # discovery under load
        node = ReplayNode(parameter_overrides=params)
        assert node.play() == 1
        node.destroy_node()
        ready.destroy_node()
    finally:
        rclpy.shutdown()


@pytest.mark.parametrize("graph", sorted(desc.GRAPHS))
def test_the_recorder_is_ready_only_once_every_observation_topic_the_adapter_reads_matched(graph):
    """The lockstep driver's first tick waits for the recorder's ready: every observation topic
    it records (what `real_data` needs from a bag) is among its ready topics, so no episode is
    recorded before the recorder hears them (a bag without one is skipped by the adapter)."""
    section = yaml.safe_load(desc.config_path(graph).read_text())["recorder"]["ros__parameters"]
    recorded = [t.split()[0] for t in section["expected_topics"]]
    observations = [t for t in recorded if t.startswith("/simdist/observation/")]
    assert observations and set(observations) <= set(section["ready_topics"])
