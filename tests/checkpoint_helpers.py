"""Small random world-model checkpoints for the planner tests (no rclpy: the planner core's tests
run without ROS; the node, launch and graph tests use the same helper)."""

from __future__ import annotations

import torch

from robot_drivers.specs import robot_spec
from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.config import AttentionConfig, ur5e_small_config
from simdist_planner.model.world_model import WorldModel

UR5E = robot_spec("ur5e")


def make_checkpoint(path, seed=0, scale=1.0, **overrides) -> str:
    """A small random UR5e world model (config `overrides` on ur5e_small_config) saved with
    save_checkpoint at `path`; `scale` multiplies every weight (1e30: finite weights whose
    activations overflow, so the model outputs NaN / Inf)."""
    torch.manual_seed(seed)
    config = ur5e_small_config(
        proprio_dim=UR5E.proprio_dim,
        latent_dim=32,
        dynamics=AttentionConfig(1, 2),
        policy=AttentionConfig(1, 2),
        **overrides,
    )
    model = WorldModel(config)
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)
    save_checkpoint(model, path)
    return str(path)
