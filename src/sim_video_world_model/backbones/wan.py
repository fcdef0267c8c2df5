"""Wan2.2-TI2V-5B through diffusers: `WanTransformer3DModel` + `AutoencoderKLWan`.

Actions enter through an action branch whose tokens replace the text embeddings the blocks
cross-attend to; the first latent frame is the clean observation (per-token timestep 0, Wan2.2
TI2V's convention). Sim conditioning is a forward hook on each block's `attn2` (cross-attention)
that adds the gated projection to its output, i.e. before the block's FFN.
"""

from __future__ import annotations

import functools
import os

import torch

from sim_video_world_model.backbones.base import (
    ActionEncoder,
    SimConditioning,
    VideoAutoencoder,
    VideoDenoiser,
)
from sim_video_world_model.config import BackboneConfig


def _require_dir(model_dir: str, subfolder: str) -> str:
    path = os.path.join(model_dir, subfolder)
    if not model_dir or not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            "Wan2.2 weights not found: expected a diffusers folder with "
            f"{subfolder}/config.json under {model_dir!r} (e.g. a local copy of "
            "Wan2.2-TI2V-5B-Diffusers); set backbone.wan.model_dir"
        )
    return path


class WanVideoAutoencoder(VideoAutoencoder):
    """AutoencoderKLWan with its latents_mean / latents_std normalisation; mode of the posterior."""

    latent_mean: torch.Tensor  # (z_dim,) buffers, from the VAE's config
    latent_std: torch.Tensor

    def __init__(self, vae):
        super().__init__()
        self.vae = vae
        cfg = vae.config
        self.latent_channels = int(cfg.z_dim)
        self.temporal_factor = int(cfg.scale_factor_temporal)
        self.spatial_factor = int(cfg.scale_factor_spatial)
        self.register_buffer(
            "latent_mean", torch.tensor(cfg.latents_mean, dtype=torch.float32), persistent=False
        )
        self.register_buffer(
            "latent_std", torch.tensor(cfg.latents_std, dtype=torch.float32), persistent=False
        )

    def _stats(self, like):
        shape = (1, -1, 1, 1, 1)
        return self.latent_mean.view(shape).to(like), self.latent_std.view(shape).to(like)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        self.check_video(video)
        z = self.vae.encode(video.to(self.vae.dtype)).latent_dist.mode()
        mean, std = self._stats(z)
        return (z - mean) / std

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return self.vae.decode((latents * std + mean).to(self.vae.dtype)).sample.clamp(-1.0, 1.0)


class WanVideoDenoiser(VideoDenoiser):
    def __init__(
        self,
        transformer,
        action_dim: int,
        max_actions: int,
        action_hidden: int,
        action_layers: int,
        action_heads: int,
    ):
        super().__init__()
        self.transformer = transformer
        cfg = transformer.config
        self.action_dim = action_dim
        self.latent_channels = int(cfg.in_channels)
        self.patch_size = tuple(cfg.patch_size)
        self.hidden = int(cfg.num_attention_heads * cfg.attention_head_dim)
        self.action_branch = ActionEncoder(
            action_dim, action_hidden, int(cfg.text_dim), action_layers, action_heads, max_actions
        )
        self.sim_conditioning = None
        self._sim_state: tuple[torch.Tensor, torch.Tensor] | None = None
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []

    def add_sim_conditioning(self) -> None:
        if self.sim_conditioning is not None:
            return
        ref = self.transformer.proj_out.weight
        self.sim_conditioning = SimConditioning(
            len(self.transformer.blocks), self.latent_channels, self.hidden, self.patch_size
        ).to(ref.device, ref.dtype)
        for j, block in enumerate(self.transformer.blocks):
            self._hooks.append(
                block.attn2.register_forward_hook(functools.partial(self._after_cross_attention, j))
            )

    def _after_cross_attention(self, index, module, args, output):
        """Block j's attn2 output + g * P_j(sim latent); the residual carries it into the FFN."""
        if self._sim_state is None or self.sim_conditioning is None:
            return None  # no sim latent this call (the hooks exist only with the conditioning)
        sim_latent, gate = self._sim_state
        return output + self.sim_conditioning.tokens(index, sim_latent, gate).to(output.dtype)

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        if enabled:
            self.transformer.enable_gradient_checkpointing()
        else:
            self.transformer.disable_gradient_checkpointing()

    def _predict(self, latents, timestep, actions, sim_latent, gate):
        b, _, f, h, w = latents.shape
        pt, ph, pw = self.patch_size
        tokens_per_frame = (h // ph) * (w // pw)
        frame_t = self.frame_timesteps(timestep, f)[:, ::pt]
        token_t = frame_t.repeat_interleave(tokens_per_frame, dim=1)  # (B, seq): Wan2.2 TI2V layout
        dtype = self.transformer.dtype
        context = self.action_branch(actions.to(self.action_branch.inp.weight.dtype)).to(dtype)
        # Kept until the next call: gradient checkpointing re-runs the hook during backward.
        self._sim_state = None if sim_latent is None else (sim_latent, gate)
        out = self.transformer(
            hidden_states=latents.to(dtype),
            timestep=token_t,
            encoder_hidden_states=context,
            return_dict=False,
        )[0]
        return out.to(latents.dtype)


def build_wan(cfg: BackboneConfig) -> tuple[WanVideoAutoencoder, WanVideoDenoiser]:
    """Random-init from `transformer_config` / `vae_config` if given, else `from_pretrained()`.

    `from_pretrained` reads `model_dir`.
    """
    from diffusers import AutoencoderKLWan, WanTransformer3DModel  # noqa: PLC0415 - the Wan2.2 backbone only; diffusers is heavy to import

    wcfg = cfg.wan
    dtype = getattr(torch, wcfg.dtype)
    if wcfg.transformer_config is not None:
        transformer = WanTransformer3DModel(**wcfg.transformer_config)
    else:
        transformer = WanTransformer3DModel.from_pretrained(
            _require_dir(wcfg.model_dir, "transformer"), torch_dtype=dtype
        )
    if wcfg.vae_config is not None:
        vae = AutoencoderKLWan(**wcfg.vae_config)
    else:
        vae = AutoencoderKLWan.from_pretrained(
            _require_dir(wcfg.model_dir, "vae"), torch_dtype=dtype
        )
    # the ignores below: diffusers' top-level names resolve, for a type checker, to the torch-less
    # placeholder classes its __init__ imports under TYPE_CHECKING (utils.dummy_pt_objects), which
    # lack every nn.Module attribute; the runtime classes are nn.Modules
    vae.requires_grad_(False).eval()  # type: ignore[attr-defined]
    denoiser = WanVideoDenoiser(
        transformer,
        cfg.action_dim,
        cfg.max_actions,
        wcfg.action_hidden,
        wcfg.action_layers,
        wcfg.action_heads,
    ).to(transformer.dtype)  # type: ignore[attr-defined]
    return WanVideoAutoencoder(vae), denoiser
