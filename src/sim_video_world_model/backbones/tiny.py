"""The built-in backbone: a small causal video autoencoder and a small latent video DiT.

Autoencoder: a per-frame 2D conv encoder (spatial factor 2/4/8), then Wan's causal temporal
layout: latent frame 0 encodes frame 0 alone, latent frame k the 4 frames 4k-3..4k. Frame 0 goes
through the same temporal encoder as the groups, repeated 4 times (a causal layout's replicate
padding), so a static scene has the same latent in every latent frame: latent motion (adjacent
latent differences, SimForcing's distillation target) is zero where nothing moves, whatever the
scene looks like. With a separate first-frame encoder, the offset between the two encoders depends
on the content, and a static sim background over black would ask a static real table to move.
DiT blocks: adaLN self-attention -> cross-attention to the action tokens -> [sim conditioning
add] -> adaLN FFN, on (1, 2, 2) patches of the latent video.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from sim_video_world_model.backbones.base import (
    ActionEncoder,
    SimConditioning,
    VideoAutoencoder,
    VideoDenoiser,
    sinusoid,
)
from sim_video_world_model.config import TinyBackboneConfig


class TinyVideoAutoencoder(VideoAutoencoder):
    latent_mean: torch.Tensor  # (latent_channels,) buffers, fitted by fit_normalization
    latent_std: torch.Tensor

    def __init__(self, cfg: TinyBackboneConfig):
        super().__init__()
        c, z = cfg.ae_channels, cfg.latent_channels
        self.latent_channels = z
        self.temporal_factor = cfg.temporal_factor
        self.spatial_factor = cfg.spatial_factor
        downs = int(math.log2(cfg.spatial_factor))
        # Strided from the first layer and transposed to 3 channels at the last: nothing runs with
        # c channels at full resolution, which keeps the autoencoder cheap on a CPU.
        enc = [
            nn.Conv2d(3, c, 4, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(c, c, 3, padding=1),
            nn.SiLU(),
        ]
        for _ in range(downs - 1):
            enc += [
                nn.Conv2d(c, c, 4, stride=2, padding=1),
                nn.SiLU(),
                nn.Conv2d(c, c, 3, padding=1),
                nn.SiLU(),
            ]
        dec = []
        for _ in range(downs - 1):
            dec += [
                nn.Conv2d(c, c, 3, padding=1),
                nn.SiLU(),
                nn.ConvTranspose2d(c, c, 4, stride=2, padding=1),
                nn.SiLU(),
            ]
        dec += [
            nn.Conv2d(c, c, 3, padding=1),
            nn.SiLU(),
            nn.ConvTranspose2d(c, 3, 4, stride=2, padding=1),
        ]
        self.frame_encoder = nn.Sequential(*enc)
        self.frame_decoder = nn.Sequential(*dec)
        tf = cfg.temporal_factor
        self.group_in, self.group_out = nn.Conv2d(tf * c, z, 1), nn.Conv2d(z, tf * c, 1)
        # Per-channel latent statistics, fitted once after autoencoder training (fit_normalization).
        self.register_buffer("latent_mean", torch.zeros(z))
        self.register_buffer("latent_std", torch.ones(z))

    def _raw_encode(self, video: torch.Tensor) -> torch.Tensor:
        b, _, t, h, w = video.shape
        feats = self.frame_encoder(video.transpose(1, 2).reshape(b * t, 3, h, w))
        feats = feats.view(b, t, *feats.shape[1:])
        tf = self.temporal_factor
        out = [self.group_in(feats[:, :1].expand(-1, tf, -1, -1, -1).flatten(1, 2))]
        for k in range(1, 1 + (t - 1) // tf):
            group = feats[:, 1 + (k - 1) * tf : 1 + k * tf]  # (B, tf, c, h, w)
            out.append(self.group_in(group.flatten(1, 2)))
        return torch.stack(out, dim=2)  # (B, z, L, h', w')

    def _raw_decode(self, latents: torch.Tensor) -> torch.Tensor:
        b, _, num_latent, h, w = latents.shape
        tf = self.temporal_factor
        # latent frame 0 decodes to its group's last frame (frame 0 itself, after the padding)
        frames = [self.group_out(latents[:, :, 0]).view(b, tf, -1, h, w)[:, -1]]
        for k in range(1, num_latent):
            g = self.group_out(latents[:, :, k])
            frames.extend(g.view(b, tf, -1, h, w).unbind(1))
        feats = torch.stack(frames, dim=1)  # (B, T, c, h, w)
        t = feats.shape[1]
        pixels = self.frame_decoder(feats.flatten(0, 1))
        return pixels.view(b, t, 3, *pixels.shape[-2:]).transpose(1, 2)

    def reconstruct(self, video: torch.Tensor) -> torch.Tensor:
        """Differentiable encode -> decode in raw latent space (autoencoder training)."""
        self.check_video(video)
        return self._raw_decode(self._raw_encode(video))

    @torch.no_grad()
    def fit_normalization(self, videos: torch.Tensor) -> None:
        z = self._raw_encode(videos)
        self.latent_mean.copy_(z.mean(dim=(0, 2, 3, 4)))
        self.latent_std.copy_(z.std(dim=(0, 2, 3, 4)).clamp_min(1e-4))

    def _stats(self, like):
        shape = (1, -1, 1, 1, 1)
        return self.latent_mean.view(shape).to(like.dtype), self.latent_std.view(shape).to(
            like.dtype
        )

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        self.check_video(video)
        z = self._raw_encode(video)
        mean, std = self._stats(z)
        return (z - mean) / std

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return self._raw_decode(latents * std + mean).clamp(-1.0, 1.0)


class _Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, action_dim_tokens: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False)
        self.attn1 = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(hidden)
        self.attn2 = nn.MultiheadAttention(
            hidden, heads, kdim=action_dim_tokens, vdim=action_dim_tokens, batch_first=True
        )
        self.norm3 = nn.LayerNorm(hidden, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(hidden, ffn), nn.GELU(approximate="tanh"), nn.Linear(ffn, hidden)
        )
        self.modulation = nn.Parameter(torch.randn(1, 1, 6, hidden) / hidden**0.5)

    def forward(self, x, actions, tmod, sim_tokens):
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation + tmod).unbind(2)
        h = self.norm1(x) * (1 + scale1) + shift1
        x = x + gate1 * self.attn1(h, h, h, need_weights=False)[0]
        x = x + self.attn2(self.norm2(x), actions, actions, need_weights=False)[0]
        if sim_tokens is not None:
            x = x + sim_tokens
        h = self.norm3(x) * (1 + scale2) + shift2
        return x + gate2 * self.ffn(h)


class TinyVideoDiT(VideoDenoiser):
    def __init__(self, cfg: TinyBackboneConfig, action_dim: int, max_actions: int):
        super().__init__()
        self.cfg = cfg
        self.action_dim = action_dim
        self.latent_channels = cfg.latent_channels
        self.patch_size = cfg.patch_size
        d = cfg.hidden
        self.patch_embedding = nn.Conv3d(
            cfg.latent_channels, d, kernel_size=cfg.patch_size, stride=cfg.patch_size
        )
        self.time_embedding = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.action_branch = ActionEncoder(
            action_dim,
            cfg.action_hidden,
            cfg.action_hidden,
            cfg.action_layers,
            cfg.action_heads,
            max_actions,
        )
        self.blocks = nn.ModuleList(
            _Block(d, cfg.heads, cfg.ffn, cfg.action_hidden) for _ in range(cfg.layers)
        )
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False)
        self.out_modulation = nn.Parameter(torch.randn(1, 1, 2, d) / d**0.5)
        self.proj_out = nn.Linear(d, cfg.latent_channels * math.prod(cfg.patch_size))
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)
        self.sim_conditioning = None
        self.gradient_checkpointing = False

    def add_sim_conditioning(self) -> None:
        if self.sim_conditioning is None:
            ref = self.proj_out.weight
            self.sim_conditioning = SimConditioning(
                len(self.blocks), self.latent_channels, self.cfg.hidden, self.patch_size
            ).to(ref.device, ref.dtype)

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        self.gradient_checkpointing = bool(enabled)

    def _predict(self, latents, timestep, actions, sim_latent, gate):
        b, c, f, h, w = latents.shape
        pt, ph, pw = self.patch_size
        if f % pt or h % ph or w % pw:
            raise ValueError(
                f"latent grid {(f, h, w)} must be divisible by the patch size {self.patch_size}"
            )
        nf, nh, nw = f // pt, h // ph, w // pw
        d = self.cfg.hidden
        x = self.patch_embedding(latents).flatten(2).transpose(1, 2)  # (B, N, D)
        grid = torch.stack(
            torch.meshgrid(torch.arange(nf), torch.arange(nh), torch.arange(nw), indexing="ij"), -1
        )
        grid = grid.reshape(-1, 3).to(latents.device)
        pos = cast(
            torch.Tensor, sum(sinusoid(grid[:, i] * (1 + 7 * i), d) for i in range(3))
        )  # distinct frequencies per axis
        x = x + pos.to(x.dtype)
        frame_t = self.frame_timesteps(timestep, f)[:, ::pt]  # (B, nf)
        temb = self.time_embedding(sinusoid(frame_t, d).to(x.dtype))  # (B, nf, D)
        temb = temb.repeat_interleave(nh * nw, dim=1)  # per token
        tmod = self.time_projection(temb).view(b, -1, 6, d)
        act = self.action_branch(actions.to(x.dtype))
        # a sim latent comes with the conditioning (the denoiser's input check refuses it alone)
        conditioning = self.sim_conditioning if sim_latent is not None else None
        for j, block in enumerate(self.blocks):
            sim_tokens = None
            if conditioning is not None:
                sim_tokens = conditioning.tokens(j, sim_latent, gate)
            if self.gradient_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, act, tmod, sim_tokens, use_reentrant=False)
            else:
                x = block(x, act, tmod, sim_tokens)
        shift, scale = (self.out_modulation + temb.unsqueeze(2)).unbind(2)
        x = self.proj_out(self.norm_out(x) * (1 + scale) + shift)
        x = x.view(b, nf, nh, nw, pt, ph, pw, c).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, c, f, h, w)
