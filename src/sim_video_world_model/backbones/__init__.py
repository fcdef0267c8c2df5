"""Backbones behind one interface: `build_backbone(cfg) -> (autoencoder, denoiser)`."""

from __future__ import annotations

from sim_video_world_model.backbones.base import VideoAutoencoder, VideoDenoiser
from sim_video_world_model.backbones.tiny import TinyVideoAutoencoder, TinyVideoDiT
from sim_video_world_model.backbones.wan import build_wan
from sim_video_world_model.config import BackboneConfig


def build_backbone(cfg: BackboneConfig) -> tuple[VideoAutoencoder, VideoDenoiser]:
    if cfg.kind == "tiny":
        return TinyVideoAutoencoder(cfg.tiny), TinyVideoDiT(
            cfg.tiny, cfg.action_dim, cfg.max_actions
        )
    return build_wan(cfg)
