"""Observation encoder E and history encoder C.

E maps (normalised proprio, height map, camera images) to the latent z; C turns the last H
proprio / action pairs into 2H interleaved tokens with temporal and type embeddings. Both share
the proprio MLP, as in the official model.
"""

from __future__ import annotations

import math
import pathlib

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from simdist_planner.model.config import (
    HeightMapEncoderConfig,
    ImageEncoderConfig,
    WorldModelConfig,
)
from simdist_planner.model.transformers import MLP

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class SamePadConv2d(nn.Conv2d):
    """Conv2d with TF / flax 'SAME' padding: output ceil(n / stride), odd pad pixel at the end."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []  # F.pad order: last dim first
        for n, k, s in zip(
            reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)
        ):
            total = max((math.ceil(n / s) - 1) * s + k - n, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


class HeightMapEncoder(nn.Module):
    """Stride-2 CNN with per-row / per-column spatial embeddings, flattened and projected to D."""

    def __init__(self, cfg: HeightMapEncoderConfig, latent_dim: int):
        super().__init__()
        self.shape = tuple(cfg.shape)
        self.flip = cfg.flip
        layers: list[nn.Module] = []
        prev = 1
        for i, (ch, stride) in enumerate(zip(cfg.channels, cfg.strides)):
            if cfg.padding == "same":
                layers.append(SamePadConv2d(prev, ch, cfg.kernel_size, stride, padding=0))
            else:
                layers.append(
                    nn.Conv2d(prev, ch, cfg.kernel_size, stride, padding=cfg.kernel_size // 2)
                )
            if i < len(cfg.channels) - 1:
                layers.append(nn.GELU())
            prev = ch
        self.cnn = nn.Sequential(*layers)
        h, w = self.shape
        for s in cfg.strides:  # "same" padding: ceil(n / stride) per layer
            h, w = math.ceil(h / s), math.ceil(w / s)
        self.row_embed = nn.Parameter(torch.randn(prev, h, 1) * 0.02)
        self.col_embed = nn.Parameter(torch.randn(prev, 1, w) * 0.02)
        self.proj = MLP(prev * h * w, list(cfg.projection_hidden), latent_dim)

    def forward(self, height_map: torch.Tensor) -> torch.Tensor:
        if self.flip:
            height_map = height_map.flip(-2, -1)
        x = self.cnn(height_map.unsqueeze(1))
        x = x + self.row_embed + self.col_embed
        return self.proj(x.flatten(1))


def _conv_stack(channels, strides, height: int, width: int, last_activation: bool):
    """3x3 convs with "same" padding and GELUs: (nn.Sequential, out channels, out h, out w)."""
    layers: list[nn.Module] = []
    prev, h, w = 3, height, width
    for i, (ch, stride) in enumerate(zip(channels, strides)):
        layers.append(nn.Conv2d(prev, ch, 3, stride, padding=1))
        if last_activation or i < len(channels) - 1:
            layers.append(nn.GELU())
        prev, h, w = ch, math.ceil(h / stride), math.ceil(w / stride)
    return nn.Sequential(*layers), prev, h, w


class SmallCNN(nn.Module):
    """Stride-2 3x3 conv stack, flattened and projected: cheap enough for CPU training."""

    def __init__(self, cfg: ImageEncoderConfig):
        super().__init__()
        strides = [2] * len(cfg.small_cnn_channels)
        self.cnn, ch, h, w = _conv_stack(
            cfg.small_cnn_channels, strides, cfg.height, cfg.width, last_activation=True
        )
        self.proj = nn.Linear(ch * h * w, cfg.small_cnn_features)
        self.out_features = cfg.small_cnn_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.cnn(x).flatten(1))


def resnet18_backbone(weights_path: str) -> nn.Module:
    """torchvision ResNet-18 without its classifier (512 features); local weights if given.

    Weights are read from a .safetensors file, or a torchvision .pth through torch.load with
    weights_only=True (no arbitrary unpickling). Nothing is ever downloaded.
    """

    # torchvision is imported here, not at the top: importing it loads torch._dynamo (about as
    # long again as torch's own import), which every process without a ResNet would pay
    from torchvision.models import resnet18  # noqa: PLC0415

    net = resnet18(weights=None)
    net.fc = nn.Identity()
    if weights_path:
        path = pathlib.Path(weights_path)
        if not path.is_file():
            raise FileNotFoundError(f"ResNet-18 weights file {path} does not exist")
        if path.suffix == ".safetensors":
            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        state = {k: v for k, v in state.items() if not k.startswith("fc.")}
        missing, unexpected = net.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"{path}: not ResNet-18 weights "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
    return net


class ImageEncoder(nn.Module):
    """One backbone shared by all cameras; per-camera features are concatenated."""

    pixel_mean: torch.Tensor  # (3, 1, 1) ImageNet normalisation buffers
    pixel_std: torch.Tensor

    def __init__(self, cfg: ImageEncoderConfig):
        super().__init__()
        self.size = (cfg.height, cfg.width)
        self.num_cameras = len(cfg.cameras)
        if cfg.backbone == "resnet18":
            self.backbone = resnet18_backbone(cfg.weights_path)
            per_camera = 512
        else:
            self.backbone = SmallCNN(cfg)
            per_camera = self.backbone.out_features
        # Convolutions run channels-last (NHWC), weights and input alike: oneDNN on the CPU and
        # cuDNN run them faster than NCHW (docs/planner.md). Checkpoints store them contiguous.
        self.backbone.to(memory_format=torch.channels_last)
        self.out_features = per_camera * self.num_cameras
        self.register_buffer(
            "pixel_mean", torch.tensor(IMAGENET_MEAN).view(3, 1, 1), persistent=False
        )
        self.register_buffer(
            "pixel_std", torch.tensor(IMAGENET_STD).view(3, 1, 1), persistent=False
        )

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """(N, n_cam, 3, h, w) uint8 or [0, 1] float -> (N * n_cam, 3, H, W) ImageNet-normalised."""
        if images.dim() != 5 or images.shape[1] != self.num_cameras or images.shape[2] != 3:
            raise ValueError(
                f"images have shape {tuple(images.shape)}, "
                f"expected (B, {self.num_cameras}, 3, h, w)"
            )
        x = images.flatten(0, 1)
        x = x.float() / 255.0 if images.dtype == torch.uint8 else x.float()
        if tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(
                x, size=self.size, mode="bilinear", antialias=True, align_corners=False
            )
        return ((x - self.pixel_mean) / self.pixel_std).contiguous(
            memory_format=torch.channels_last
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n = images.shape[0]
        return self.backbone(self.preprocess(images)).reshape(n, self.out_features)


class ObservationEncoder(nn.Module):
    """E: proprio MLP, optional height-map and image features, fused by the latent MLP into z."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        d, hidden = cfg.latent_dim, cfg.latent_dim * cfg.encoder_hidden_factor
        self.proprio = MLP(cfg.proprio_dim, [hidden] * cfg.proprio_layers, d)
        fused = d
        self.height_map = None
        if cfg.height_map is not None:
            self.height_map = HeightMapEncoder(cfg.height_map, d)
            fused += d
        self.images = None
        if cfg.image is not None:
            self.images = ImageEncoder(cfg.image)
            fused += self.images.out_features
        self.latent = MLP(fused, [hidden] * cfg.latent_layers, d)
        self.latent_norm = nn.LayerNorm(d) if cfg.normalize_latent else nn.Identity()

    def forward(
        self, proprio: torch.Tensor, height_map: torch.Tensor | None, images: torch.Tensor | None
    ) -> torch.Tensor:
        """Normalised proprio (N, P), height map (N, h, w), raw images (N, n_cam, 3, h, w)."""
        parts = [self.proprio(proprio)]
        if self.height_map is not None:
            parts.append(self.height_map(height_map))
        if self.images is not None:
            parts.append(self.images(images))
        return self.latent_norm(self.latent(torch.cat(parts, dim=-1)))


class HistoryEncoder(nn.Module):
    """C: interleaved proprio / action tokens + temporal and type embeddings; z_t token helper."""

    PROPRIO, ACTION, LATENT = 0, 1, 2

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        d = cfg.latent_dim
        self.history = cfg.history
        self.action = MLP(cfg.action_dim, [d * cfg.encoder_hidden_factor] * cfg.action_layers, d)
        self.temporal = nn.Parameter(torch.randn(cfg.history + 1, d) * 0.02)
        self.types = nn.Parameter(torch.randn(3, d) * 0.02)

    def forward(self, proprio_tokens: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """proprio_tokens (B, h, D) from E's proprio MLP, normalised actions (B, h, A)
        -> (B, 2h, D).

        A history shorter than H uses the last h temporal embeddings, so the newest step always
        sits next to the z_t token.
        """
        b, h, d = proprio_tokens.shape
        if h > self.history:
            raise ValueError(f"history of {h} steps is longer than the model's H = {self.history}")
        temporal = self.temporal[self.history - h : self.history]
        p = proprio_tokens + temporal + self.types[self.PROPRIO]
        a = self.action(actions) + temporal + self.types[self.ACTION]
        return torch.stack((p, a), dim=2).reshape(b, 2 * h, d)

    def latent_token(self, z: torch.Tensor) -> torch.Tensor:
        return z + self.temporal[self.history] + self.types[self.LATENT]
