"""Typed configuration for SimForcing: one dataclass per concern, one source of truth per setting.

Defaults are the paper's / official code's values (METHOD_NOTES, SimForcing part) except the
backbone sizes, which are scaled down so the built-in backbone trains on a CPU in minutes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# 2: the tiny autoencoder encodes frame 0 with the group encoder (backbones/tiny.py)
FORMAT_VERSION = 2


def _pair(value: Sequence[float]) -> tuple[float, float]:
    """A (low, high) setting as a tuple (a config read from JSON gives a list)."""
    low, high = value
    return low, high


class Variant(str, enum.Enum):
    """The paper's ablation ladder (Tab. 2); each rung adds one ingredient to the one before."""

    SFT = "sft"  # real-only flow matching (the baseline)
    JOINT_FM = "joint_fm"  # + flow matching on the paired sim videos
    MOTION = "motion"  # + latent-motion distillation from the frozen sim teacher
    FULL = "full"  # + multi-block dropout sim conditioning (SimForcing)
    # Off the ladder: the full student without motion distillation (joint FM + sim conditioning),
    # the row that tells what the motion term alone does to the full student.
    NO_MOTION = "no_motion"

    @property
    def joint_fm(self) -> bool:
        return self is not Variant.SFT

    @property
    def motion(self) -> bool:
        return self in (Variant.MOTION, Variant.FULL)

    @property
    def sim_conditioning(self) -> bool:
        return self in (Variant.FULL, Variant.NO_MOTION)


LADDER = (Variant.SFT, Variant.JOINT_FM, Variant.MOTION, Variant.FULL)  # the paper's Tab. 2 rungs


@dataclass
class ObjectiveConfig:
    """Flow matching, loss weights, conditioning dropout and corruption (Bridge settings)."""

    variant: Variant = Variant.FULL
    shift: float = 5.0
    num_train_timesteps: int = 1000
    lambda_video: float = 1.0
    lambda_delta: float = 0.5
    lambda_real: float = 1.0
    lambda_sim: float = 0.1
    sim_cond_prob: float = 0.7  # p of the per-sample gate g ~ Bernoulli(p)
    corrupt_prob: float = 0.4
    corrupt_alpha: tuple[float, float] = (0.5, 0.9)
    corrupt_sigma: tuple[float, float] = (0.1, 0.3)
    # Real-only SFT baseline's start: "base" = the backbone before any sim training (the official
    # bridge_real_act_cond config: resume null); "teacher" = the sim teacher (an ablation of the
    # losses alone). Either way it gets the student's optimiser settings and step budget.
    sft_init: str = "base"

    def __post_init__(self) -> None:
        self.variant = Variant(self.variant)
        if self.sft_init not in ("base", "teacher"):
            raise ValueError(f"sft_init must be 'base' or 'teacher', got {self.sft_init!r}")
        self.corrupt_alpha = _pair(self.corrupt_alpha)
        self.corrupt_sigma = _pair(self.corrupt_sigma)
        for name in ("sim_cond_prob", "corrupt_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("corrupt_alpha", "corrupt_sigma"):
            lo, hi = getattr(self, name)
            if not 0.0 <= lo <= hi:
                raise ValueError(f"{name} must be (lo, hi) with 0 <= lo <= hi, got {(lo, hi)}")
        if self.shift <= 0:
            raise ValueError(f"shift must be > 0, got {self.shift}")


@dataclass
class TinyBackboneConfig:
    """The built-in latent video DiT and its video autoencoder (trainable on a CPU at 64x64)."""

    latent_channels: int = 8
    ae_channels: int = 32
    spatial_factor: int = 4  # 2 stride-2 convolutions
    temporal_factor: int = 4  # first frame alone, then groups of 4 (Wan's causal layout)
    hidden: int = 96
    heads: int = 4
    layers: int = 4
    ffn: int = 256
    patch_size: tuple[int, int, int] = (1, 2, 2)
    action_hidden: int = 64
    action_layers: int = 2
    action_heads: int = 4

    def __post_init__(self) -> None:
        t, h, w = self.patch_size  # a config read from JSON gives a list
        self.patch_size = (t, h, w)
        if self.spatial_factor not in (2, 4, 8):
            raise ValueError(f"spatial_factor must be 2, 4 or 8, got {self.spatial_factor}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} must be divisible by heads {self.heads}")


@dataclass
class WanBackboneConfig:
    """Wan2.2-TI2V-5B through diffusers; `model_dir` holds `transformer/` and `vae/` subfolders.

    `transformer_config` / `vae_config` build randomly initialised models instead of loading
    (tests use 2 layers, 2 heads); leave them None to load the local pretrained weights.
    """

    model_dir: str = ""
    transformer_config: dict[str, Any] | None = None
    vae_config: dict[str, Any] | None = None
    action_layers: int = 2
    action_heads: int = 4
    action_hidden: int = 256
    dtype: str = "float32"  # weights' dtype when loading ("bfloat16" halves a 5B model's memory)

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"wan dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


@dataclass
class BackboneConfig:
    kind: str = "tiny"  # "tiny" | "wan"
    action_dim: int = 7
    max_actions: int = 64  # positional table size of the action branch
    tiny: TinyBackboneConfig = field(default_factory=TinyBackboneConfig)
    wan: WanBackboneConfig = field(default_factory=WanBackboneConfig)

    def __post_init__(self) -> None:
        if self.kind not in ("tiny", "wan"):
            raise ValueError(f"backbone kind must be 'tiny' or 'wan', got {self.kind!r}")
        if isinstance(self.tiny, dict):
            self.tiny = TinyBackboneConfig(**self.tiny)
        if isinstance(self.wan, dict):
            self.wan = WanBackboneConfig(**self.wan)


@dataclass
class TrainConfig:
    """Optimiser and loop settings (paper: AdamW 1e-4, betas (0.9, 0.95), wd 0.01, 5% warm-up,
    cosine, clip 1.0, seed 42, bf16 + gradient checkpointing on CUDA)."""

    steps: int = 2000
    batch_size: int = 8
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.01
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    seed: int = 42
    device: str = "cpu"
    bf16: bool | None = None  # None: on for CUDA, off elsewhere
    grad_checkpointing: bool | None = None  # None: on for CUDA, off elsewhere
    log_every: int = 25
    save_every: int = 500
    num_workers: int = 0

    def __post_init__(self) -> None:
        self.betas = _pair(self.betas)
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}"
            )
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")


def to_dict(obj) -> dict:
    """Dataclass -> JSON-ready dict (enums by value, tuples as lists)."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        elif isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def from_dict(cls, data: dict):
    """Build a config dataclass from a dict, rejecting unknown keys with a clear message."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(
            f"{cls.__name__}: unknown keys {sorted(unknown)}; expected a subset of {sorted(names)}"
        )
    return cls(**data)
