"""The tiny SimForcing backbone and run configuration the training tests share (seconds per
stage on a CPU)."""

from __future__ import annotations

from sim_video_world_model.config import BackboneConfig, TinyBackboneConfig, TrainConfig
from sim_video_world_model.train import RunConfig

TINY = TinyBackboneConfig(
    latent_channels=4,
    ae_channels=8,
    hidden=32,
    heads=2,
    layers=2,
    ffn=64,
    action_hidden=16,
    action_layers=1,
    action_heads=2,
)


def tiny_run_config(
    steps: int, batch_size: int, save_every: int = 10, real_windows: int | None = None
) -> RunConfig:
    """`steps` optimiser steps per stage at `batch_size`, a loss line every step."""
    common = dict(batch_size=batch_size, log_every=1, save_every=save_every)
    return RunConfig(
        backbone=BackboneConfig(tiny=TINY),
        autoencoder_train=TrainConfig(steps=steps, lr=1e-3, **common),
        teacher_train=TrainConfig(steps=steps, **common),
        student_train=TrainConfig(steps=steps, **common),
        real_windows=real_windows,
    )
