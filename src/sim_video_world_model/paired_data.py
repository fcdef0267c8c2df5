"""Paired sim / "real" video windows: the same action sequence replayed in the sim task and in its
"real" variant (changed dynamics AND appearance), as SimForcing's paired Bridge data.

A window holds T frames of each stream, T - 1 actions (one per transition, min-max normalised to
[-1, 1] when served), the first real frame's robot mask and its episode's seed. Every episode is a
function of its seed (drawn from the generation seed), so files whose episode seeds are disjoint
share no episode: `check_disjoint` is what keeps training, validation and test splits apart.
Pixels are served in [-1, 1]. The sim stream is the robot-only rendering (segmentation applied),
which is what the masked real first frame looks like at inference. Sources: the MuJoCo UR5e tasks
(`robot_drivers.tasks`) and a synthetic moving-arm world used for tests and CPU-scale experiments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import h5py
import mujoco
import numpy as np
import torch

from robot_drivers.registry import expert_ladder, make_task

FILE_VERSION = 2  # 2: per-window episode seeds


@runtime_checkable
class Segmenter(Protocol):
    """Robot mask of a camera image: (H, W, 3) uint8 + measured joint state -> (H, W) bool."""

    def __call__(self, image: np.ndarray, joint_pos: np.ndarray | None) -> np.ndarray: ...


FIELDS = ("sim", "real", "actions", "mask", "action_low", "action_high", "episodes")


@dataclass
class PairedWindows:
    sim: np.ndarray  # (N, T, H, W, 3) uint8, robot-only sim rendering
    real: np.ndarray  # (N, T, H, W, 3) uint8, "real" camera (with noise)
    actions: np.ndarray  # (N, T - 1, A) float32, raw units
    mask: np.ndarray  # (N, H, W) bool, robot mask of the first real frame
    action_low: np.ndarray  # (A,) min-max statistics for normalisation
    action_high: np.ndarray
    episodes: np.ndarray  # (N,) int64, the seed of each window's episode
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        n, t, h, w, c = self.sim.shape
        if (
            self.real.shape != self.sim.shape
            or c != 3
            or self.sim.dtype != np.uint8
            or self.real.dtype != np.uint8
        ):
            raise ValueError(
                "sim/real must both be (N, T, H, W, 3) uint8, "
                f"got {self.sim.shape} {self.sim.dtype} and {self.real.shape} {self.real.dtype}"
            )
        if self.actions.ndim != 3 or self.actions.shape[:2] != (n, t - 1):
            raise ValueError(
                f"actions must be ({n}, {t - 1}, A): one per transition, got {self.actions.shape}"
            )
        if self.mask.shape != (n, h, w):
            raise ValueError(f"mask must be ({n}, {h}, {w}), got {self.mask.shape}")
        a = self.actions.shape[2]
        if self.action_low.shape != (a,) or self.action_high.shape != (a,):
            raise ValueError(f"action_low/high must be ({a},)")
        if self.episodes.shape != (n,) or not np.issubdtype(self.episodes.dtype, np.integer):
            raise ValueError(
                f"episodes must be ({n},) integer episode seeds, got {self.episodes.shape} "
                f"{self.episodes.dtype}"
            )

    def __len__(self) -> int:
        return self.sim.shape[0]

    @property
    def num_frames(self) -> int:
        return self.sim.shape[1]

    def subset(self, index) -> "PairedWindows":
        return PairedWindows(
            self.sim[index],
            self.real[index],
            self.actions[index],
            self.mask[index],
            self.action_low,
            self.action_high,
            self.episodes[index],
            dict(self.meta),
        )

    @classmethod
    def concat(cls, parts: list["PairedWindows"]) -> "PairedWindows":
        """The windows of `parts` in order, with the action statistics of all of them."""
        if not parts:
            raise ValueError("nothing to concatenate")
        return cls(
            np.concatenate([p.sim for p in parts]),
            np.concatenate([p.real for p in parts]),
            np.concatenate([p.actions for p in parts]),
            np.concatenate([p.mask for p in parts]),
            np.min([p.action_low for p in parts], axis=0),
            np.max([p.action_high for p in parts], axis=0),
            np.concatenate([p.episodes for p in parts]),
            dict(parts[0].meta, parts=[p.meta for p in parts]),
        )

    def save(self, path: str) -> None:
        with h5py.File(path, "w") as f:
            for name in FIELDS:
                f.create_dataset(
                    name,
                    data=getattr(self, name),
                    compression="gzip" if name in ("sim", "real") else None,
                )
            f.attrs["version"] = FILE_VERSION
            f.attrs["meta"] = json.dumps(self.meta)

    @staticmethod
    def load_episodes(path: str) -> np.ndarray:
        """The episode seeds of a file's windows, without reading its videos."""
        with h5py.File(path, "r") as f:
            PairedWindows._check_version(path, f)
            return f["episodes"][()]

    @staticmethod
    def _check_version(path: str, f: h5py.File) -> None:
        if int(f.attrs.get("version", -1)) != FILE_VERSION:
            raise ValueError(
                f"{path}: paired-window file version {f.attrs.get('version')}, expected "
                f"{FILE_VERSION} (version 2 records each window's episode seed): generate it "
                "again with python -m sim_video_world_model.paired_data"
            )

    @classmethod
    def load(cls, path: str) -> "PairedWindows":
        with h5py.File(path, "r") as f:
            cls._check_version(path, f)
            arrays = {k: f[k][()] for k in FIELDS}
            return cls(meta=json.loads(f.attrs["meta"]), **arrays)


def check_disjoint(splits: Mapping[str, PairedWindows | Iterable[int]]) -> None:
    """Raise a ValueError naming every pair of `splits` (name -> windows or episode seeds) that
    share an episode seed, with the shared seeds: a window of one split's episode in another
    split would score a model on what it trained on, or choose on what it reports."""
    seeds = {
        name: set(
            (s.episodes if isinstance(s, PairedWindows) else np.asarray(list(s), np.int64)).tolist()
        )
        for name, s in splits.items()
    }
    names = list(seeds)
    clashes = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            shared = sorted(seeds[a] & seeds[b])
            if shared:
                more = f" and {len(shared) - 5} more" if len(shared) > 5 else ""
                clashes.append(f"{a} and {b} share {len(shared)} episode(s): {shared[:5]}{more}")
    if clashes:
        raise ValueError(
            "splits must be disjoint by episode seed: "
            + "; ".join(clashes)
            + " (generate them with different seeds)"
        )


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
    """Serves sim / real (3, T, H, W) in [-1, 1], actions (T-1, A) in [-1, 1], mask (H, W).

    Actions are normalised with `action_range` (low, high) where given, i.e. a model's training
    statistics when a held-out file is scored, else with the file's own statistics."""

    def __init__(self, windows: PairedWindows, action_range: tuple[Any, Any] | None = None):
        self.windows = windows
        low, high = action_range or (windows.action_low, windows.action_high)
        self.actions = normalize_actions(windows.actions, low, high)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        w = self.windows
        return {
            "sim": to_pixels(w.sim[i]),
            "real": to_pixels(w.real[i]),
            "actions": torch.from_numpy(self.actions[i]),
            "mask": torch.from_numpy(w.mask[i]),
        }


def add_camera_noise(frames: np.ndarray, rng: np.random.Generator, std: float = 4.0) -> np.ndarray:
    """Sensor noise on a real-camera stream: per-frame gain jitter, Gaussian pixel noise (uint8)."""
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
    action_dim: int = (
        7  # UR5e layout: [dx, dy, dz, rx, ry, rz, gripper]; dx, dy, gripper move the arm
    )
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
            tex = 0.5 + 0.5 * np.sin(2 * np.pi * (f[0] * xx + 0.3 * yy)) * np.cos(
                2 * np.pi * f[1] * yy
            )
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
            self.vel = (
                self.cfg.real_lag * self.vel + (1 - self.cfg.real_lag) * self.cfg.real_gain * cmd
            )
        self.pos = np.clip(self.pos + self.vel, 0.1, 0.9)
        self.grip = float(action[-1] > 0.0)

    def robot_mask(self) -> np.ndarray:
        xx, yy = self._grid
        a, b = self.base, self.pos
        ab = b - a
        t = np.clip(((xx - a[0]) * ab[0] + (yy - a[1]) * ab[1]) / max(1e-6, float(ab @ ab)), 0, 1)
        link = (xx - a[0] - t * ab[0]) ** 2 + (yy - a[1] - t * ab[1]) ** 2 < 0.05**2
        radius = 0.08 if self.grip else 0.12
        effector = (xx - b[0]) ** 2 + (yy - b[1]) ** 2 < radius**2
        return link | effector

    def render(self) -> np.ndarray:
        mask = self.robot_mask()
        img = np.where(mask[..., None], self.arm_color, self.background) * self.light
        return np.clip(img, 0, 255).astype(np.uint8)


def _expert_actions(
    rng: np.random.Generator, steps: int, action_dim: int, start: np.ndarray
) -> np.ndarray:
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


def synthetic_pairs(
    num_episodes: int,
    num_frames: int = 9,
    steps: int = 16,
    stride: int = 8,
    cfg: SyntheticWorldConfig | None = None,
    seed: int = 0,
) -> PairedWindows:
    """Paired windows from the synthetic arm world (same actions in both variants)."""
    cfg = cfg or SyntheticWorldConfig()
    seeds = np.random.default_rng(seed)
    sims, reals, acts, masks, episodes = [], [], [], [], []
    for _ in range(num_episodes):
        ep_seed = int(seeds.integers(1 << 30))
        rng = np.random.default_rng(ep_seed)  # the episode is a function of its seed
        start = rng.uniform(0.2, 0.8, 2).astype(np.float32)
        actions = _expert_actions(rng, steps, cfg.action_dim, start)
        worlds = {v: SyntheticArmWorld(cfg, v, rng) for v in ("sim", "real")}
        frames: dict[str, list[np.ndarray]] = {v: [] for v in worlds}
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
            sims.append(sim_v[s0 : s0 + num_frames])
            reals.append(real_v[s0 : s0 + num_frames])
            acts.append(actions[s0 : s0 + num_frames - 1])
            masks.append(real_masks[s0])
            episodes.append(ep_seed)
    actions = np.stack(acts)
    flat = actions.reshape(-1, actions.shape[-1])
    return PairedWindows(
        np.stack(sims),
        np.stack(reals),
        actions,
        np.stack(masks),
        flat.min(0),
        flat.max(0),
        np.asarray(episodes, np.int64),
        {"source": "synthetic", "num_frames": num_frames, "size": cfg.size, "seed": seed},
    )


# ---------------------------------------------------------------------------------------------
# MuJoCo UR5e tasks (robot_drivers): the sim task and its "real" variant, one action sequence.
# ---------------------------------------------------------------------------------------------
class JointStateMaskRenderer:
    """Segmenter for a real camera: the robot mask rendered from the MEASURED joint state through
    the calibrated camera model (a never-stepped MuJoCo scene whose camera carries the calibration).
    Swap in any other `Segmenter` (e.g. a learned one) where no robot model is available."""

    def __init__(self, backend, camera: str):
        self.backend, self.camera = backend, camera

    def __call__(self, image: np.ndarray, joint_pos: np.ndarray | None) -> np.ndarray:
        if joint_pos is None:
            raise ValueError(
                "JointStateMaskRenderer needs the measured joint positions (obs.joint_pos)"
            )
        b = self.backend
        qadr = b.controller.qadr
        q = np.asarray(joint_pos, np.float64)
        if q.shape != (len(qadr),):
            raise ValueError(f"joint_pos has shape {q.shape}, expected ({len(qadr)},)")
        b.data.qpos[qadr] = q
        mujoco.mj_forward(b.model, b.data)
        mask = b.render_robot_mask(self.camera)
        if mask.shape != image.shape[:2]:
            raise ValueError(
                f"mask {mask.shape} and image {image.shape[:2]} differ: camera models disagree"
            )
        return mask


@dataclass
class MujocoPairsConfig:
    task: str = "peg"
    camera: str = "side"
    size: int = 64
    steps: int = 24  # control steps per episode (5 Hz)
    noise_std: float = 4.0


def mujoco_pairs(
    num_episodes: int,
    num_frames: int = 9,
    stride: int = 4,
    cfg: MujocoPairsConfig | None = None,
    seed: int = 0,
    segmenter: Segmenter | None = None,
) -> PairedWindows:
    """Replay each episode's expert actions (a random rung of the expert ladder, acting on the sim
    task) in the "real" variant too. The sim stream is the sim rendering masked by MuJoCo's
    segmentation; the real stream gets camera noise; real masks come from `segmenter` (default: the
    joint-state mask renderer through the real variant's calibrated camera)."""

    cfg = cfg or MujocoPairsConfig()
    kw = dict(image_size=(cfg.size, cfg.size), cameras=(cfg.camera,))
    sim, real = make_task(cfg.task, "sim", **kw), make_task(cfg.task, "real", **kw)
    sim_mask = getattr(sim.backend, "render_robot_mask", None)  # MuJoCo's segmentation
    if sim_mask is None:
        raise ValueError(f"{cfg.task}: its sim backend renders no robot mask (a UR5e task does)")
    calibrated = make_task(cfg.task, "real", **kw)
    segmenter = segmenter or JointStateMaskRenderer(calibrated.backend, cfg.camera)
    ladder = expert_ladder(sim)
    seeds = np.random.default_rng(seed)
    actions: Any  # an episode's actions as recorded (a list), then stacked (an array)
    sims, reals, acts, masks, episodes = [], [], [], [], []
    try:
        for _ in range(num_episodes):
            ep_seed = int(seeds.integers(1 << 30))
            rng = np.random.default_rng(ep_seed)  # the episode is a function of its seed
            expert = ladder[int(rng.integers(len(ladder)))]
            obs_s, obs_r = sim.reset(ep_seed), real.reset(ep_seed)
            expert.reset(ep_seed)
            sim_f, real_f, real_m, actions = [], [], [], []

            def record(o_s, o_r):
                img_s = o_s.images[cfg.camera]
                sim_f.append(np.where(sim_mask(cfg.camera)[..., None], img_s, 0).astype(np.uint8))
                real_f.append(o_r.images[cfg.camera])
                real_m.append(segmenter(o_r.images[cfg.camera], o_r.joint_pos))

            record(obs_s, obs_r)
            for _ in range(cfg.steps):
                a = np.asarray(expert.act(obs_s), np.float32)
                res_s, res_r = sim.step(a), real.step(a)
                obs_s, obs_r = res_s.obs, res_r.obs
                actions.append(a)
                record(obs_s, obs_r)
                if res_s.terminated or res_r.terminated:
                    break
            real_v = add_camera_noise(np.stack(real_f), rng, cfg.noise_std)
            sim_v, actions = np.stack(sim_f), np.stack(actions)
            for s0 in cut_windows(len(actions), num_frames, stride):
                sims.append(sim_v[s0 : s0 + num_frames])
                reals.append(real_v[s0 : s0 + num_frames])
                acts.append(actions[s0 : s0 + num_frames - 1])
                masks.append(real_m[s0])
                episodes.append(ep_seed)
    finally:
        for t in (sim, real, calibrated):
            t.close()
    if not sims:
        raise ValueError(f"no window of {num_frames} frames fits in episodes of {cfg.steps} steps")
    actions = np.stack(acts)
    flat = actions.reshape(-1, actions.shape[-1])
    return PairedWindows(
        np.stack(sims),
        np.stack(reals),
        actions,
        np.stack(masks),
        flat.min(0),
        flat.max(0),
        np.asarray(episodes, np.int64),
        {
            "source": f"mujoco:{cfg.task}",
            "camera": cfg.camera,
            "num_frames": num_frames,
            "size": cfg.size,
            "seed": seed,
        },
    )


def main(argv: list[str] | None = None) -> None:
    """python -m sim_video_world_model.paired_data --source peg --episodes 40 --out pairs.h5"""

    p = argparse.ArgumentParser(description="Write paired sim/real video windows to an HDF5 file.")
    p.add_argument(
        "--source", default="peg", help="'synthetic' or a UR5e task name (peg, table_leg)"
    )
    p.add_argument("--episodes", type=int, default=40)
    p.add_argument("--frames", type=int, default=9)
    p.add_argument("--stride", type=int, default=4)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--camera", default="side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--disjoint-from",
        action="append",
        default=[],
        metavar="FILE",
        help="a paired-window file of another split: refuse to write when an episode repeats",
    )
    args = p.parse_args(argv)
    others = {path: PairedWindows.load(path) for path in args.disjoint_from}
    if args.source == "synthetic":
        w = synthetic_pairs(
            args.episodes,
            args.frames,
            args.steps,
            args.stride,
            SyntheticWorldConfig(size=args.size),
            args.seed,
        )
    else:
        w = mujoco_pairs(
            args.episodes,
            args.frames,
            args.stride,
            MujocoPairsConfig(args.source, args.camera, args.size, args.steps),
            args.seed,
        )
    check_disjoint({args.out: w, **others})
    w.save(args.out)
    print(f"wrote {len(w)} windows of {w.num_frames} frames ({w.meta['source']}) to {args.out}")


if __name__ == "__main__":
    main()
