"""The video-prediction node over real DDS: bad requests are refused with the reason, a valid plan
yields predicted frames, a preview strip and a status; parameters are validated on set."""

import json
import threading
import time

import numpy as np
import pytest
import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image
from std_msgs.msg import String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from robot_drivers import ros_msgs
from sim_video_world_model.backbones import build_backbone
from sim_video_world_model.checkpoint import ModelBundle, save_bundle
from sim_video_world_model.config import BackboneConfig
from sim_video_world_model.video_node import VideoPredictionNode
from simforcing_helpers import TINY


def tiny_student(path) -> str:
    """An untrained tiny student (sim conditioning on, 5 frames of 16 x 16, UR5e actions)."""
    cfg = BackboneConfig(tiny=TINY)
    ae, den = build_backbone(cfg)
    den.add_sim_conditioning()
    ckpt = str(path)
    save_bundle(
        ckpt,
        ModelBundle(
            ae,
            den,
            cfg,
            {
                "num_frames": 5,
                "image_size": [16, 16],
                "stage": "student",
                "action_low": [-0.05] * 6 + [0.0],
                "action_high": [0.05] * 6 + [1.0],
            },
        ),
    )
    return ckpt


@pytest.fixture
def graph(tmp_path):
    ckpt = tiny_student(tmp_path / "student")
    rclpy.init()
    node = VideoPredictionNode(
        parameter_overrides=[
            Parameter("checkpoint", value=ckpt),
            Parameter("camera", value="side"),
            Parameter("mask_task", value=""),
            Parameter("guidance", value=0.0),
            Parameter("real_steps", value=2),
        ]
    )
    client = rclpy.create_node("video_test_client")
    executor = MultiThreadedExecutor()
    executor.add_node(node)
    executor.add_node(client)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    yield node, client
    executor.shutdown()
    node.destroy_node()
    client.destroy_node()
    rclpy.try_shutdown()
    thread.join(timeout=5)


def wait_for(pred, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def call(client, srv):
    future = srv.call_async(Trigger.Request())
    assert wait_for(future.done), "no service response"
    return future.result()


def plan_msg(rows):
    msg = JointTrajectory(joint_names=list(ros_msgs.UR5E_ACTION_NAMES[: len(rows[0])]))
    msg.header.stamp = ros_msgs.stamp_msg(1_000_000_000)
    msg.points = [JointTrajectoryPoint(positions=[float(v) for v in r]) for r in rows]
    return msg


def test_bad_requests_then_a_prediction(graph):
    node, client = graph
    srv = client.create_client(Trigger, "/video_prediction/predict")
    assert srv.wait_for_service(timeout_sec=20.0)
    frames, previews, status = [], [], []
    client.create_subscription(Image, "/simdist/predicted_video/side", frames.append, 10)
    client.create_subscription(Image, "/simdist/predicted_video/side/preview", previews.append, 10)
    client.create_subscription(
        String,
        "/simdist/predicted_video/side/status",
        lambda m: status.append(json.loads(m.data)),
        10,
    )
    pub_image = client.create_publisher(Image, "/camera/side/image_raw", 2)
    pub_plan = client.create_publisher(JointTrajectory, "/simdist/plan", 2)

    res = call(client, srv)
    assert not res.success and "no image received yet on /camera/side/image_raw" in res.message

    image = np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    assert wait_for(
        lambda: pub_image.get_subscription_count() > 0 and pub_plan.get_subscription_count() > 0
    )
    pub_image.publish(ros_msgs.image_to_msg(image, 1_000_000_000, "side_camera"))
    assert wait_for(lambda: node._image is not None)
    res = call(client, srv)
    assert not res.success and "no valid plan" in res.message

    pub_plan.publish(plan_msg([[0.01, 0.0, 0.0]] * 3))  # 3-D actions for a 7-D model
    assert wait_for(
        lambda: any("action dimension 3, expected 7" in s.get("error", "") for s in status)
    )
    res = call(client, srv)
    assert not res.success and "action dimension 3, expected 7" in res.message

    nan_plan = [[0.0] * 7, [float("nan")] + [0.0] * 6]
    pub_plan.publish(plan_msg(nan_plan))
    assert wait_for(lambda: any("NaN" in s.get("error", "") for s in status))

    pub_plan.publish(
        plan_msg([[0.01, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]] * 3)
    )  # 3 actions, model horizon 4
    assert wait_for(lambda: any(s.get("ok") for s in status), timeout=60.0), status
    done = next(s for s in status if s.get("ok"))
    assert done["frames"] == 3 and done["guidance"] == 0.0
    assert wait_for(lambda: len(frames) >= 3 and previews)
    assert (frames[0].height, frames[0].width, frames[0].encoding) == (16, 16, "rgb8")
    assert previews[0].width == 16 * 4  # observed frame + 3 predictions side by side
    res = call(client, srv)
    assert res.success and res.message.startswith("queued prediction #")


def test_parameters_are_validated_on_set(graph):
    node, _ = graph
    results = node.set_parameters([Parameter("guidance", value=1.5)])
    assert not results[0].successful and "guidance" in results[0].reason
    results = node.set_parameters([Parameter("device", value="tpu")])
    assert not results[0].successful and "cpu, cuda or cuda:N" in results[0].reason
    results = node.set_parameters([Parameter("real_steps", value=0)])
    assert not results[0].successful
    assert node.set_parameters([Parameter("sim_steps", value=3)])[0].successful


def test_missing_checkpoint_is_a_clear_error():
    rclpy.init()
    try:
        with pytest.raises(ValueError, match="checkpoint"):
            VideoPredictionNode()
    finally:
        rclpy.try_shutdown()


def test_a_job_cut_short_by_shutdown_ends_the_worker_quietly(tmp_path, monkeypatch):
    """Ctrl-C shuts the context down while the worker predicts (on a loaded machine a job outlasts
    the node's 5 s join): its publish then fails, and the worker ends without a traceback, as the
    planner's planning thread does."""
    crashes = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)
    rclpy.init()
    node = VideoPredictionNode(
        parameter_overrides=[
            Parameter("checkpoint", value=tiny_student(tmp_path / "student")),
            Parameter("mask_task", value=""),
            Parameter("guidance", value=0.0),
        ]
    )
    started = threading.Event()

    def slow_predict(image, plan, settings, joint_pos=None):
        started.set()
        assert wait_for(lambda: not node.context.ok(), 30.0)
        return np.zeros((len(plan), *image.shape), np.uint8)

    node.predictor.predict = slow_predict
    worker = node._worker
    try:
        image = np.zeros((16, 16, 3), np.uint8)
        node._jobs.put_nowait((1, (image, 1), (np.zeros((2, 7), np.float32), 1), {}))
        assert wait_for(started.is_set)
        rclpy.shutdown()  # destroys the node: its worker is mid-job
        worker.join(timeout=60)
        assert not worker.is_alive() and not crashes, [c.exc_value for c in crashes]
    finally:
        rclpy.try_shutdown()
