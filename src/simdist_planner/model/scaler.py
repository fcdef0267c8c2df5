"""Fitted per-dimension normalisation, held inside the model as buffers and saved as JSON.

Losses compare scaler-normalised predictions and targets (the official way of weighting Eq. 2),
while the model's public API takes and returns raw physical units.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

SCALER_FORMAT_VERSION = 1
# A dimension whose training std is below this is constant: it is centred but not scaled, so a
# later non-constant value is not blown up by a near-zero divisor.
STD_FLOOR = 1e-6


def scaler_dims(config) -> dict[str, tuple[int, ...]]:
    """The normalised quantities of a world model and their per-sample shapes."""
    dims: dict[str, tuple[int, ...]] = {
        "proprio": (config.proprio_dim,),
        "actions": (config.action_dim,),
        "rewards": (1,),
        "values": (1,),
    }
    if config.command_dim:
        dims["command"] = (config.command_dim,)
    if config.height_map is not None:
        dims["height_map"] = tuple(config.height_map.shape)
    if config.state_dim:
        dims["state"] = (config.state_dim,)
    return dims


class Scaler(nn.Module):
    """mean / std buffers per quantity; `normalize(name, x)` works on any leading dims."""

    def __init__(self, dims: Mapping[str, tuple[int, ...]], eps: float = 0.0):
        super().__init__()
        self.dims = {k: tuple(v) for k, v in dims.items()}
        self.eps = eps  # normalize divides by std + eps (official: 1e-8); denormalize uses std
        for name, shape in self.dims.items():
            self.register_buffer(f"{name}_mean", torch.zeros(shape))
            self.register_buffer(f"{name}_std", torch.ones(shape))

    def mean(self, name: str) -> torch.Tensor:
        return getattr(self, f"{name}_mean")

    def std(self, name: str) -> torch.Tensor:
        return getattr(self, f"{name}_std")

    def normalize(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean(name)) / (self.std(name) + self.eps)

    def denormalize(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return x * self.std(name) + self.mean(name)

    # scalar series (rewards, values) are stored with a trailing dim of 1
    def normalize_scalar(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean(name)[0]) / (self.std(name)[0] + self.eps)

    def denormalize_scalar(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return x * self.std(name)[0] + self.mean(name)[0]

    @torch.no_grad()
    def fit(self, data: Mapping[str, np.ndarray | torch.Tensor]) -> "Scaler":
        """Set mean / std from samples; each array is (..., *dims[name]). All names required."""
        missing = sorted(set(self.dims) - set(data))
        if missing:
            raise ValueError(f"Scaler.fit: no samples for {missing}; expected {sorted(self.dims)}")
        for name, shape in self.dims.items():
            x = torch.as_tensor(np.asarray(data[name]), dtype=torch.float64)
            if name in ("rewards", "values") and x.shape[-1:] != (1,):
                x = x.unsqueeze(-1)
            if tuple(x.shape[x.dim() - len(shape) :]) != shape:
                raise ValueError(
                    f"Scaler.fit: {name} samples have shape {tuple(x.shape)}, expected (..., "
                    f"{', '.join(map(str, shape))})"
                )
            x = x.reshape(-1, *shape)
            if x.shape[0] < 2 or not torch.isfinite(x).all():
                raise ValueError(f"Scaler.fit: {name} needs >= 2 finite samples, got {x.shape[0]}")
            std = x.std(0)
            std = torch.where(std < STD_FLOOR, torch.ones_like(std), std)
            self.mean(name).copy_(x.mean(0).float())
            self.std(name).copy_(std.float())
        return self

    def to_dict(self) -> dict:
        return {
            "format_version": SCALER_FORMAT_VERSION,
            "stats": {
                name: {
                    "shape": list(shape),
                    "mean": self.mean(name).flatten().tolist(),
                    "std": self.std(name).flatten().tolist(),
                }
                for name, shape in self.dims.items()
            },
        }

    @torch.no_grad()
    def load_dict(self, data: dict, source: str = "scaler") -> None:
        """Load `to_dict()` output; raises ValueError if names, shapes or values do not fit."""
        if not isinstance(data, dict) or data.get("format_version") != SCALER_FORMAT_VERSION:
            got = data.get("format_version") if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"{source}: scaler format_version {got!r}, expected {SCALER_FORMAT_VERSION}"
            )
        stats = data.get("stats")
        if not isinstance(stats, dict) or set(stats) != set(self.dims):
            got = sorted(stats) if isinstance(stats, dict) else stats
            raise ValueError(
                f"{source}: scaler has quantities {got}, model needs {sorted(self.dims)}"
            )
        for name, shape in self.dims.items():
            entry = stats[name]
            if list(entry.get("shape", [])) != list(shape):
                raise ValueError(
                    f"{source}: scaler {name} has shape {entry.get('shape')}, "
                    f"model needs {list(shape)}"
                )
            n = math.prod(shape)
            mean = np.asarray(entry.get("mean", []), dtype=np.float64)
            std = np.asarray(entry.get("std", []), dtype=np.float64)
            if mean.shape != (n,) or std.shape != (n,):
                raise ValueError(f"{source}: scaler {name} needs {n} means and stds")
            if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
                raise ValueError(f"{source}: scaler {name} has non-finite values or std <= 0")
            self.mean(name).copy_(torch.from_numpy(mean.reshape(shape)).float())
            self.std(name).copy_(torch.from_numpy(std.reshape(shape)).float())

    def save_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)

    def load_json(self, path) -> None:
        try:
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: scaler is not valid JSON ({err})") from err
        self.load_dict(data, source=str(path))
