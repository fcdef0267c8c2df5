"""Driver nodes: MuJoCo lockstep on DDS, and the hardware backends' translation logic without hardware."""
import json

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.interface import Command, CommandKind
from robot_drivers.mujoco_driver_node import CLOCK_START_NS, MujocoDriverNode, SimEpisode
from robot_drivers.tasks import make_task
from robot_ros_helpers import RosHarness, diagnostics_text


# --- MuJoCo driver ---------------------------------------------------------------------------
def test_sim_episode_is_deterministic_and_maps_safe_actions():
    def run():
        ep = SimEpisode(make_task("go2_flat", "sim"))
        ep.reset(3)
        rng = np.random.default_rng(0)
        for _ in range(5):
            r = ep.apply(Command(CommandKind.JOINT_POSITION, rng.normal(0, 0.3, 12).astype(np.float32)))
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
        node = ros.add(MujocoDriverNode(context=ros.context, parameter_overrides=[
            Parameter("robot", value="go2"), Parameter("task", value="go2_flat"), Parameter("seed", value=5),
            Parameter("lockstep_republish_s", value=0.2)]))
        proprio = ros.collect(JointState, "/simdist/robot/proprio")
        clock = ros.collect(ClockMsg, "/clock")
        heights = ros.collect(Image, "/height_map")
        episodes = ros.collect(String, "/simdist/episode")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        cmd = ros.probe.create_publisher(JointTrajectory, "/simdist/safe_command", 10)
        assert ros.spin_until(lambda: proprio and clock and heights and cmd.get_subscription_count())
        t0 = ros_msgs.stamp_ns(proprio[0].header.stamp)
        assert t0 == CLOCK_START_NS and ros_msgs.stamp_ns(clock[0].clock) == t0
        ros.spin_for(0.5)  # no command: the driver republishes tick 0 but never advances
        assert {ros_msgs.stamp_ns(m.header.stamp) for m in proprio} == {t0} and len(proprio) >= 2
        assert node.tick == 0
        spec = node.spec
        p, c = ros_msgs.proprio_from_msg(proprio[0], spec)
        assert p.shape == (spec.proprio_dim,) and c.shape == (3,)
        assert heights and (heights[0].height, heights[0].width, heights[0].encoding) == (21, 15, "32FC1")

        names = ros_msgs.action_names("go2")
        action = Command(CommandKind.JOINT_POSITION, np.zeros(12, np.float32))
        cmd.publish(ros_msgs.command_to_msg(action, names, t0 + 1, 0.02))  # wrong tick: dropped
        assert ros.spin_until(lambda: node.dropped == 1)
        assert node.tick == 0
        cmd.publish(ros_msgs.command_to_msg(action, names, t0, 0.02))
        period = round(1e9 / spec.control_rate_hz)
        assert ros.spin_until(lambda: any(ros_msgs.stamp_ns(m.header.stamp) == t0 + period for m in proprio))
        assert ros.spin_until(lambda: ros_msgs.stamp_ns(clock[-1].clock) == t0 + period)
        assert node.tick == 1
        assert ros.spin_until(lambda: json.loads(episodes[-1].data)["step"] == 1)
        status = json.loads(episodes[-1].data)
        assert status["seed"] == 5 and status["task"] == "go2_flat" and np.isfinite(status["reward"])
        assert any("dropped a command" in m for _, m in diagnostics_text(diags, "mujoco_driver"))

        reset = ros.probe.create_client(Trigger, "/mujoco_driver/reset")
        res = ros.call(reset, Trigger.Request())
        assert res.success and "episode 1 seed 5" in res.message
        assert ros.spin_until(lambda: any(ros_msgs.stamp_ns(m.header.stamp) == t0 + 2 * period for m in proprio))
        assert ros.spin_until(lambda: json.loads(episodes[-1].data)["episode"] == 1)
        assert json.loads(episodes[-1].data)["step"] == 0
    finally:
        ros.close()


def test_mujoco_driver_ur5e_publishes_cameras_and_tcp(ros_domain):
    ros = RosHarness(ros_domain)
    try:
        ros.add(MujocoDriverNode(context=ros.context, parameter_overrides=[
            Parameter("cameras", value=["overhead"]), Parameter("image_height", value=24),
            Parameter("image_width", value=32)]))
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
