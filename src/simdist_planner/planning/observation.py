"""Robot `Observation`s -> world-model input tensors, and the proprio/action history it needs.

Shared by the closed-loop evaluation, the planner node and the adapter so the model sees exactly
the layout the dataset windows give it (docs/architecture.md "Model inputs"): cameras stacked in
`RobotSpec.cameras` order as (n_cam, 3, h, w) uint8; before the first H steps of an episode the
history repeats o_0 with zero actions, as the dataset's pad="repeat" windows do.
"""

from __future__ import annotations

import numpy as np
import torch

from robot_drivers.interface import Observation, RobotSpec


class ObservationError(ValueError):
    """An observation that must not reach the model (wrong shape, NaN/Inf, missing sensor)."""


def observation_arrays(obs: Observation, spec: RobotSpec) -> dict[str, np.ndarray]:
    """Validated per-step arrays (no batch dim) keyed like the model inputs."""
    proprio = _finite(spec, "proprio", obs.proprio, (spec.proprio_dim,))
    out = {"proprio": proprio}
    if spec.cameras:
        h, w = spec.image_shape
        frames = []
        for cam in spec.cameras:
            img = obs.images.get(cam)
            if img is None:
                raise ObservationError(
                    f"{spec.name}: camera {cam!r} missing; have {sorted(obs.images)}"
                )
            img = np.asarray(img)
            if img.shape != (h, w, 3) or img.dtype != np.uint8:
                raise ObservationError(
                    f"{spec.name}: camera {cam!r} image is {img.dtype} {img.shape}, "
                    f"expected uint8 ({h}, {w}, 3)"
                )
            frames.append(img.transpose(2, 0, 1))
        out["images"] = np.ascontiguousarray(np.stack(frames))
    if spec.height_map_shape is not None:
        if obs.height_map is None:
            raise ObservationError(f"{spec.name}: height_map missing")
        out["height_map"] = _finite(
            spec, "height_map", obs.height_map, tuple(spec.height_map_shape)
        )
    if spec.command_dim:
        if obs.command is None:
            raise ObservationError(f"{spec.name}: command missing")
        out["command"] = _finite(spec, "command", obs.command, (spec.command_dim,))
    return out


def observation_to_inputs(
    obs: Observation, spec: RobotSpec, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """One observation as a model-input batch of size 1 on `device`."""
    return {
        k: torch.from_numpy(v).unsqueeze(0).to(device)
        for k, v in observation_arrays(obs, spec).items()
    }


class ObservationHistory:
    """The last H proprio vectors o^p_{t-H..t-1} and the actions a_{t-H..t-1} taken after them."""

    def __init__(self, spec: RobotSpec, history: int):
        if history < 0:
            raise ValueError(f"history must be >= 0, got {history}")
        self.spec = spec
        self.proprio = np.zeros((history, spec.proprio_dim), np.float32)
        self.actions = np.zeros((history, spec.action_dim), np.float32)

    def reset(self, obs: Observation) -> None:
        """Episode start: every history row is o_0 with a zero action."""
        self.proprio[:] = _finite(self.spec, "proprio", obs.proprio, (self.spec.proprio_dim,))
        self.actions[:] = 0.0

    def push(self, obs: Observation, action: np.ndarray) -> None:
        """Record that `action` was executed after `obs` (call once per control step)."""
        proprio = _finite(self.spec, "proprio", obs.proprio, (self.spec.proprio_dim,))
        action = _finite(self.spec, "action", action, (self.spec.action_dim,))
        if len(self.proprio):
            self.proprio[:-1] = self.proprio[1:].copy()
            self.actions[:-1] = self.actions[1:].copy()
            self.proprio[-1] = proprio
            self.actions[-1] = action

    def tensors(self, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(1, H, P) proprio and (1, H, A) actions, copies the caller may keep."""
        return (
            torch.from_numpy(self.proprio.copy()).unsqueeze(0).to(device),
            torch.from_numpy(self.actions.copy()).unsqueeze(0).to(device),
        )


def _finite(spec: RobotSpec, name: str, value, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float32)
    if arr.shape != shape:
        raise ObservationError(f"{spec.name}: {name} has shape {arr.shape}, expected {shape}")
    if not np.all(np.isfinite(arr)):
        raise ObservationError(f"{spec.name}: {name} contains NaN or Inf")
    return arr
