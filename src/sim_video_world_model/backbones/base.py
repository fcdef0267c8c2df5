"""The one interface both backbones (built-in tiny DiT, Wan2.2 via diffusers) implement.

A backbone is a frozen video autoencoder plus a trainable denoiser. The denoiser predicts the
flow velocity of video latents given the flow timestep, the action sequence (through an action
branch whose tokens every block cross-attends to) and, once `add_sim_conditioning()` was called,
an optional sim latent injected after each block's cross-attention, gated per sample.
"""

from __future__ import annotations

import abc
import math

import torch
from torch import nn


class VideoAutoencoder(nn.Module, abc.ABC):
    """Pixels (B, 3, T, H, W) in [-1, 1] <-> normalised latents (B, C, 1 + (T-1)/tf, H/sf, W/sf)."""

    latent_channels: int
    temporal_factor: int
    spatial_factor: int

    @abc.abstractmethod
    def encode(self, video: torch.Tensor) -> torch.Tensor: ...

    @abc.abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor: ...

    def check_video(self, video: torch.Tensor) -> None:
        if video.ndim != 5 or video.shape[1] != 3:
            raise ValueError(f"video must be (B, 3, T, H, W), got {tuple(video.shape)}")
        t, h, w = video.shape[2:]
        if (t - 1) % self.temporal_factor:
            raise ValueError(f"frame count {t} must be 1 + a multiple of {self.temporal_factor}")
        if h % self.spatial_factor or w % self.spatial_factor:
            raise ValueError(f"frame size {h}x{w} must be a multiple of {self.spatial_factor}")

    def latent_frames(self, num_frames: int) -> int:
        return 1 + (num_frames - 1) // self.temporal_factor


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Standard sin/cos embedding of (any-shaped) float positions -> (..., dim)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=positions.device) / max(1, half)
    )
    angles = positions.float().unsqueeze(-1) * freqs
    emb = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    return nn.functional.pad(emb, (0, dim - emb.shape[-1]))


class ActionEncoder(nn.Module):
    """The action branch: one token per transition, a small bidirectional transformer over them."""

    pos: torch.Tensor  # (max_actions, hidden) sinusoid positions, a buffer

    def __init__(
        self, action_dim: int, hidden: int, out_dim: int, layers: int, heads: int, max_actions: int
    ):
        super().__init__()
        self.action_dim = action_dim
        self.max_actions = max_actions
        self.inp = nn.Linear(action_dim, hidden)
        self.register_buffer("pos", sinusoid(torch.arange(max_actions), hidden), persistent=False)
        layer = nn.TransformerEncoderLayer(
            hidden,
            heads,
            4 * hidden,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
            activation="gelu",
        )
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, out_dim))

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        if actions.ndim != 3 or actions.shape[-1] != self.action_dim:
            raise ValueError(
                f"actions must be (B, T, {self.action_dim}), got {tuple(actions.shape)}"
            )
        if actions.shape[1] > self.max_actions:
            raise ValueError(
                f"{actions.shape[1]} actions exceed the branch's max_actions {self.max_actions}"
            )
        x = self.inp(actions) + self.pos[: actions.shape[1]].to(actions.dtype)
        return self.out(self.body(x))


class SimConditioning(nn.Module):
    """Per-block Conv3d projections (kernel = stride = patch size), initialised to zero.

    `tokens(j, sim_latent, gate)` maps the (detached) sim latent to block j's token layout,
    multiplied by the per-sample gate g (shared by all blocks).
    """

    def __init__(
        self, num_blocks: int, latent_channels: int, hidden: int, patch_size: tuple[int, int, int]
    ):
        super().__init__()
        convs = [
            nn.Conv3d(latent_channels, hidden, kernel_size=patch_size, stride=patch_size)
            for _ in range(num_blocks)
        ]
        for conv in convs:
            nn.init.zeros_(conv.weight)
            if conv.bias is not None:  # always: Conv3d's bias=True
                nn.init.zeros_(conv.bias)
        self.projections = nn.ModuleList(convs)

    def tokens(self, index: int, sim_latent: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        conv = self.projections[index]
        assert isinstance(conv, nn.Conv3d)
        feat = conv(sim_latent.detach().to(conv.weight.dtype))  # (B, D, f, h, w)
        tokens = feat.flatten(2).transpose(1, 2)  # (B, f*h*w, D): same order as patch embedding
        return tokens * gate.to(tokens.dtype).view(-1, 1, 1)


class VideoDenoiser(nn.Module, abc.ABC):
    """Velocity predictor; the first latent frame is the clean observation (timestep 0)."""

    action_dim: int
    latent_channels: int
    sim_conditioning: SimConditioning | None

    @abc.abstractmethod
    def add_sim_conditioning(self) -> None:
        """Create the zero-initialised per-block projections (idempotent)."""

    @abc.abstractmethod
    def _predict(self, latents, timestep, actions, sim_latent, gate) -> torch.Tensor: ...

    @abc.abstractmethod
    def set_gradient_checkpointing(self, enabled: bool) -> None: ...

    def forward(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        actions: torch.Tensor,
        sim_latent: torch.Tensor | None = None,
        gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """latents (B, C, L, h, w); timestep (B,) = 1000 sigma; actions (B, T, A); gate (B,) 0/1."""
        if latents.ndim != 5 or latents.shape[1] != self.latent_channels:
            raise ValueError(
                f"latents must be (B, {self.latent_channels}, L, h, w), got {tuple(latents.shape)}"
            )
        batch = latents.shape[0]
        if timestep.shape != (batch,):
            raise ValueError(f"timestep must be ({batch},), got {tuple(timestep.shape)}")
        if actions.ndim != 3 or actions.shape[0] != batch or actions.shape[-1] != self.action_dim:
            raise ValueError(
                f"actions must be ({batch}, T, {self.action_dim}), got {tuple(actions.shape)}"
            )
        if sim_latent is not None:
            if self.sim_conditioning is None:
                raise ValueError(
                    "sim_latent given but this denoiser has no sim conditioning; "
                    "call add_sim_conditioning()"
                )
            if sim_latent.shape != latents.shape:
                raise ValueError(
                    f"sim_latent shape {tuple(sim_latent.shape)} "
                    f"!= latents shape {tuple(latents.shape)}"
                )
            if gate is None:
                gate = torch.ones(batch, device=latents.device)
            if gate.shape != (batch,):
                raise ValueError(f"gate must be ({batch},), got {tuple(gate.shape)}")
        return self._predict(latents, timestep, actions, sim_latent, gate)

    @staticmethod
    def frame_timesteps(timestep: torch.Tensor, latent_frames: int) -> torch.Tensor:
        """(B,) -> (B, L) with the clean first latent frame at timestep 0."""
        t = timestep[:, None].expand(-1, latent_frames).clone()
        t[:, 0] = 0.0
        return t
