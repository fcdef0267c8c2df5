"""Paired sim / "real" video windows: the same action sequence replayed in the sim task and in its
"real" variant (changed dynamics AND appearance), as SimForcing's paired Bridge data.

A window holds T frames of each stream, T - 1 actions (one per transition, min-max normalised to
[-1, 1] when served) and the first real frame's robot mask. Pixels are served in [-1, 1]. The sim
stream is the robot-only rendering (segmentation applied), which is what the masked real first
frame looks like at inference. Sources: the MuJoCo UR5e tasks (`robot_drivers.tasks`) and a
synthetic moving-arm world used for tests and CPU-scale experiments.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import h5py
import numpy as np
import torch

FILE_VERSION = 1


@runtime_checkable
class Segmenter(Protocol):
    """Robot mask of a camera image: (H, W, 3) uint8 + measured joint state -> (H, W) bool."""

    def __call__(self, image: np.ndarray, joint_pos: np.ndarray | None) -> np.ndarray: ...


@dataclass
class PairedWindows:
    sim: np.ndarray  # (N, T, H, W, 3) uint8, robot-only sim rendering
    real: np.ndarray  # (N, T, H, W, 3) uint8, "real" camera (with noise)
    actions: np.ndarray  # (N, T - 1, A) float32, raw units
    mask: np.ndarray  # (N, H, W) bool, robot mask of the first real frame
    action_low: np.ndarray  # (A,) min-max statistics for normalisation
    action_high: np.ndarray
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        n, t, h, w, c = self.sim.shape
        if self.real.shape != self.sim.shape or c != 3 or self.sim.dtype != np.uint8 or self.real.dtype != np.uint8:
            raise ValueError(f"sim/real must both be (N, T, H, W, 3) uint8, got {self.sim.shape} {self.sim.dtype} "
                             f"and {self.real.shape} {self.real.dtype}")
        if self.actions.ndim != 3 or self.actions.shape[:2] != (n, t - 1):
            raise ValueError(f"actions must be ({n}, {t - 1}, A): one per transition, got {self.actions.shape}")
        if self.mask.shape != (n, h, w):
            raise ValueError(f"mask must be ({n}, {h}, {w}), got {self.mask.shape}")
        a = self.actions.shape[2]
        if self.action_low.shape != (a,) or self.action_high.shape != (a,):
            raise ValueError(f"action_low/high must be ({a},)")

    def __len__(self) -> int:
        return self.sim.shape[0]

    @property
    def num_frames(self) -> int:
        return self.sim.shape[1]

    def subset(self, index) -> "PairedWindows":
        return PairedWindows(self.sim[index], self.real[index], self.actions[index], self.mask[index],
                             self.action_low, self.action_high, dict(self.meta))

    def save(self, path: str) -> None:
        with h5py.File(path, "w") as f:
            for name in ("sim", "real", "actions", "mask", "action_low", "action_high"):
                f.create_dataset(name, data=getattr(self, name), compression="gzip" if name in ("sim", "real") else None)
            f.attrs["version"] = FILE_VERSION
            f.attrs["meta"] = json.dumps(self.meta)

    @classmethod
    def load(cls, path: str) -> "PairedWindows":
        with h5py.File(path, "r") as f:
            if int(f.attrs.get("version", -1)) != FILE_VERSION:
                raise ValueError(f"{path}: paired-window file version {f.attrs.get('version')}, expected {FILE_VERSION}")
            arrays = {k: f[k][()] for k in ("sim", "real", "actions", "mask", "action_low", "action_high")}
            return cls(meta=json.loads(f.attrs["meta"]), **arrays)


def normalize_actions(actions, low, high):
    """Min-max to [-1, 1]; constant dimensions map to 0."""
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    span = np.where(high - low > 1e-8, high - low, 1.0)
    return np.clip(2.0 * (np.asarray(actions, np.float32) - low) / span - 1.0, -1.0, 1.0)


def to_pixels(frames_uint8: np.ndarray) -> torch.Tensor:
    """(..., T, H, W, 3) uint8 -> (..., 3, T, H, W) float in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(frames_uint8)).float() / 127.5 - 1.0
    return x.movedim(-1, -4)


class PairedVideoDataset(torch.utils.data.Dataset):
    """Serves tensors: sim / real (3, T, H, W) in [-1, 1], actions (T-1, A) in [-1, 1], mask (H, W)."""

    def __init__(self, windows: PairedWindows):
        self.windows = windows
        self.actions = normalize_actions(windows.actions, windows.action_low, windows.action_high)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        w = self.windows
        return {"sim": to_pixels(w.sim[i]), "real": to_pixels(w.real[i]),
                "actions": torch.from_numpy(self.actions[i]), "mask": torch.from_numpy(w.mask[i])}


def add_camera_noise(frames: np.ndarray, rng: np.random.Generator, std: float = 4.0) -> np.ndarray:
    """Sensor noise on a real-camera stream: per-frame gain jitter + Gaussian pixel noise (uint8 units)."""
    gain = 1.0 + rng.normal(0.0, 0.02, size=(frames.shape[0], 1, 1, 1))
    noisy = frames.astype(np.float32) * gain + rng.normal(0.0, std, size=frames.shape)
    return np.clip(np.round(noisy), 0, 255).astype(np.uint8)


def cut_windows(num_steps: int, num_frames: int, stride: int) -> list[int]:
    """Start indices of the windows of num_frames frames in a trajectory of num_steps + 1 frames."""
    return list(range(0, num_steps + 2 - num_frames, stride))


# ---------------------------------------------------------------------------------------------
# Synthetic world: a 2-link "arm" from a fixed base to an end effector, driven by EE-delta actions.
# ---------------------------------------------------------------------------------------------
@dataclass
class SyntheticWorldConfig:
    size: int = 64
    action_dim: int = 7  # UR5e layout: [dx, dy, dz, rx, ry, rz, gripper]; dx, dy, gripper move the arm
    sim_gain: float = 0.08
    real_gain: float = 0.07  # "real" dynamics: weaker actuation ...
    real_lag: float = 0.3  # ... and first-order lag on the commanded velocity
    noise_std: float = 4.0


class SyntheticArmWorld:
    """Renders the arm from its state through a fixed camera: the robot mask is a by-product."""

    def __init__(self, cfg: SyntheticWorldConfig, variant: str, rng: np.random.Generator):
        if variant not in ("sim", "real"):
            raise ValueError(f"variant must be 'sim' or 'real', got {variant!r}")
        self.cfg, self.variant = cfg, variant
        s = cfg.size
        yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s
        self._grid = (xx, yy)
        if variant == "real":  # per-episode appearance: textured table, coloured arm, lighting
            c0, c1 = rng.uniform(60, 200, 3), rng.uniform(60, 200, 3)
            f = rng.uniform(3, 8, 2)
            tex = 0.5 + 0.5 * np.sin(2 * np.pi * (f[0] * xx + 0.3 * yy)) * np.cos(2 * np.pi * f[1] * yy)
            self.background = (c0 * tex[..., None] + c1 * (1 - tex[..., None])).astype(np.float32)
            self.arm_color = np.array([230, 140, 40], np.float32) * rng.uniform(0.8, 1.1)
            self.light = rng.uniform(0.8, 1.2)
        else:
            self.background = np.zeros((s, s, 3), np.float32)
            self.arm_color = np.array([200, 200, 200], np.float32)
            self.light = 1.0
        self.base = np.array([0.5, 0.95], np.float32)

    def reset(self, pos: np.ndarray) -> None:
        self.pos, self.vel, self.grip = pos.astype(np.float32).copy(), np.zeros(2, np.float32), 0.0

    def step(self, action: np.ndarray) -> None:
        cmd = np.clip(action[:2], -1, 1)
        if self.variant == "sim":
            self.vel = self.cfg.sim_gain * cmd
        else:
            self.vel = self.cfg.real_lag * self.vel + (1 - self.cfg.real_lag) * self.cfg.real_gain * cmd
        self.pos = np.clip(self.pos + self.vel, 0.1, 0.9)
        self.grip = float(action[-1] > 0.0)

    def robot_mask(self) -> np.ndarray:
        xx, yy = self._grid
        a, b = self.base, self.pos
        ab = b - a
        t = np.clip(((xx - a[0]) * ab[0] + (yy - a[1]) * ab[1]) / max(1e-6, float(ab @ ab)), 0, 1)
        link = (xx - a[0] - t * ab[0]) ** 2 + (yy - a[1] - t * ab[1]) ** 2 < 0.05 ** 2
        radius = 0.08 if self.grip else 0.12
        effector = (xx - b[0]) ** 2 + (yy - b[1]) ** 2 < radius ** 2
        return link | effector

    def render(self) -> np.ndarray:
        mask = self.robot_mask()
        img = np.where(mask[..., None], self.arm_color, self.background) * self.light
        return np.clip(img, 0, 255).astype(np.uint8)


def _expert_actions(rng: np.random.Generator, steps: int, action_dim: int, start: np.ndarray) -> np.ndarray:
    """Goal-seeking EE-delta commands with occasional goal switches and gripper toggles."""
    actions = np.zeros((steps, action_dim), np.float32)
    pos, goal, grip = start.copy(), rng.uniform(0.15, 0.85, 2), -1.0
    for i in range(steps):
        if rng.random() < 0.12:
            goal = rng.uniform(0.15, 0.85, 2)
        if rng.random() < 0.1:
            grip = -grip
        cmd = np.clip((goal - pos) / 0.08, -1, 1) + rng.normal(0, 0.15, 2)
        actions[i, :2] = np.clip(cmd, -1, 1)
        actions[i, 2:-1] = rng.normal(0, 0.1, action_dim - 3)
        actions[i, -1] = grip
        pos = np.clip(pos + 0.08 * actions[i, :2], 0.1, 0.9)
    return actions


def synthetic_pairs(num_episodes: int, num_frames: int = 9, steps: int = 16, stride: int = 8,
                    cfg: SyntheticWorldConfig | None = None, seed: int = 0) -> PairedWindows:
    """Paired windows from the synthetic arm world (same actions in both variants)."""
    cfg = cfg or SyntheticWorldConfig()
    rng = np.random.default_rng(seed)
    sims, reals, acts, masks = [], [], [], []
    for _ in range(num_episodes):
        start = rng.uniform(0.2, 0.8, 2).astype(np.float32)
        actions = _expert_actions(rng, steps, cfg.action_dim, start)
        worlds = {v: SyntheticArmWorld(cfg, v, rng) for v in ("sim", "real")}
        frames = {v: [] for v in worlds}
        real_masks = []  # rendered from the real arm's state through the camera: the mask renderer
        for v, world in worlds.items():
            world.reset(start)
            for i in range(steps + 1):
                if i:
                    world.step(actions[i - 1])
                frames[v].append(world.render())
                if v == "real":
                    real_masks.append(world.robot_mask())
        sim_v = np.stack(frames["sim"])
        real_v = add_camera_noise(np.stack(frames["real"]), rng, cfg.noise_std)
        for s0 in cut_windows(steps, num_frames, stride):
            sims.append(sim_v[s0:s0 + num_frames])
            reals.append(real_v[s0:s0 + num_frames])
            acts.append(actions[s0:s0 + num_frames - 1])
            masks.append(real_masks[s0])
    actions = np.stack(acts)
    flat = actions.reshape(-1, actions.shape[-1])
    return PairedWindows(np.stack(sims), np.stack(reals), actions, np.stack(masks), flat.min(0), flat.max(0),
                         {"source": "synthetic", "num_frames": num_frames, "size": cfg.size, "seed": seed})
