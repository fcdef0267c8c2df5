"""Exponential moving average of the weights (PretrainConfig.ema_decay)."""

from __future__ import annotations

import copy

import torch

from simdist_planner.model.world_model import WorldModel


class WeightAverage:
    """Exponential moving average of a model's weights and float buffers (PretrainConfig.ema_decay).

    The usual remedy for a model that swings between checkpoints: the average of the last
    ~1 / (1 - decay) steps does not hinge on one of them. On the peg preset, whose runs end with
    base policies inserting 0 % to about 50 % of the time at equal losses, it changed nothing measured
    (docs/experiments/peg_wide.md, session 30).
    """

    def __init__(self, model: WorldModel, decay: float):
        self.decay = decay
        self.model = copy.deepcopy(model).requires_grad_(False).eval()

    @torch.no_grad()
    def update(self, model: WorldModel, step: int) -> None:
        """Fold in the weights after optimiser step `step` (0-based); early steps weigh more
        (the ramp), so the average does not start out as mostly the initial weights."""
        keep = min(self.decay, (1 + step) / (10 + step))
        for avg, new in zip(self.model.state_dict().values(), model.state_dict().values()):
            if avg.is_floating_point():
                avg.lerp_(new, 1.0 - keep)
            else:
                avg.copy_(new)
