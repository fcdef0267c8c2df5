"""Driver nodes: MuJoCo lockstep on DDS, and the hardware backends' translation logic.

The hardware backends run without hardware.
"""

import importlib.util
import json
import socket
import subprocess
import sys
import threading

import mujoco
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import Image, Imu, JointState
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.go2.config import DEFAULT_POSE_UNITREE, UNITREE_JOINT_NAMES
from robot_drivers.go2_sdk_driver_node import Go2SdkDriverNode
from robot_drivers.hardware.go2_sdk import (
    LOWCMD_SIZE,
    POS_STOP,
    VEL_STOP,
    Go2SdkBackend,
    Go2SdkConfig,
    LowCmd,
    crc32_mpeg2,
    import_sdk,
    lowcmd_crc,
    pack_lowcmd,
    unitree_crc,
)
from robot_drivers.hardware.robotiq import RobotiqGripper
from robot_drivers.hardware.ur5e_rtde import (
    RTDE_PORT,
    UR5eRtdeBackend,
    UR5eRtdeConfig,
    connect_ur5e,
)
from robot_drivers.ingestion_node import IngestionNode
from robot_drivers.interface import Command, CommandKind, FaultLevel
from robot_drivers.mujoco_driver_node import CLOCK_START_NS, MujocoDriverNode, SimEpisode
from robot_drivers.registry import make_task
from robot_drivers.safety_node import SafetyNode
from robot_drivers.ur5e.backend import MujocoUR5eBackend
from robot_drivers.ur5e.config import SceneConfig
from robot_drivers.ur5e.so3 import rotvec_to_mat
from robot_drivers.ur5e_rtde_driver_node import UR5eRtdeDriverNode
from robot_ros_helpers import RosHarness, diagnostics_text
from simdist_adapter.recorder_node import RecorderNode
from simdist_planner.ros.launch_description import RECORDER_READY_TOPIC


# --- MuJoCo driver ---------------------------------------------------------------------------
def test_sim_episode_is_deterministic_and_maps_safe_actions():
    def run():
        ep = SimEpisode(make_task("go2_flat", "sim"))
        ep.reset(3)
        rng = np.random.default_rng(0)
        for _ in range(5):
            r = ep.apply(
                Command(CommandKind.JOINT_POSITION, rng.normal(0, 0.3, 12).astype(np.float32))
            )
        r = ep.apply(Command(CommandKind.HOLD))
        return ep, r

    (ep1, r1), (_, r2) = run(), run()
    np.testing.assert_array_equal(r1.obs.proprio, r2.obs.proprio)
    assert ep1.step_count == 6 and not r1.done
    with pytest.raises(ValueError, match="expects joint_position"):
        ep1.apply(Command(CommandKind.EE_DELTA, np.zeros(7, np.float32)))
    damped = ep1.apply(Command(CommandKind.DAMP))
    assert damped.done and damped.info["damped"]
    with pytest.raises(RuntimeError, match="call ~/reset"):
        ep1.apply(Command(CommandKind.HOLD))


def test_mujoco_driver_lockstep_advances_only_on_the_ticks_command(ros_domain):
    ros = RosHarness(ros_domain)
    try:
        node = _go2_flat_driver(ros, seed=5, lockstep_republish_s=0.2, max_steps=2, episodes=2)
        proprio = ros.collect(JointState, "/simdist/robot/proprio")
        clock = ros.collect(ClockMsg, "/clock")
        heights = ros.collect(Image, "/height_map")
        episodes = ros.collect(String, "/simdist/episode")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        cmd = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        assert ros.spin_until(
            lambda: proprio and clock and heights and cmd.get_subscription_count()
        )
        t0 = ros_msgs.stamp_ns(proprio[0].header.stamp)
        assert t0 == CLOCK_START_NS and ros_msgs.stamp_ns(clock[0].clock) == t0
        ros.spin_for(0.5)  # no command: the driver republishes tick 0 but never advances
        assert {ros_msgs.stamp_ns(m.header.stamp) for m in proprio} == {t0} and len(proprio) >= 2
        assert node.tick == 0
        spec = node.spec
        p, c = ros_msgs.proprio_from_msg(proprio[0], spec)
        assert p.shape == (spec.proprio_dim,) and c.shape == (3,)
        assert heights and (heights[0].height, heights[0].width, heights[0].encoding) == (
            21,
            15,
            "32FC1",
        )

        names = ros_msgs.action_names("go2")
        action = Command(CommandKind.JOINT_POSITION, np.zeros(12, np.float32))
        cmd.publish(ros_msgs.command_to_msg(action, names, t0 + 1, 0.02))  # wrong tick: dropped
        assert ros.spin_until(lambda: node.dropped == 1)
        assert node.tick == 0
        cmd.publish(ros_msgs.command_to_msg(action, names, t0, 0.02))
        period = round(1e9 / spec.control_rate_hz)
        assert ros.spin_until(
            lambda: any(ros_msgs.stamp_ns(m.header.stamp) == t0 + period for m in proprio)
        )
        assert ros.spin_until(lambda: ros_msgs.stamp_ns(clock[-1].clock) == t0 + period)
        assert node.tick == 1
        assert ros.spin_until(lambda: json.loads(episodes[-1].data)["step"] == 1)
        status = json.loads(episodes[-1].data)
        assert (
            status["seed"] == 5 and status["task"] == "go2_flat" and np.isfinite(status["reward"])
        )
        # The status is published at once and again every second: the first copy may go out
        # before /diagnostics has matched the probe (a loaded machine), the next one does not.
        assert ros.spin_until(
            lambda: any(
                "dropped a command" in m for _, m in diagnostics_text(diags, "mujoco_driver")
            )
        )

        reset = ros.probe.create_client(Trigger, "/mujoco_driver/reset")
        res = ros.call(reset, Trigger.Request())
        assert res.success and "episode 1 seed 5" in res.message
        assert ros.spin_until(
            lambda: any(ros_msgs.stamp_ns(m.header.stamp) == t0 + 2 * period for m in proprio)
        )
        assert ros.spin_until(lambda: json.loads(episodes[-1].data)["episode"] == 1)
        assert json.loads(episodes[-1].data)["step"] == 0

        # max_steps=2: two commands end episode 1 (the last of episodes=2);
        # the next finishes the node
        for k in range(2, 5):
            cmd.publish(ros_msgs.command_to_msg(action, names, t0 + k * period, 0.02))
            assert ros.spin_until(lambda: node.tick == k + 1 or node.finished.done())
        assert node.finished.done() and node.tick == 4
        assert ros.spin_until(lambda: json.loads(episodes[-1].data)["step"] == 2)
        last = json.loads(episodes[-1].data)
        assert last["truncated"] and last["done"] and last["episode"] == 1
    finally:
        ros.close()


def test_a_robot_that_falls_at_once_does_not_restart_episodes_in_a_loop(ros_domain):
    """Episodes of one step (max_steps 1) are all short (min_episode_steps 5): after
    max_short_episodes of them in a row the driver starts no new episode until ~/reset."""
    ros = RosHarness(ros_domain)
    try:
        node = _go2_flat_driver(
            ros, max_steps=1, min_episode_steps=5, max_short_episodes=2, lockstep_republish_s=0.2
        )
        proprio = ros.collect(JointState, "/simdist/robot/proprio")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        cmd = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        assert ros.spin_until(lambda: proprio and cmd.get_subscription_count())
        names = ros_msgs.action_names("go2")
        action = Command(CommandKind.JOINT_POSITION, np.zeros(12, np.float32))
        for _ in range(8):  # answer every tick the driver publishes
            stamp = ros_msgs.stamp_ns(proprio[-1].header.stamp)
            cmd.publish(ros_msgs.command_to_msg(action, names, stamp, 0.02))
            ros.spin_until(lambda s=stamp: ros_msgs.stamp_ns(proprio[-1].header.stamp) > s, 1.0)
        assert node.episode_id == 1  # episodes 0 and 1 were short: episode 2 never started
        assert any(
            lvl == 2 and "2 episodes in a row ended within 5 steps" in m
            for lvl, m in diagnostics_text(diags, "mujoco_driver")
        )
        reset = ros.probe.create_client(Trigger, "/mujoco_driver/reset")
        assert ros.call(reset, Trigger.Request()).success
        assert node.episode_id == 2 and not node.episode.done
    finally:
        ros.close()


def test_episodes_the_supervisor_damps_at_once_do_not_pause_the_driver(ros_domain):
    """DAMP ends a simulated episode. The supervisor's watchdog damps every tick while the
    planner is silent or late, so each next episode ends at its first tick: those are not
    falls, and the driver keeps starting episodes (the planner can then catch up); a fall
    within min_episode_steps still counts."""
    ros = RosHarness(ros_domain)
    try:
        node = _go2_flat_driver(
            ros, min_episode_steps=5, max_short_episodes=2, lockstep_republish_s=0.2
        )
        proprio = ros.collect(JointState, "/simdist/robot/proprio")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        cmd = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        assert ros.spin_until(lambda: proprio and cmd.get_subscription_count())
        for _ in range(12):  # DAMP answers every tick the driver publishes
            stamp = ros_msgs.stamp_ns(proprio[-1].header.stamp)
            damp = Command(CommandKind.DAMP)
            cmd.publish(ros_msgs.command_to_msg(damp, ros_msgs.action_names("go2"), stamp, 0.02))
            ros.spin_until(lambda s=stamp: ros_msgs.stamp_ns(proprio[-1].header.stamp) > s, 1.0)
        assert node.episode_id >= 4, node.episode_id  # 1-tick episodes went on past the limit
        assert not any(
            "episodes in a row ended within" in m
            for _, m in diagnostics_text(diags, "mujoco_driver")
        )
    finally:
        ros.close()


def test_driver_runs_the_stand_in_at_the_commanded_speed_and_panel_friction(ros_domain):
    """The launch arguments speed:= and friction:= reach the task: the panels, the episode limit
    and the command the robot publishes (which is what the planner is commanded)."""
    ros = RosHarness(ros_domain)
    try:
        values = {"robot": "go2", "task": "slippery_slope", "variant": "real", "speed": 0.3}
        values["panel_friction"] = 0.12
        node = ros.add(
            MujocoDriverNode(
                context=ros.context,
                parameter_overrides=[Parameter(k, value=v) for k, v in values.items()],
            )
        )
        task = node.episode.task
        assert task.backend.terrain.panel_friction == 0.12 and task.max_steps == 758
        proprio = ros.collect(JointState, "/simdist/robot/proprio")
        assert ros.spin_until(lambda: proprio)
        command = ros_msgs.split_proprio_msg(proprio[-1])[1]
        np.testing.assert_allclose(command[0], 0.3)
        with pytest.raises(ValueError, match="speed: not an option of task .peg."):
            MujocoDriverNode(
                context=ros.context,
                parameter_overrides=[Parameter("task", value="peg"), Parameter("speed", value=0.3)],
            )
    finally:
        ros.close()


def test_driver_warns_when_a_second_node_publishes_robot_commands(ros_domain):
    """Only the safety supervisor should publish /simdist/safe_command; a second publisher
    (anything on the domain can join) is reported on /diagnostics."""
    ros = RosHarness(ros_domain)
    try:
        _go2_flat_driver(ros)
        diags = ros.collect(DiagnosticArray, "/diagnostics")

        def source(level):
            return any(
                lvl == level and "publisher" in m
                for lvl, m in diagnostics_text(diags, "mujoco_driver")
                if "safe_command" in m
            )

        supervisor = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        assert ros.spin_until(lambda: supervisor.get_subscription_count() and source(0))
        intruder = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        assert ros.spin_until(lambda: source(1), 10.0)
        assert any(
            "2 publishers on /simdist/safe_command" in m
            for _, m in diagnostics_text(diags, "mujoco_driver")
        )
        ros.probe.destroy_publisher(intruder)
    finally:
        ros.close()


def _go2_flat_driver(ros, **params) -> MujocoDriverNode:
    """A MuJoCo Go2 on flat ground on the harness's context, with these parameter values."""
    values = {"robot": "go2", "task": "go2_flat", **params}
    overrides = [Parameter(name, value=value) for name, value in values.items()]
    return ros.add(MujocoDriverNode(context=ros.context, parameter_overrides=overrides))


def _waiting_driver(ros, timeout_s: float) -> MujocoDriverNode:
    return _go2_flat_driver(ros, wait_for_ready=RECORDER_READY_TOPIC, ready_timeout_s=timeout_s)


def test_lockstep_driver_starts_when_the_recorder_hears_every_ready_topic(ros_domain, tmp_path):
    """The first tick waits for the recorder's latched ready, which waits for a matched publisher
    on each ready topic (here the planner's /simdist/action, published by the probe), then for
    ready_settle_s (the publisher's side of discovery)."""
    ros = RosHarness(ros_domain)
    try:
        recorder = ros.add(
            RecorderNode(
                context=ros.context,
                parameter_overrides=[
                    Parameter("bag_dir", value=str(tmp_path)),
                    Parameter("ready_topics", value=["/simdist/action"]),
                    Parameter("ready_settle_s", value=4.0),
                ],
            )
        )
        driver = _waiting_driver(ros, timeout_s=60.0)
        clock = ros.collect(ClockMsg, "/clock")
        ready = ros.collect(Bool, RECORDER_READY_TOPIC)
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        ros.spin_for(1.5)
        assert not clock and not ready and driver.tick == 0
        assert any("waiting for" in m for _, m in diagnostics_text(diags, "mujoco_driver"))
        assert any(
            "waiting for publishers on ['/simdist/action']" in m
            for _, m in diagnostics_text(diags, "recorder")
        )
        ros.probe.create_publisher(JointTrajectory, "/simdist/action", 10)
        # matched (diagnostics go out about once a second), but ready only 4 s after the match
        assert ros.spin_until(
            lambda: any("settling 4.0 s" in m for _, m in diagnostics_text(diags, "recorder")),
            timeout_s=10.0,
        )
        assert not clock and not ready
        assert ros.spin_until(lambda: clock and ready, timeout_s=10.0)
        assert ready[0].data and ros_msgs.stamp_ns(clock[0].clock) == CLOCK_START_NS
        assert recorder._unmatched is None
        with pytest.raises(ValueError, match="not among the recordable expected_topics"):
            RecorderNode(
                context=ros.context,
                parameter_overrides=[
                    Parameter("bag_dir", value=str(tmp_path)),
                    Parameter("ready_topics", value=["/not/recorded"]),
                ],
            )
    finally:
        ros.close()


def test_lockstep_driver_starts_anyway_when_no_ready_comes(ros_domain):
    ros = RosHarness(ros_domain)
    try:
        _waiting_driver(ros, timeout_s=0.5)
        clock = ros.collect(ClockMsg, "/clock")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        assert ros.spin_until(lambda: clock, timeout_s=10.0)
        assert ros_msgs.stamp_ns(clock[0].clock) == CLOCK_START_NS
        assert ros.spin_until(
            lambda: any("started anyway" in m for _, m in diagnostics_text(diags, "mujoco_driver"))
        )
    finally:
        ros.close()


def test_mujoco_driver_ur5e_publishes_cameras_and_tcp(ros_domain):
    ros = RosHarness(ros_domain)
    try:
        ros.add(
            MujocoDriverNode(
                context=ros.context,
                parameter_overrides=[
                    Parameter("cameras", value=["overhead"]),
                    Parameter("image_height", value=24),
                    Parameter("image_width", value=32),
                ],
            )
        )
        imgs = ros.collect(Image, "/camera/overhead/image_raw")
        tcp = ros.collect(PoseStamped, "/tcp_pose")
        joints = ros.collect(JointState, "/joint_states")
        assert ros.spin_until(lambda: imgs and tcp and joints, 10.0)
        image = ros_msgs.image_from_msg(imgs[0], expected_hw=(24, 32))
        assert image.std() > 0  # a rendered scene, not a blank buffer
        pos, quat = ros_msgs.pose_from_msg(tcp[0])
        assert 0.1 < pos[2] < 0.6 and abs(np.linalg.norm(quat) - 1) < 1e-6
        assert len(joints[0].name) == 6 and imgs[0].header.stamp == tcp[0].header.stamp
    finally:
        ros.close()


# --- UR5e over ur_rtde -------------------------------------------------------------------------


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_ur_rtde_real_client_fails_clearly_on_a_closed_port():
    if not _port_closed(RTDE_PORT):
        pytest.skip(f"something listens on 127.0.0.1:{RTDE_PORT}")
    with pytest.raises(
        ConnectionError, match=r"UR5e at 127\.0\.0\.1: could not open RTDE on port 30004"
    ):
        connect_ur5e("127.0.0.1", UR5eRtdeConfig())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "robot_drivers.ur5e_rtde_driver_node",
            "--ros-args",
            "-p",
            "robot_ip:=127.0.0.1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "could not open RTDE on port 30004" in proc.stdout + proc.stderr


class FakeReceive:
    """Stands in for the physical arm's RTDE receive side."""

    def __init__(self):
        self.tcp = [0.1, -0.5, 0.3, np.pi, 0.0, 0.0]  # base frame, tool pointing down
        self.q, self.qd = [0.0, -1.57, 1.57, -1.57, -1.57, 0.0], [0.0] * 6
        self.connected, self.protective, self.estop, self.mode, self.scaling = (
            True,
            False,
            False,
            7,
            1.0,
        )

    def getActualTCPPose(self):
        return list(self.tcp)

    def getActualQ(self):
        return list(self.q)

    def getActualQd(self):
        return list(self.qd)

    def getSpeedScalingCombined(self):
        return self.scaling

    def isConnected(self):
        return self.connected

    def isProtectiveStopped(self):
        return self.protective

    def isEmergencyStopped(self):
        return self.estop

    def getRobotMode(self):
        return self.mode

    def reconnect(self):
        self.connected = True

    def disconnect(self):
        self.connected = False


class FakeControl:
    """Stands in for the physical arm's RTDE control side; records what the driver sends."""

    def __init__(self):
        self.servo, self.kicks, self.stops, self.connected, self.running = [], 0, 0, True, True

    def servoL(self, pose, speed, accel, t, lookahead, gain):
        self.servo.append((list(pose), t, lookahead, gain))

    def kickWatchdog(self):
        self.kicks += 1

    def servoStop(self, *a):
        self.stops += 1

    def isConnected(self):
        return self.connected

    def isProgramRunning(self):
        return self.running

    def reconnect(self):
        self.connected = True

    def stopScript(self):
        pass

    def disconnect(self):
        self.connected = False


class FakeGripper:
    def __init__(self):
        self.moves, self.pos = [], 0

    def move(self, p):
        self.moves.append(p)
        self.pos = p

    def position(self):
        return self.pos

    def close(self):
        pass


def _ur5e(clock, world_yaw=np.pi):
    recv, ctrl, grip = FakeReceive(), FakeControl(), FakeGripper()
    cfg = UR5eRtdeConfig(world_yaw=world_yaw)  # a turned mount, so the frame change is exercised
    return UR5eRtdeBackend(ctrl, recv, cfg, grip, clock=lambda: clock[0]), recv, ctrl, grip


def test_ur5e_rtde_frames_match_the_mujoco_model():
    """The sim world is the controller base frame (UR5e DH kinematics) and the default TCP offset
    is the sim's flange -> pinch transform, so the real proprio means what the sim's does."""

    sim = MujocoUR5eBackend(SceneConfig(cameras=()))
    m, d = sim.model, sim.data
    q = (0.3, -1.2, 1.4, -1.7, -1.4, 0.5)
    d.qpos[sim.controller.qadr] = q
    mujoco.mj_forward(m, d)
    T = np.eye(4)  # UR5e DH parameters (Universal Robots' published values)
    for qi, di, ai, al in zip(
        q,
        (0.1625, 0, 0, 0.1333, 0.0997, 0.0996),
        (0, -0.425, -0.3922, 0, 0, 0),
        (np.pi / 2, 0, 0, np.pi / 2, -np.pi / 2, 0),
    ):
        ct, st, ca, sa = np.cos(qi), np.sin(qi), np.cos(al), np.sin(al)
        T = T @ np.array(
            [
                [ct, -st * ca, st * sa, ai * ct],
                [st, ct * ca, -ct * sa, ai * st],
                [0, sa, ca, di],
                [0, 0, 0, 1],
            ]
        )
    flange = m.site("attachment_site").id
    np.testing.assert_allclose(d.site_xpos[flange], T[:3, 3], atol=2e-3)
    np.testing.assert_allclose(d.site_xmat[flange].reshape(3, 3), T[:3, :3], atol=2e-3)
    off = np.asarray(UR5eRtdeConfig().tcp_offset)
    pos, mat = sim.controller.tcp_pose(d)
    np.testing.assert_allclose(T[:3, :3] @ off[:3] + T[:3, 3], pos, atol=2e-3)
    np.testing.assert_allclose(T[:3, :3] @ rotvec_to_mat(off[3:]), mat, atol=2e-3)
    assert UR5eRtdeConfig().world_yaw == 0.0


def test_ur5e_rtde_interpolates_targets_in_the_world_frame_and_kicks_the_watchdog():
    clock = [100.0]
    ur, recv, ctrl, grip = _ur5e(clock)
    obs = ur.reset()
    # world = Rz(pi) * base: base (0.1, -0.5) is world (-0.1, 0.5), the sim's peg region
    np.testing.assert_allclose(obs.proprio[12:15], [-0.1, 0.5, 0.3], atol=1e-9)
    ur.act(Command(CommandKind.EE_DELTA, np.array([0.01, 0, 0, 0, 0, 0, 1.0], np.float32)))
    assert grip.moves == [255] and ur.observe().proprio[-1] == 1.0
    clock[0] += 0.1  # half of the 0.2 s control period
    half = ur.servo_step()
    np.testing.assert_allclose(half[:3], [0.1 - 0.005, -0.5, 0.3], atol=1e-6)  # world +x = base -x
    clock[0] += 0.2
    full = ur.servo_step()
    np.testing.assert_allclose(full[:3], [0.09, -0.5, 0.3], atol=1e-6)
    assert ctrl.kicks == 2 and ctrl.servo[-1][1:] == (1 / 500.0, 0.1, 300.0)
    ur.act(Command(CommandKind.EE_DELTA, np.array([0.0, 0.0, -1.0, 0, 0, 0, 1.0], np.float32)))
    clock[0] += 1.0
    np.testing.assert_allclose(ur.servo_step()[2], 0.3 - 0.05, atol=1e-6)  # capped at max_step_pos
    ur.act(Command(CommandKind.DAMP))  # the arm's "damp" is a servo stop
    n = len(ctrl.servo)
    assert ur.servo_step() is None and ctrl.stops == 1 and len(ctrl.servo) == n and ctrl.kicks == 4


def test_ur5e_rtde_stops_and_scaling_become_faults():
    ur, recv, ctrl, _ = _ur5e([0.0])
    ur.reset()
    recv.scaling = 0.4
    ur.observe()
    assert [f.code for f in ur.faults()] == ["speed_scaling"] and ur.faults()[
        0
    ].level == FaultLevel.WARN
    recv.protective = True
    assert ur.faults()[0].code == "protective_stop" and ur.faults()[0].level == FaultLevel.ERROR
    with pytest.raises(RuntimeError, match="refusing a command while faulted: protective_stop"):
        ur.act(Command(CommandKind.EE_DELTA, np.zeros(7, np.float32)))
    with pytest.raises(RuntimeError, match="protective stop"):
        ur.reset()
    recv.protective, recv.estop = False, True
    assert ur.faults()[0].code == "emergency_stop"
    recv.estop, ctrl.running = False, False
    assert "script_stopped" in [f.code for f in ur.faults()]


def test_ur5e_driver_node_reports_a_disconnect_and_ignores_commands(ros_domain):
    ros = RosHarness(ros_domain)
    clock = [0.0]
    backend, recv, ctrl, _ = _ur5e(clock)
    try:
        ros.add(
            UR5eRtdeDriverNode(
                backend=backend,
                context=ros.context,
                parameter_overrides=[Parameter("publish_rate_hz", value=50.0)],
            )
        )
        tcp = ros.collect(PoseStamped, "/tcp_pose")
        proprio = ros.collect(JointState, "/simdist/robot/proprio")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        cmd = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        reset = ros.probe.create_client(Trigger, "/ur5e_driver/reset")
        assert ros.spin_until(lambda: tcp and proprio and cmd.get_subscription_count())
        assert ros_msgs.proprio_from_msg(proprio[-1], backend.spec)[0].shape == (22,)
        assert ros.call(reset, Trigger.Request()).success
        move = Command(CommandKind.EE_DELTA, np.array([0, 0, 0.01, 0, 0, 0, 0], np.float32))
        names, now_ns = ros_msgs.action_names("ur5e"), ros.probe.get_clock().now().nanoseconds
        late = now_ns - 2_000_000_000  # answers an observation 2 s old: max_command_age_s 0.5
        cmd.publish(ros_msgs.command_to_msg(move, names, late, 0.2))
        assert ros.spin_until(
            lambda: any(
                lvl == 2 and "max_command_age_s" in m
                for lvl, m in diagnostics_text(diags, "ur5e_driver")
            )
        )
        assert backend._segment is None  # the late command never moved the arm: HOLD instead
        cmd.publish(
            ros_msgs.command_to_msg(move, names, ros.probe.get_clock().now().nanoseconds, 0.2)
        )
        assert ros.spin_until(lambda: backend._segment is not None)

        recv.connected = False  # the cable is pulled
        assert ros.spin_until(
            lambda: any(
                lvl == 2 and "disconnected" in m
                for lvl, m in diagnostics_text(diags, "ur5e_driver")
            )
        )
        backend._segment = None
        cmd.publish(
            ros_msgs.command_to_msg(move, names, ros.probe.get_clock().now().nanoseconds, 0.2)
        )
        assert ros.spin_until(
            lambda: any("command ignored" in m for _, m in diagnostics_text(diags, "ur5e_driver"))
        )
        assert backend._segment is None  # nothing reached the arm
        res = ros.call(reset, Trigger.Request())  # reset reconnects (the fake link comes back)
        assert res.success and recv.connected
    finally:
        ros.close()


# --- Go2 over unitree_sdk2py ----------------------------------------------------------------


def _crc32_core_reference(words):
    """The SDK's crc32_core, bit by bit over 32-bit words (as in its C and Python sources)."""
    crc, poly = 0xFFFFFFFF, 0x04C11DB7
    for data in words:
        xbit = 1 << 31
        for _ in range(32):
            crc = ((crc << 1) & 0xFFFFFFFF) ^ poly if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
            if data & xbit:
                crc ^= poly
            xbit >>= 1
    return crc


def test_unitree_crc_matches_the_sdk_algorithm():
    assert crc32_mpeg2(b"123456789") == 0x0376E6E7  # the CRC-32/MPEG-2 catalogue check value
    assert _crc32_core_reference([0x12345678, 0x9ABCDEF0]) == crc32_mpeg2(
        bytes.fromhex("123456789ABCDEF0")
    )
    cmd = LowCmd()
    cmd.motor_cmd[0].q, cmd.motor_cmd[0].kp, cmd.motor_cmd[11].kd = 0.5, 25.0, 0.5
    packed = pack_lowcmd(cmd)
    assert len(packed) == LOWCMD_SIZE == 812
    words = np.frombuffer(packed, dtype="<u4")[:-1].tolist()  # every word but the crc field
    assert lowcmd_crc(cmd) == unitree_crc(packed) == _crc32_core_reference(words)
    before = lowcmd_crc(cmd)
    cmd.crc = 0xDEADBEEF  # the crc field itself is not covered
    assert lowcmd_crc(cmd) == before
    cmd.motor_cmd[5].q = 0.25
    assert lowcmd_crc(cmd) != before


class FakeLowState:
    """Stands in for rt/lowstate from the physical robot."""

    class Motor:
        def __init__(self, q, dq):
            self.q, self.dq = q, dq

    class Imu:
        quaternion = [1.0, 0.0, 0.0, 0.0]
        gyroscope = [0.0, 0.0, 0.1]
        accelerometer = [0.0, 0.0, 9.81]

    def __init__(self, q, dq, quat=(1.0, 0.0, 0.0, 0.0)):
        self.motor_state = [self.Motor(a, b) for a, b in zip(q, dq)] + [self.Motor(0.0, 0.0)] * 8
        self.imu_state = self.Imu()
        self.imu_state.quaternion = list(quat)


def test_go2_lowcmd_joint_order_units_and_damping_on_fault():
    clock, sent = [0.0], []
    dog = Go2SdkBackend(
        sent.append, LowCmd, Go2SdkConfig(lowstate_timeout_s=0.1), clock=lambda: clock[0]
    )
    assert dog.build_lowcmd().motor_cmd[0].kp == 0.0  # damped until reset
    q = DEFAULT_POSE_UNITREE + np.arange(12) * 0.01
    dog.on_lowstate(FakeLowState(q, np.full(12, 0.5)))
    dog.set_base_velocity([0.4, 0.0, 0.0])
    obs = dog.reset()
    np.testing.assert_allclose(
        obs.proprio[9:21], np.arange(12) * 0.01, atol=1e-6
    )  # joint_pos - default
    np.testing.assert_allclose(
        obs.proprio[6:9], [0, 0, -1], atol=1e-9
    )  # upright: gravity straight down
    a = np.zeros(12, np.float32)
    a[UNITREE_JOINT_NAMES.index("RL_calf_joint")] = 1.0
    dog.act(Command(CommandKind.JOINT_POSITION, a))
    cmd = dog.build_lowcmd()
    assert cmd.motor_cmd[11].q == pytest.approx(
        DEFAULT_POSE_UNITREE[11] + 0.25, abs=1e-6
    )  # SDK index 11 = RL calf
    assert cmd.motor_cmd[0].q == pytest.approx(DEFAULT_POSE_UNITREE[0])
    assert (cmd.motor_cmd[3].kp, cmd.motor_cmd[3].kd, cmd.motor_cmd[3].mode) == (25.0, 0.5, 1)
    assert (cmd.motor_cmd[15].q, cmd.motor_cmd[15].dq, cmd.motor_cmd[15].kp) == (
        POS_STOP,
        VEL_STOP,
        0.0,
    )
    assert cmd.head == [0xFE, 0xEF] and cmd.crc == lowcmd_crc(cmd)
    dog.publish_lowcmd()
    assert sent and sent[-1].crc == lowcmd_crc(sent[-1])

    clock[0] += 0.5  # rt/lowstate stops: the link is gone
    assert dog.faults()[0].code == "disconnected"
    damp = dog.build_lowcmd()
    assert all(damp.motor_cmd[i].kp == 0.0 and damp.motor_cmd[i].kd == 0.5 for i in range(12))
    assert damp.motor_cmd[0].q == POS_STOP
    dog.on_lowstate(FakeLowState(q, np.zeros(12)))
    assert dog.build_lowcmd().motor_cmd[0].kp == 0.0  # still latched until reset
    dog.reset()
    assert dog.build_lowcmd().motor_cmd[0].kp == 25.0

    tilted = (np.cos(0.7), np.sin(0.7), 0.0, 0.0)  # rolled 1.4 rad: fallen
    dog.on_lowstate(FakeLowState(q, np.zeros(12), tilted))
    assert dog.faults()[0].code == "fallen" and dog.build_lowcmd().motor_cmd[0].kp == 0.0
    with pytest.raises(RuntimeError, match="cannot leave damping mode: base tilt"):
        dog.reset()


def test_unitree_sdk_import_error_says_how_to_install():
    if importlib.util.find_spec("unitree_sdk2py") is not None:
        pytest.skip("unitree_sdk2py is installed here")
    with pytest.raises(ImportError, match="github.com/unitreerobotics/unitree_sdk2_python"):
        import_sdk()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "robot_drivers.go2_sdk_driver_node",
            "--ros-args",
            "-p",
            "network_interface:=lo",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "not on PyPI: install it from" in proc.stdout + proc.stderr


def _lockstep_run(domain: int, ticks: int) -> tuple[list, list, MujocoDriverNode]:
    """driver -> ingestion -> (the probe as planner) -> safety -> driver, on /clock, tick by tick.
    The probe's "policy" depends on the observation, so any nondeterminism would show."""

    ros = RosHarness(domain)
    try:
        sim_time = Parameter("use_sim_time", value=True)
        driver = _go2_flat_driver(ros, seed=7, lockstep_republish_s=0.2)
        ros.add(
            IngestionNode(
                context=ros.context,
                parameter_overrides=[
                    sim_time,
                    Parameter("cameras", value=[""]),
                    Parameter("height_map_rows", value=21),
                    Parameter("height_map_cols", value=15),
                    Parameter("proprio_dim", value=35),
                ],
            )
        )
        ros.add(
            SafetyNode(
                context=ros.context, parameter_overrides=[sim_time, Parameter("robot", value="go2")]
            )
        )
        act = ros.probe.create_publisher(JointTrajectory, "/simdist/action", 10)
        names = ros_msgs.action_names("go2")
        planned, seen = [], []

        def plan(msg):  # answer every observation once, stamped with its tick
            stamp = ros_msgs.stamp_ns(msg.header.stamp)
            if stamp not in planned:
                planned.append(stamp)
                proprio, _ = ros_msgs.split_proprio_msg(msg)
                seen.append(proprio)
                a = Command(CommandKind.JOINT_POSITION, (-2.0 * proprio[9:21]).astype(np.float32))
                act.publish(ros_msgs.command_to_msg(a, names, stamp, 0.02))

        ros.probe.create_subscription(JointState, "/simdist/observation/proprio", plan, 10)
        assert ros.spin_until(lambda: driver.tick >= ticks, 30.0), f"stalled at tick {driver.tick}"
        return planned[:ticks], seen[:ticks], driver
    finally:
        ros.close()


def test_lockstep_loop_through_ingestion_and_safety_is_deterministic(ros_domain):
    planned, seen, driver = _lockstep_run(ros_domain, 10)
    period = round(1e9 / driver.spec.control_rate_hz)
    assert planned == [CLOCK_START_NS + k * period for k in range(10)]  # every tick, in order
    assert driver.dropped == 0
    planned2, seen2, _ = _lockstep_run(ros_domain, 10)
    assert planned2 == planned
    np.testing.assert_array_equal(np.stack(seen2), np.stack(seen))  # bit-identical closed loop
    assert not np.allclose(seen[0], seen[-1])  # the robot did move


def test_mujoco_driver_realtime_mode_holds_without_commands(ros_domain):
    ros = RosHarness(ros_domain)
    try:
        node = _go2_flat_driver(ros, lockstep=False)
        proprio = ros.collect(JointState, "/simdist/robot/proprio")
        assert ros.spin_until(lambda: node.tick >= 5 and len(proprio) >= 3, 10.0)  # runs on its own
        stamps = [ros_msgs.stamp_ns(m.header.stamp) for m in proprio]
        assert stamps == sorted(stamps) and stamps[0] > 10**18  # wall-clock stamps
        np.testing.assert_array_equal(node.episode.task.backend._last_action, 0.0)  # HOLD = stand
        cmd = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        a = Command(CommandKind.JOINT_POSITION, np.full(12, 0.1, np.float32))
        assert ros.spin_until(lambda: cmd.get_subscription_count() > 0)
        cmd.publish(ros_msgs.command_to_msg(a, ros_msgs.action_names("go2"), 0, 0.02))
        assert ros.spin_until(lambda: np.allclose(node.episode.task.backend._last_action, 0.1))
    finally:
        ros.close()


def test_go2_driver_node_damps_and_reports_when_lowstate_stops(ros_domain):

    sent = []
    backend = Go2SdkBackend(
        sent.append, LowCmd, Go2SdkConfig(lowcmd_rate_hz=100.0, lowstate_timeout_s=0.2)
    )
    state = FakeLowState(DEFAULT_POSE_UNITREE, np.zeros(12))
    backend.on_lowstate(state)
    ros = RosHarness(ros_domain)
    try:
        ros.add(Go2SdkDriverNode(backend=backend, context=ros.context))
        imu = ros.collect(Imu, "/imu")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        cmd = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        reset = ros.probe.create_client(Trigger, "/go2_driver/reset")

        def feed():  # the robot keeps streaming rt/lowstate while "connected"
            backend.on_lowstate(state)
            return False

        assert ros.spin_until(lambda: feed() or (imu and cmd.get_subscription_count()))
        assert ros.call(reset, Trigger.Request()).success
        a = Command(CommandKind.JOINT_POSITION, np.full(12, 0.2, np.float32))
        now_ns = ros.probe.get_clock().now().nanoseconds
        cmd.publish(ros_msgs.command_to_msg(a, ros_msgs.action_names("go2"), now_ns, 0.02))
        target = DEFAULT_POSE_UNITREE[0] + 0.25 * 0.2
        assert ros.spin_until(lambda: feed() or abs(sent[-1].motor_cmd[0].q - target) < 1e-5)
        assert sent[-1].motor_cmd[0].kp == 25.0 and sent[-1].crc == lowcmd_crc(sent[-1])

        # rt/lowstate stops: damping on the wire, an ERROR diagnostic, commands ignored
        assert ros.spin_until(
            lambda: sent[-1].motor_cmd[0].kp == 0.0 and sent[-1].motor_cmd[0].kd == 0.5
        )
        assert ros.spin_until(
            lambda: any(
                lvl == 2 and "disconnected" in m for lvl, m in diagnostics_text(diags, "go2_driver")
            )
        )
        res = ros.call(reset, Trigger.Request())
        assert not res.success and "no rt/lowstate" in res.message
    finally:
        ros.close()  # destroy_node stops the lowcmd thread


def test_robotiq_socket_protocol():

    ours, robot = socket.socketpair()
    seen = []

    def urcap():  # stands in for the gripper's URCap server on the controller
        buf = b""
        while True:
            data = robot.recv(1024)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                seen.append(line.decode())
                reply = {b"GET POS": b"POS 200", b"SET SPE 0": b"?"}.get(
                    line, b"ack"
                )  # "?" = refused
                robot.sendall(reply + b"\n")

    threading.Thread(target=urcap, daemon=True).start()
    grip = RobotiqGripper(ours)
    assert seen == ["SET ACT 1", "SET GTO 1", "SET SPE 255", "SET FOR 150"]  # activation
    grip.move(255)
    assert seen[-1] == "SET POS 255" and grip.position() == 200
    with pytest.raises(ValueError, match="0..255"):
        grip.move(300)
    with pytest.raises(RuntimeError, match="refused SET SPE 0"):
        RobotiqGripper(ours, speed=0)  # activation fails loudly when the gripper refuses a setting
    grip.close()
    robot.close()
