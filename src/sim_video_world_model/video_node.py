"""Video-prediction node: shows operators what the chosen camera will see under the planned chunk.

- Inputs: the latest `sensor_msgs/Image` of the camera (`/camera/<camera>/image_raw`), the
  planner's `/simdist/plan` (trajectory_msgs/JointTrajectory: one point per planned action, as the
  planner publishes it) and `/joint_states` (the measured joints for the robot mask).
- Triggers: every new plan (`predict_on_plan`) and the `~/predict` service (std_srvs/Trigger,
  latest image + latest valid plan). Both only QUEUE a job and return at once; one worker thread
  runs the model (newest job wins), so the node never blocks the planner or its own callbacks.
- Outputs: the predicted frames as `sensor_msgs/Image` on `/simdist/predicted_video/<camera>`,
  a side-by-side strip (observed frame, then the predictions) on `.../preview`, and a JSON status
  per job (or rejected plan) on `.../status`.
- Bad requests (no image yet, no valid plan, wrong action dimension, NaN) are refused with the
  reason: in the service response, and on the status topic for plans.
- Parameters `sim_steps`, `real_steps`, `guidance`, `device` are ranged and validated on set; a
  change applies from the next job.
"""

from __future__ import annotations

import json
import queue
import threading
import time

import numpy as np
import rclpy
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.described import Param
from robot_drivers.node_params import NodeParams
from robot_drivers.node_spin import spin_until_shutdown
from robot_drivers.registry import make_task
from sim_video_world_model.paired_data import JointStateMaskRenderer
from sim_video_world_model.predictor import (
    PredictSettings,
    RequestError,
    VideoPredictor,
    check_device,
)

PARAMS = (
    Param(
        "checkpoint",
        "",
        "SimForcing student checkpoint directory (simforcing-train output)",
        read_only=True,
    ),
    Param("camera", "side", "camera whose future frames are predicted", read_only=True),
    Param(
        "image_topic", "", "input image topic; empty: /camera/<camera>/image_raw", read_only=True
    ),
    Param(
        "plan_topic",
        "/simdist/plan",
        "planned action chunks (trajectory_msgs/JointTrajectory)",
        read_only=True,
    ),
    Param(
        "mask_task",
        "peg",
        "MuJoCo task whose calibrated camera renders the robot mask from /joint_states; "
        "empty: no mask (guidance must be 0)",
        read_only=True,
    ),
    Param("predict_on_plan", True, "predict for every new plan (else only on ~/predict)"),
    Param("sim_steps", 1, "N_s: sampling steps of the sim-latent stage", 1, 50),
    Param("real_steps", 10, "N_r: sampling steps of the real-video stage", 1, 50),
    Param(
        "guidance",
        0.6,
        "w: sim guidance weight (0 skips the sim stage, 1 is one pass per step)",
        0.0,
        1.0,
    ),
    Param("device", "cpu", "torch device of the model: cpu, cuda or cuda:N"),
    Param("control_period_s", 0.2, "time between predicted frames (stamps)", 1e-3, 10.0),
)


def _check(name, value, values) -> str | None:
    return check_device(value) if name == "device" else None


class VideoPredictionNode(Node):
    def __init__(self, **kwargs):
        super().__init__("video_prediction", **kwargs)
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self.params = NodeParams(self, PARAMS, _check)
        p = self.params
        if not p["checkpoint"]:
            raise ValueError(
                "video_prediction: parameter 'checkpoint' is empty; "
                "give a SimForcing student checkpoint dir"
            )
        self.camera = p["camera"]
        self.predictor = VideoPredictor(p["checkpoint"], p["device"])
        # the robot mask of guidance: from the measured joints, which name it needs
        self._mask: JointStateMaskRenderer | None = None
        if p["mask_task"]:
            self._mask = self.predictor.segmenter = self._make_segmenter(p["mask_task"])
        self._lock = threading.Lock()
        self._image: tuple[np.ndarray, int] | None = None
        self._plan: tuple[np.ndarray, int] | None = None
        self._plan_error = ""
        self._joints: dict[str, float] = {}
        self._jobs: queue.Queue = queue.Queue(maxsize=1)
        self._job_id = 0
        group = ReentrantCallbackGroup()
        topic = p["image_topic"] or f"/camera/{self.camera}/image_raw"
        out = f"/simdist/predicted_video/{self.camera}"
        self.create_subscription(Image, topic, self._on_image, 2, callback_group=group)
        self.create_subscription(
            JointTrajectory, p["plan_topic"], self._on_plan, 2, callback_group=group
        )
        self.create_subscription(
            JointState, "/joint_states", self._on_joints, 2, callback_group=group
        )
        self.create_service(Trigger, "~/predict", self._on_predict, callback_group=group)
        self._pub_frames = self.create_publisher(Image, out, 10)
        self._pub_preview = self.create_publisher(Image, f"{out}/preview", 2)
        self._pub_status = self.create_publisher(String, f"{out}/status", 10)
        self._worker = threading.Thread(
            target=self._work, name="video_prediction_worker", daemon=True
        )
        self._worker.start()
        self.get_logger().info(
            f"predicting {self.predictor.num_frames - 1} frames of {self.camera!r} from {topic}"
        )

    def _make_segmenter(self, task: str) -> JointStateMaskRenderer:
        """Robot mask from the measured joints through the task's calibrated ("real") camera."""

        calibrated = make_task(
            task, "real", image_size=self.predictor.image_size, cameras=(self.camera,)
        )
        return JointStateMaskRenderer(calibrated.backend, self.camera)

    # --- inputs ---------------------------------------------------------------------------------
    def _on_image(self, msg: Image) -> None:
        try:
            image = ros_msgs.image_from_msg(msg)
        except ros_msgs.MessageError as err:
            self.get_logger().warning(f"dropping image: {err}")
            return
        with self._lock:
            self._image = (image, ros_msgs.stamp_ns(msg.header.stamp))

    def _on_joints(self, msg: JointState) -> None:
        with self._lock:
            self._joints.update(zip(msg.name, msg.position))

    def _on_plan(self, msg: JointTrajectory) -> None:
        try:
            plan = self.predictor.check_plan(
                [list(pt.positions) for pt in msg.points] or np.zeros((0, 0))
            )
        except RequestError as err:
            with self._lock:
                self._plan_error = str(err)
            self._status({"ok": False, "error": f"plan rejected: {err}"})
            return
        stamp = ros_msgs.stamp_ns(msg.header.stamp)
        with self._lock:
            self._plan, self._plan_error = (plan, stamp), ""
        if self.params["predict_on_plan"]:
            try:
                self._enqueue()
            except RequestError as err:
                self._status({"ok": False, "error": str(err)})

    def _on_predict(self, request, response):
        try:
            job = self._enqueue()
            response.success, response.message = True, f"queued prediction #{job}"
        except RequestError as err:
            response.success, response.message = False, str(err)
        return response

    def _enqueue(self) -> int:
        with self._lock:
            if self._image is None:
                topic = self.params["image_topic"] or f"/camera/{self.camera}/image_raw"
                raise RequestError(f"no image received yet on {topic}")
            if self._plan is None:
                why = f" (last plan rejected: {self._plan_error})" if self._plan_error else ""
                raise RequestError(
                    f"no valid plan received yet on {self.params['plan_topic']}{why}"
                )
            self._job_id += 1
            job = (self._job_id, self._image, self._plan, dict(self._joints))
        try:  # newest job wins: drop a queued one the worker has not started
            self._jobs.get_nowait()
        except queue.Empty:
            pass
        self._jobs.put_nowait(job)
        return job[0]

    # --- worker ---------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                self._run_job(*job)
            except Exception:
                if not self.context.ok():
                    return  # Ctrl-C shut the context down mid-job: nothing can be sent any more
                raise

    def _run_job(self, job_id, image_stamp, plan_stamp, joints) -> None:
        (image, stamp), (plan, _) = image_stamp, plan_stamp
        changed = self.params.apply()
        p = self.params
        t0 = time.perf_counter()
        try:
            if "device" in changed:
                self.predictor.to(p["device"])
            joint_pos = None
            if self._mask is not None and p["guidance"] > 0:
                names = self._mask.backend.spec.joint_names
                missing = [n for n in names if n not in joints]
                if missing:
                    raise RequestError(
                        f"no /joint_states for {missing}: the robot mask needs the measured joints"
                    )
                joint_pos = np.array([joints[n] for n in names])
            frames = self.predictor.predict(
                image,
                plan,
                PredictSettings(p["sim_steps"], p["real_steps"], p["guidance"]),
                joint_pos,
            )
        except (RequestError, ValueError, RuntimeError) as err:
            self._status({"job": job_id, "ok": False, "error": str(err)})
            return
        latency_s = time.perf_counter() - t0
        period_ns = int(p["control_period_s"] * 1e9)
        frame_id = f"{self.camera}_camera"
        for k, frame in enumerate(frames, start=1):
            self._pub_frames.publish(ros_msgs.image_to_msg(frame, stamp + k * period_ns, frame_id))
        strip = np.concatenate([image, *frames], axis=1)
        self._pub_preview.publish(
            ros_msgs.image_to_msg(np.ascontiguousarray(strip), stamp, frame_id)
        )
        self._status(
            {
                "job": job_id,
                "ok": True,
                "frames": len(frames),
                "latency_s": round(latency_s, 4),
                **{k: p[k] for k in ("sim_steps", "real_steps", "guidance", "device")},
            }
        )

    def _status(self, payload: dict) -> None:
        self._pub_status.publish(String(data=json.dumps(payload)))
        if not payload.get("ok", True):
            self.get_logger().warning(payload.get("error", ""))

    def destroy_node(self):
        self._stop.set()
        if self._worker is not None:
            self._worker.join(timeout=5.0)
        return super().destroy_node()


def main(args=None):
    with rclpy.init(args=args):
        node = VideoPredictionNode()
        executor = MultiThreadedExecutor()
        executor.add_node(node)
        spin_until_shutdown(node, executor.spin, on_exit=executor.shutdown)


if __name__ == "__main__":
    main()
