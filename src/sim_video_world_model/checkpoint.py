"""Checkpoints as directories of safetensors + JSON; nothing is ever unpickled.

config.json              format version, backbone / objective config, stage, data facts
autoencoder.safetensors  (tiny backbone, or a randomly initialised Wan VAE; a pretrained Wan
                         VAE is reloaded from backbone.wan.model_dir instead)
denoiser.safetensors     transformer + action branch (+ sim-conditioning projections)
optimizer.safetensors, train_state.json   only while a stage is resumable
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file

from sim_video_world_model.backbones import build_backbone
from sim_video_world_model.backbones.base import VideoAutoencoder, VideoDenoiser
from sim_video_world_model.config import FORMAT_VERSION, BackboneConfig, from_dict, to_dict


@dataclass
class ModelBundle:
    autoencoder: VideoAutoencoder
    denoiser: VideoDenoiser
    backbone: BackboneConfig
    info: dict  # stage, variant, num_frames, image_size, action_low, action_high, ...


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}


def _saves_autoencoder(backbone: BackboneConfig) -> bool:
    return backbone.kind == "tiny" or backbone.wan.vae_config is not None


def save_bundle(path: str, bundle: ModelBundle) -> None:
    os.makedirs(path, exist_ok=True)
    info = dict(bundle.info, sim_conditioning=bundle.denoiser.sim_conditioning is not None)
    config = {"format_version": FORMAT_VERSION, "backbone": to_dict(bundle.backbone), "info": info}
    save_file(_state(bundle.denoiser), os.path.join(path, "denoiser.safetensors"))
    if _saves_autoencoder(bundle.backbone):
        save_file(_state(bundle.autoencoder), os.path.join(path, "autoencoder.safetensors"))
    tmp = os.path.join(path, "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(config, f, indent=2)
    os.replace(tmp, os.path.join(path, "config.json"))


def _load_into(module: torch.nn.Module, file: str) -> None:
    if not os.path.isfile(file):
        raise FileNotFoundError(f"checkpoint file missing: {file}")
    try:
        module.load_state_dict(load_file(file), strict=True)
    except RuntimeError as err:
        raise ValueError(f"{file} does not match the model built from config.json: {err}") from err


def load_bundle(path: str, device: str | torch.device = "cpu") -> ModelBundle:
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"{path} is not a SimForcing checkpoint (no config.json)")
    with open(cfg_file) as f:
        config = json.load(f)
    if config.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: checkpoint format {config.get('format_version')}, expected {FORMAT_VERSION}; "
            "train it again with this version (simforcing-train)"
        )
    backbone = from_dict(BackboneConfig, config["backbone"])
    autoencoder, denoiser = build_backbone(backbone)
    if config["info"].get("sim_conditioning"):
        denoiser.add_sim_conditioning()
    _load_into(denoiser, os.path.join(path, "denoiser.safetensors"))
    if _saves_autoencoder(backbone):
        _load_into(autoencoder, os.path.join(path, "autoencoder.safetensors"))
    autoencoder.requires_grad_(False).eval()
    return ModelBundle(autoencoder.to(device), denoiser.to(device), backbone, config["info"])


def save_optimizer(
    path: str, optimizer: torch.optim.Optimizer, step: int, extra: dict | None = None
) -> None:
    sd = optimizer.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            tensors[f"{idx}.{key}"] = torch.as_tensor(value).detach().contiguous().cpu()
    save_file(tensors, os.path.join(path, "optimizer.safetensors"))
    with open(os.path.join(path, "train_state.json"), "w") as f:
        json.dump({"step": step, "param_groups": sd["param_groups"], **(extra or {})}, f, indent=2)


def load_optimizer(path: str, optimizer: torch.optim.Optimizer) -> dict:
    with open(os.path.join(path, "train_state.json")) as f:
        meta = json.load(f)
    state: dict[int, dict] = {}
    for name, tensor in load_file(os.path.join(path, "optimizer.safetensors")).items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta
