"""The official SimDist Go2 expert, its PPO checkpoints and its critic as `Policy` / value objects.

The TorchScript files come from the official release (github.com/CLeARoboticsLab/simdist); this
project never ships them. They are found through SIMDIST_GO2_EXPERTS, or any path a user brings
(a TorchScript policy exported by rsl_rl / IsaacLab taking the 433-dim observation).
All of them read `obs.privileged["expert_obs"]`, which the Go2 backends build with
`robot_drivers.go2.observation.build_expert_observation`.

Heading feedback for long straight runs (the robot drifts about -0.025 rad/s) is applied to the
yaw COMMAND by the task (`Go2TaskConfig.heading_gain`, like the official WalkStraightCommand),
not inside the policy: the expert, the recorded data and the planner then all see one command.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from robot_drivers.go2.observation import EXPERT_OBS_DIM
from robot_drivers.interface import Observation
from robot_drivers.tasks.base import Policy, Task

EXPERTS_ENV = "SIMDIST_GO2_EXPERTS"
EXPERT_ITERATION = 4999
# Sub-optimal checkpoints, best to worst (see the release notes: 2000/1000 walk, 500..300 sag or
# fall sometimes, 250..50 fall within 2 s, 0 holds a crouch).
CHECKPOINT_ITERATIONS = (2000, 1000, 500, 400, 300, 250, 200, 150, 100, 50, 0)
ACTION_DIM = 12
_WHERE = (
    "get them from the official SimDist release (github.com/CLeARoboticsLab/simdist, Go2 "
    "policies/ and critics/ exported as TorchScript) and point SIMDIST_GO2_EXPERTS at the folder "
    "(this repository's Makefile and tests use ../shared/simdist_go2_experts)"
)


def experts_dir(directory: str | os.PathLike | None = None) -> Path:
    """The folder holding policies/ and critics/; a clear error when it is not configured."""
    raw = directory if directory is not None else os.environ.get(EXPERTS_ENV)
    if not raw:
        raise FileNotFoundError(f"{EXPERTS_ENV} is not set; {_WHERE}")
    path = Path(raw)
    if not (path / "policies").is_dir():
        raise FileNotFoundError(f"{path} has no policies/ folder; {_WHERE}")
    return path


def _load(path: Path, device: str) -> torch.jit.ScriptModule:
    if not path.is_file():
        raise FileNotFoundError(f"missing TorchScript file {path}; {_WHERE}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load deprecation notice
        module = torch.jit.load(str(path), map_location=device)
    module.eval()
    return module


def _expert_obs(obs: Observation) -> np.ndarray:
    if obs.privileged is None or "expert_obs" not in obs.privileged:
        raise ValueError(
            "the Go2 expert needs obs.privileged['expert_obs'] (the 433-dim official observation); "
            "use a Go2 backend that builds it (MujocoGo2Backend or the hardware backend)"
        )
    x = np.asarray(obs.privileged["expert_obs"], dtype=np.float32)
    if x.shape != (EXPERT_OBS_DIM,):
        raise ValueError(f"expert_obs has shape {x.shape}, expected ({EXPERT_OBS_DIM},)")
    return x


class TorchScriptGo2Policy:
    """A Go2 policy from a TorchScript file: 433 inputs -> 12 raw joint-position actions."""

    def __init__(self, path: str | os.PathLike, device: str = "cpu", name: str | None = None):
        self.path = Path(path)
        self.device = device
        self.name = name or self.path.stem
        self.module = _load(self.path, device)
        out = self.act_batch(np.zeros((1, EXPERT_OBS_DIM), np.float32))
        if out.shape != (1, ACTION_DIM):
            raise ValueError(f"{self.path} maps (1, 433) to {out.shape}, expected (1, 12)")

    def reset(self, seed: int | None = None) -> None:
        """Stateless (observation history 1); nothing to reset."""

    @torch.no_grad()
    def act_batch(self, expert_obs: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.asarray(expert_obs, np.float32), device=self.device)
        return self.module(x).float().cpu().numpy()

    def act(self, obs: Observation) -> np.ndarray:
        return self.act_batch(_expert_obs(obs)[None])[0].astype(np.float64)

    def __repr__(self) -> str:
        return f"TorchScriptGo2Policy({self.name!r})"


class TorchScriptGo2Critic:
    """V^e: the expert's PPO critic on the 433-dim observation; callable Observation -> float."""

    def __init__(self, path: str | os.PathLike, device: str = "cpu"):
        self.path = Path(path)
        self.device = device
        self.module = _load(self.path, device)
        out = self.value_batch(np.zeros((1, EXPERT_OBS_DIM), np.float32))
        if out.shape != (1,):
            raise ValueError(
                f"{self.path} maps (1, 433) to values of shape {out.shape}, "
                "expected one value per row"
            )

    @torch.no_grad()
    def value_batch(self, expert_obs: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.asarray(expert_obs, np.float32), device=self.device)
        return self.module(x).float().reshape(len(x), -1)[:, 0].cpu().numpy()

    def __call__(self, obs: Observation) -> float:
        return float(self.value_batch(_expert_obs(obs)[None])[0])


def load_go2_ladder(
    directory: str | os.PathLike | None = None,
    device: str = "cpu",
    iterations: tuple[int, ...] = (EXPERT_ITERATION, *CHECKPOINT_ITERATIONS),
) -> list[TorchScriptGo2Policy]:
    """policy_4999 (the expert) then the intermediate checkpoints, best to worst."""
    root = experts_dir(directory) / "policies"
    return [TorchScriptGo2Policy(root / f"policy_{it}.pt", device) for it in iterations]


def load_go2_critic(
    directory: str | os.PathLike | None = None, device: str = "cpu"
) -> TorchScriptGo2Critic:
    return TorchScriptGo2Critic(
        experts_dir(directory) / "critics" / f"critic_{EXPERT_ITERATION}.pt", device
    )


def expert_ladder(task: Task) -> list[Policy]:
    """policy_4999 (the expert) then its PPO checkpoints, best to worst (every Go2 task)."""
    return list(load_go2_ladder())


def expert_value(task: Task):
    """V^e: the official critic on obs.privileged['expert_obs'] (every Go2 task)."""
    return load_go2_critic()
