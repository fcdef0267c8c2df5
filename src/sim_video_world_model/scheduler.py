"""Rectified-flow scheduler (Wan / official SimForcing convention), kept apart from the model.

    x_sigma = (1 - sigma) x_0 + sigma eps,   target v = eps - x_0,   x^_0 = x_sigma - sigma v^
    sigma = s u / (1 + (s - 1) u), u ~ U(0, 1), shift s = 5;   timestep t = 1000 sigma

The loss weight is the Gaussian exp(-2 ((t - 500) / 1000)^2) shifted by its minimum and normalised
by its mean over the 1000-entry shifted training schedule, so it averages 1 over that schedule.
"""

from __future__ import annotations

import math

import torch


class FlowMatchScheduler:
    def __init__(self, shift: float = 5.0, num_train_timesteps: int = 1000):
        if shift <= 0:
            raise ValueError(f"shift must be > 0, got {shift}")
        self.shift = float(shift)
        self.num_train_timesteps = int(num_train_timesteps)
        table = self.timesteps_from_sigma(
            self.shift_sigma(torch.linspace(1.0, 0.0, self.num_train_timesteps))
        )
        gauss = self._gaussian(table)
        self._weight_min = float(gauss.min())
        self._weight_mean = float((gauss - self._weight_min).mean())

    def shift_sigma(self, u: torch.Tensor) -> torch.Tensor:
        return self.shift * u / (1.0 + (self.shift - 1.0) * u)

    def timesteps_from_sigma(self, sigma: torch.Tensor) -> torch.Tensor:
        return sigma * self.num_train_timesteps

    def sample_sigma(
        self, batch: int, device, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        u = torch.rand(batch, generator=generator, device=generator.device if generator else "cpu")
        return self.shift_sigma(u).to(device)

    @staticmethod
    def _expand(sigma: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return sigma.to(like.dtype).view(-1, *([1] * (like.ndim - 1)))

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        s = self._expand(sigma, x0)
        return (1.0 - s) * x0 + s * noise

    @staticmethod
    def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return noise - x0

    def x0_from_velocity(
        self, x_sigma: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor
    ) -> torch.Tensor:
        return x_sigma - self._expand(sigma, x_sigma) * v

    def _gaussian(self, t: torch.Tensor) -> torch.Tensor:
        half = self.num_train_timesteps / 2
        return torch.exp(-2.0 * ((t.float() - half) / self.num_train_timesteps) ** 2)

    def loss_weight(self, sigma: torch.Tensor) -> torch.Tensor:
        """Per-sample weight for both the flow-matching and the motion losses."""
        g = self._gaussian(self.timesteps_from_sigma(sigma))
        return (g - self._weight_min) / self._weight_mean

    def inference_sigmas(self, num_steps: int, device=None) -> torch.Tensor:
        """num_steps + 1 decreasing noise levels from 1 to 0 (Euler sampling)."""
        if num_steps < 1:
            raise ValueError(f"number of sampling steps must be >= 1, got {num_steps}")
        return self.shift_sigma(torch.linspace(1.0, 0.0, num_steps + 1, device=device))

    @staticmethod
    def step(x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float) -> torch.Tensor:
        return x + (sigma_next - sigma) * v


def warmup_cosine(step: int, total: int, warmup_frac: float) -> float:
    """LR multiplier: linear warm-up over warmup_frac of the steps, then cosine to zero."""
    warmup = max(1, int(round(warmup_frac * total))) if warmup_frac > 0 else 0
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
