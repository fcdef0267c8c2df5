"""The video-prediction core the ROS node wraps (no rclpy): latest image + planned action chunk ->
predicted camera frames, with every input checked before the model sees it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from sim_video_world_model.checkpoint import load_bundle
from sim_video_world_model.paired_data import Segmenter, normalize_actions
from sim_video_world_model.pipeline import SimForcingPipeline
from sim_video_world_model.scheduler import FlowMatchScheduler


class RequestError(ValueError):
    """A prediction request that cannot be served (says what is wrong and what was expected)."""


@dataclass
class PredictSettings:
    sim_steps: int = 1
    real_steps: int = 10
    guidance: float = 0.6
    seed: int = 0


def check_device(device: str) -> str | None:
    """None if `device` is usable here, else the reason."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        return f"device {device!r} is not a torch device ({err}); expected cpu, cuda or cuda:N"
    if dev.type not in ("cpu", "cuda"):
        return f"device {device!r}: expected cpu, cuda or cuda:N"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return f"device {device!r}: CUDA is not available on this machine"
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)"
    return None


class VideoPredictor:
    def __init__(self, checkpoint: str, device: str = "cpu", segmenter: Segmenter | None = None):
        bundle = load_bundle(checkpoint, "cpu")
        info = bundle.info
        for key in ("num_frames", "image_size", "action_low", "action_high"):
            if key not in info:
                raise ValueError(
                    f"{checkpoint}: config.json info lacks {key!r}; "
                    "not a trained SimForcing checkpoint"
                )
        self.bundle = bundle
        self.num_frames = int(info["num_frames"])
        self.image_size = tuple(int(v) for v in info["image_size"])
        self.action_low = np.asarray(info["action_low"], np.float32)
        self.action_high = np.asarray(info["action_high"], np.float32)
        self.action_dim = int(self.action_low.shape[0])
        self.has_sim_conditioning = bundle.denoiser.sim_conditioning is not None
        self.segmenter = segmenter
        self.device = "cpu"
        self.to(device)

    def to(self, device: str) -> None:
        reason = check_device(device)
        if reason:
            raise RequestError(reason)
        self.bundle.autoencoder.to(device)
        self.bundle.denoiser.to(device)
        self.device = device

    @property
    def horizon(self) -> int:
        return self.num_frames - 1

    def check_plan(self, actions) -> np.ndarray:
        a = np.asarray(actions, dtype=np.float32)
        if a.ndim != 2 or a.shape[0] < 1:
            raise RequestError(
                f"plan must be a (T, {self.action_dim}) action chunk with T >= 1, "
                f"got shape {a.shape}"
            )
        if a.shape[1] != self.action_dim:
            raise RequestError(
                f"plan has action dimension {a.shape[1]}, expected {self.action_dim}"
            )
        if not np.all(np.isfinite(a)):
            raise RequestError("plan contains NaN or Inf")
        return a

    def check_image(self, image) -> np.ndarray:
        img = np.asarray(image)
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
            raise RequestError(f"image must be (H, W, 3) uint8 RGB, got {img.shape} {img.dtype}")
        return img

    def predict(
        self,
        image: np.ndarray,
        actions: np.ndarray,
        settings: PredictSettings,
        joint_pos: np.ndarray | None = None,
    ) -> np.ndarray:
        """(n, H, W, 3) uint8 predicted frames (n = min(T, horizon)) at the INPUT image's size.

        A plan shorter than the model horizon is padded with hold actions (zero motion, same
        gripper); frames past the plan are not returned. A longer plan is cut to the horizon.
        """
        img = self.check_image(image)
        plan = self.check_plan(actions)
        if settings.guidance > 0 and not self.has_sim_conditioning:
            raise RequestError(
                "guidance w > 0 needs a student trained with sim conditioning; set guidance 0"
            )
        n = min(len(plan), self.horizon)
        padded = np.repeat(plan[n - 1 : n], self.horizon, axis=0)
        padded[n:, :-1] = 0.0
        padded[:n] = plan[:n]
        mask = None
        if settings.guidance > 0:
            if self.segmenter is None:
                raise RequestError(
                    "guidance w > 0 needs the robot mask: configure a segmenter or set guidance 0"
                )
            mask = self.segmenter(img, joint_pos)
        h, w = self.image_size
        frame = torch.from_numpy(img.copy()).float().permute(2, 0, 1)[None] / 127.5 - 1.0
        frame = (
            F.interpolate(frame, size=(h, w), mode="bilinear", align_corners=False)
            if img.shape[:2] != (h, w)
            else frame
        )
        act = torch.from_numpy(normalize_actions(padded, self.action_low, self.action_high))[None]
        robot_mask = None
        if mask is not None:
            m = torch.from_numpy(np.asarray(mask, bool))[None, None].float()
            robot_mask = (F.interpolate(m, size=(h, w), mode="nearest")[:, 0] > 0.5).to(self.device)
        pipe = SimForcingPipeline(
            self.bundle.autoencoder, self.bundle.denoiser, FlowMatchScheduler()
        )
        video = (
            pipe(
                frame.to(self.device),
                act.to(self.device),
                self.num_frames,
                robot_mask=robot_mask,
                sim_steps=settings.sim_steps,
                real_steps=settings.real_steps,
                guidance=settings.guidance,
                seed=settings.seed,
            )
            .video[0, :, 1 : n + 1]
            .float()
            .cpu()
        )  # (3, n, h, w)
        if img.shape[:2] != (h, w):
            video = F.interpolate(
                video.transpose(0, 1), size=img.shape[:2], mode="bilinear", align_corners=False
            ).transpose(0, 1)
        return ((video.clamp(-1, 1) + 1) * 127.5).round().byte().permute(1, 2, 3, 0).numpy()
