"""Bring-your-own expert: a TorchScript policy (e.g. rsl_rl / IsaacLab `policy.pt` export).

The exported module maps a flat observation (1, obs_dim) float32 tensor to a (1, action_dim)
action. `obs_fn` builds that observation from an Observation, so one loader serves both robots
(UR5e: e.g. privileged task state; Go2: the 433-dim official observation).
"""

from __future__ import annotations

import pathlib
import zipfile
from typing import Callable

import numpy as np
import torch

from robot_drivers.interface import Observation


class TorchScriptPolicy:
    """A `Policy` wrapping a scripted module; recurrent exports are reset through their
    `reset()` / `reset_memory()` method when they have one."""

    def __init__(
        self,
        module: torch.jit.ScriptModule,
        obs_fn: Callable[[Observation], np.ndarray],
        action_dim: int | None = None,
        device: str | torch.device = "cpu",
        name: str = "torchscript",
    ):
        self.module, self.obs_fn, self.action_dim = module, obs_fn, action_dim
        self.device, self.name = torch.device(device), name

    def reset(self, seed: int | None = None) -> None:
        for method in ("reset", "reset_memory"):
            if hasattr(self.module, method):
                getattr(self.module, method)()
                return

    @torch.no_grad()
    def act(self, obs: Observation) -> np.ndarray:
        x = np.asarray(self.obs_fn(obs), dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"{self.name}: obs_fn must return a flat vector, got shape {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{self.name}: observation contains NaN or Inf")
        out = self.module(torch.as_tensor(x, device=self.device)[None])
        if isinstance(out, (tuple, list)):
            out = out[0]
        a = out.detach().to("cpu", torch.float32).numpy().reshape(-1)
        if self.action_dim is not None and a.shape != (self.action_dim,):
            raise ValueError(
                f"{self.name}: policy returned {a.shape[0]} values, expected {self.action_dim}"
            )
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{self.name}: policy returned NaN or Inf: {a.tolist()}")
        return a


def load_torchscript_policy(
    path: str | pathlib.Path,
    obs_fn: Callable[[Observation], np.ndarray],
    action_dim: int | None = None,
    device: str | torch.device = "cpu",
) -> TorchScriptPolicy:
    """Load a TorchScript policy file; clear errors for a missing, foreign or corrupt file."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"TorchScript policy not found: {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not a TorchScript archive (expected a zip written by "
            "torch.jit.save / rsl_rl's exporter)"
        )
    try:
        module = torch.jit.load(str(path), map_location=torch.device(device))
    except Exception as e:  # torch raises RuntimeError for most archive defects
        raise ValueError(f"{path} is a corrupt or incompatible TorchScript archive: {e}") from e
    module.eval()
    return TorchScriptPolicy(module, obs_fn, action_dim, device, name=path.stem)
