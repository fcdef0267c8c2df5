"""Ingestion: checks, resize, alignment, staleness (core) and the node's bad-input behaviour on
DDS."""

import math

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image, JointState
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.ingestion import Ingestion, IngestionConfig, StreamError, resize
from robot_drivers.ingestion_node import IngestionNode
from robot_drivers.interface import Command, CommandKind, Observation, ProprioTerm, RobotSpec
from robot_drivers.safety_node import SafetyNode
from robot_ros_helpers import RosHarness, diagnostics_text


def _bilinear_reference(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear resize one output pixel at a time: pixel (i, j) samples the input at
    ((i + 0.5) h / th - 0.5, (j + 0.5) w / tw - 0.5) clamped to the image (half-pixel centres,
    OpenCV's INTER_LINEAR convention), rounded half up."""
    h, w = image.shape[:2]
    th, tw = size
    img = image.astype(np.float64)
    out = np.zeros((th, tw, image.shape[2]))
    for i in range(th):
        y = min(max((i + 0.5) * h / th - 0.5, 0.0), h - 1.0)
        y0, fy = int(y), y - int(y)
        y1 = min(y0 + 1, h - 1)
        for j in range(tw):
            x = min(max((j + 0.5) * w / tw - 0.5, 0.0), w - 1.0)
            x0, fx = int(x), x - int(x)
            x1 = min(x0 + 1, w - 1)
            top = img[y0, x0] * (1 - fx) + img[y0, x1] * fx
            bottom = img[y1, x0] * (1 - fx) + img[y1, x1] * fx
            out[i, j] = top * (1 - fy) + bottom * fy
    return np.floor(out + 0.5).astype(np.uint8)


def test_resize_integer_downscale_is_the_exact_block_average():
    """4x down-scale: the mean of each 4x4 block, rounded half up. Nearest-neighbour would return
    one pixel of the block and bilinear (samples at 4i + 1.5) the mean of its middle 2x2 only."""
    img = np.random.default_rng(0).integers(0, 256, (8, 12, 3), dtype=np.uint8)
    img[:4, :4] = np.array(
        [[255, 0, 0, 255], [0, 10, 10, 0], [0, 10, 10, 0], [255, 0, 0, 255]], np.uint8
    )[:, :, None]
    img[4:, :4] = np.array([0, 1] * 8, np.uint8).reshape(4, 4, 1)  # mean 0.5: rounds up to 1
    out = resize(img, (2, 3))
    assert out.shape == (2, 3, 3) and out.dtype == np.uint8
    assert out[0, 0].tolist() == [66] * 3  # (4 x 255 + 4 x 10) / 16 = 66.25; nearest 255 or 10
    assert out[1, 0].tolist() == [1] * 3
    blocks = img.astype(np.float64).reshape(2, 4, 3, 4, 3).mean(axis=(1, 3))
    np.testing.assert_array_equal(out, np.floor(blocks + 0.5).astype(np.uint8))
    flat = np.full((30, 50, 3), 77, np.uint8)
    assert np.all(resize(flat, (224, 224)) == 77) and resize(flat, (224, 224)).shape == (
        224,
        224,
        3,
    )


def test_resize_other_scales_are_bilinear_with_half_pixel_centres():
    # 2 -> 4 columns: samples at x = 0 (clamped), 0.25, 0.75, 1 (clamped); nearest gives 0 0 200 200
    up = resize(np.array([[0, 200]], np.uint8)[:, :, None].repeat(3, 2), (1, 4))
    assert up[0, :, 0].tolist() == [0, 50, 150, 200]
    # 5 -> 2 columns: samples at x = 0.75 and 3.25; nearest gives 100 0 (or 0 0), a box average
    # over [0, 2.5) and [2.5, 5) gives 40 80
    down = resize(np.array([[0, 100, 0, 0, 200]], np.uint8)[:, :, None].repeat(3, 2), (1, 2))
    assert down[0, :, 0].tolist() == [75, 50]
    img = np.random.default_rng(1).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    for size in ((7, 11), (45, 64), (224, 224)):
        out = resize(img, size)
        ref = _bilinear_reference(img, size)
        # float32 in the code, float64 here: a value at exactly .5 may round either way
        assert out.shape == ref.shape and np.abs(out.astype(int) - ref).max() <= 1, size
        assert np.mean(out == ref) > 0.99, size
    ramp = np.tile(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], (8, 1, 3))
    half = resize(ramp, (5, 40))
    assert np.all(np.diff(half[0, :, 0].astype(int)) >= 0)  # monotone ramp stays monotone


def S(seconds):
    return round(seconds * 1e9)


def _core(**kw):
    cfg = dict(cameras=("a", "b"), image_size=(8, 8), camera_size=(16, 16), align_tolerance_s=0.01)
    cfg.update(kw)
    return Ingestion(IngestionConfig(**cfg))


def test_alignment_nearest_stamp_within_tolerance():
    core = _core()
    img = np.zeros((16, 16, 3), np.uint8)
    core.add_proprio(S(1.0), np.ones(3), None, ["x[0]", "x[1]", "x[2]"])
    core.add_image("a", S(0.995), img)
    assert core.pop_aligned() == []  # camera b still missing: wait
    core.add_image("b", S(0.9), img)  # too far from 1.0 ...
    core.add_image("b", S(1.004), img + 1)  # ... but this one is within 10 ms
    (obs,) = core.pop_aligned()
    assert (
        obs.stamp_ns == S(1.0)
        and obs.images["b"].shape == (8, 8, 3)
        and obs.images["b"][0, 0, 0] == 1
    )
    core.add_proprio(S(1.0), np.ones(3), None, ["x[0]", "x[1]", "x[2]"])  # the tick republished
    (again,) = core.pop_aligned()  # re-emitted, same stamp and content, for a late-joining planner
    assert again.stamp_ns == S(1.0) and again.images["b"][0, 0, 0] == 1
    core.add_proprio(S(2.0), np.ones(3), None, ["x[0]", "x[1]", "x[2]"])
    core.add_image("a", S(2.05), img)  # newer than 2.0 + tolerance: 2.0 can never complete
    assert core.pop_aligned() == [] and core.unmatched == 1


def test_bad_samples_raise_clear_errors():
    core = _core(proprio_dim=3)
    with pytest.raises(StreamError, match=r"camera a: image is 10x16 \(HxW\), expected 16x16"):
        core.add_image("a", S(0.0), np.zeros((10, 16, 3), np.uint8))
    with pytest.raises(StreamError, match="NaN"):
        core.add_proprio(S(0.0), np.array([0.0, math.nan, 0.0]), None, ["x[0]", "x[1]", "x[2]"])
    with pytest.raises(StreamError, match="expected proprio_dim=3"):
        core.add_proprio(S(0.0), np.zeros(4), None, ["x"] * 4)
    with pytest.raises(ros_msgs.MessageError, match="encoding 'mono8'.*expected 'rgb8'"):
        ros_msgs.image_from_msg(Image(height=2, width=2, encoding="mono8", step=2, data=bytes(4)))
    short = ros_msgs.image_to_msg(np.zeros((4, 4, 3), np.uint8), 0, "cam")
    short.data = bytes(10)
    with pytest.raises(ros_msgs.MessageError, match="10 data bytes, expected step \\* height = 48"):
        ros_msgs.image_from_msg(short)
    assert core.pop_aligned() == []  # nothing reached the output


def test_staleness_per_stream():
    core = _core(camera_timeout_s=0.2, proprio_timeout_s=1.0)
    img = np.zeros((16, 16, 3), np.uint8)
    core.add_proprio(S(1.0), np.ones(1), None, ["x[0]"])
    core.add_image("a", S(1.0), img)
    core.add_image("b", S(0.5), img)
    stale = core.stale(S(1.05))
    assert set(stale) == {"b"} and "0.550 s old" in stale["b"]


# --- the node on DDS: clear error, diagnostic, no observation, safe action, no crash ---------
def test_ingestion_node_bad_input_withholds_observation(ros_domain):
    ros = RosHarness(ros_domain)
    try:
        node = ros.add(
            IngestionNode(
                context=ros.context,
                parameter_overrides=[
                    Parameter("cameras", value=["front"]),
                    Parameter("image_height", value=32),
                    Parameter("image_width", value=32),
                    Parameter("camera_height", value=64),
                    Parameter("camera_width", value=64),
                    Parameter("camera_timeout_s", value=0.3),
                ],
            )
        )
        ros.add(
            SafetyNode(
                context=ros.context,
                parameter_overrides=[
                    Parameter("robot", value="go2"),
                    Parameter("observation_timeout_s", value=0.3),
                ],
            )
        )
        obs_imgs = ros.collect(Image, "/simdist/observation/image/front")
        obs_prop = ros.collect(JointState, "/simdist/observation/proprio")
        safe = ros.collect(JointTrajectory, "/simdist/safe_command")
        diags = ros.collect(DiagnosticArray, "/diagnostics")
        pub_p = ros.probe.create_publisher(JointState, "/simdist/robot/proprio", 10)
        pub_i = ros.probe.create_publisher(Image, "/camera/front/image_raw", 10)
        pub_a = ros.probe.create_publisher(JointTrajectory, "/simdist/action", 10)
        assert ros.spin_until(
            lambda: pub_p.get_subscription_count() >= 1 and pub_i.get_subscription_count() >= 1
        )
        names = ["base_lin_vel[0]", "base_lin_vel[1]", "command[0]"]

        def send(image, proprio, encoding="rgb8"):
            t = ros.probe.get_clock().now().nanoseconds
            if image is not None:
                msg = ros_msgs.image_to_msg(image, t, "front_camera")
                msg.encoding = encoding
                pub_i.publish(msg)
            pub_p.publish(ros_msgs.pack_proprio(names, proprio[:2], proprio[2:], t, "go2"))
            return t

        frame = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
        t0 = send(frame, np.array([0.1, 0.2, 0.5]))
        assert ros.spin_until(lambda: len(obs_prop) == 1)
        assert ros.spin_until(lambda: len(obs_imgs) == 1)
        assert (
            ros_msgs.stamp_ns(obs_prop[0].header.stamp)
            == t0
            == ros_msgs.stamp_ns(obs_imgs[0].header.stamp)
        )
        assert (obs_imgs[0].height, obs_imgs[0].width, obs_imgs[0].encoding) == (32, 32, "rgb8")
        assert list(obs_prop[0].name) == names and obs_prop[0].position[2] == pytest.approx(0.5)

        ros.spin_for(
            0.1
        )  # bad ticks below are > align_tolerance_s apart, so no older frame matches
        send(frame, np.array([0.1, 0.2, 0.5]), encoding="mono16")  # wrong encoding
        assert ros.spin_until(
            lambda: any("encoding 'mono16'" in m for _, m in diagnostics_text(diags, "ingestion"))
        )
        ros.spin_for(0.1)
        send(frame[:48], np.array([0.1, 0.2, 0.5]))  # wrong size
        assert ros.spin_until(
            lambda: any(
                "48x64 (HxW), expected 64x64" in m for _, m in diagnostics_text(diags, "ingestion")
            )
        )
        ros.spin_for(0.1)
        send(frame, np.array([math.nan, 0.2, 0.5]))  # NaN joint state
        assert ros.spin_until(
            lambda: any(lvl == 2 and "NaN" in m for lvl, m in diagnostics_text(diags, "ingestion"))
        )
        ros.spin_for(0.2)
        assert len(obs_prop) == 1  # none of the three bad ticks produced an observation

        for _ in range(5):  # stale camera: proprio keeps coming, the camera stopped
            send(None, np.array([0.1, 0.2, 0.5]))
            ros.spin_for(0.1)
        assert len(obs_prop) == 1
        assert ros.spin_until(
            lambda: any("stale" in m for lvl, m in diagnostics_text(diags, "ingestion") if lvl == 2)
        )
        t = ros.probe.get_clock().now().nanoseconds
        pub_a.publish(
            ros_msgs.command_to_msg(
                Command(CommandKind.JOINT_POSITION, np.zeros(12)),
                ros_msgs.action_names("go2"),
                t,
                0.02,
            )
        )
        assert ros.spin_until(lambda: any(ros_msgs.stamp_ns(m.header.stamp) == t for m in safe))
        assert [m for m in safe if ros_msgs.stamp_ns(m.header.stamp) == t][
            0
        ].header.frame_id == "hold"

        send(frame, np.array([0.3, 0.2, 0.5]))  # the camera is back: observations resume
        assert ros.spin_until(lambda: len(obs_prop) == 2)
        assert node.stats["rejected"] == 3
    finally:
        ros.close()


def test_observation_assembler_and_command_packing():
    spec = RobotSpec(
        name="go2",
        action_dim=12,
        control_rate_hz=50.0,
        proprio_terms=(ProprioTerm("q", 2),),
        height_map_shape=(3, 2),
        command_dim=1,
    )
    asm = ros_msgs.ObservationAssembler(cameras=("front",), has_height_map=True, spec=spec)
    obs_in = Observation(
        stamp=0.0, proprio=np.array([1.0, 2.0], np.float32), command=np.array([0.5], np.float32)
    )
    t = 5_000_000_123
    prop = ros_msgs.proprio_to_msg(obs_in, spec, t)
    assert list(prop.name) == ["q[0]", "q[1]", "command[0]"]
    assert asm.add_proprio(prop) is None  # arrival order does not matter
    assert asm.add_height_map(ros_msgs.height_map_to_msg(np.ones((3, 2), np.float32), t)) is None
    obs = asm.add_image(
        "front", ros_msgs.image_to_msg(np.zeros((4, 4, 3), np.uint8), t, "front_camera")
    )
    assert obs is not None and obs.stamp == pytest.approx(t * 1e-9)
    np.testing.assert_array_equal(obs.proprio, [1.0, 2.0])
    np.testing.assert_array_equal(obs.command, [0.5])
    assert obs.images["front"].shape == (4, 4, 3) and obs.height_map.shape == (3, 2)
    prop.name[1] = "dq[0]"
    with pytest.raises(ros_msgs.MessageError, match="layout differs from the spec at element 1"):
        asm.add_proprio(prop)
    with pytest.raises(ros_msgs.MessageError, match="expected 3x2"):
        asm.add_height_map(ros_msgs.height_map_to_msg(np.ones((2, 2), np.float32), t))

    cmd = Command(CommandKind.JOINT_POSITION, np.arange(12, dtype=np.float32))
    msg = ros_msgs.command_to_msg(cmd, ros_msgs.action_names("go2"), t, 0.02)
    back = ros_msgs.command_from_msg(msg, spec)
    assert back.kind == CommandKind.JOINT_POSITION and back.stamp == pytest.approx(t * 1e-9)
    np.testing.assert_array_equal(back.values, cmd.values)
    msg.header.frame_id = "fly"
    with pytest.raises(ros_msgs.MessageError, match="command kind 'fly' unknown"):
        ros_msgs.command_from_msg(msg)
    hold = ros_msgs.command_to_msg(Command(CommandKind.HOLD), ros_msgs.action_names("go2"), t, 0.02)
    assert (
        ros_msgs.command_from_msg(hold).kind == CommandKind.HOLD
        and list(hold.points[0].positions) == []
    )
