"""What every simulated task offers the dataset generator, the evaluation and the driver nodes."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from robot_drivers.interface import Observation, RobotBackend, RobotSpec


@dataclass
class StepResult:
    obs: Observation
    reward: float  # dense privileged reward of the transition just taken
    terminated: bool  # success or failure ended the episode
    truncated: bool  # time limit
    success: bool
    info: dict = field(default_factory=dict)


class Policy(Protocol):
    """An expert, a sub-optimal checkpoint or a learned policy; experts may read obs.privileged."""

    def reset(self, seed: int | None = None) -> None: ...

    def act(self, obs: Observation) -> np.ndarray: ...


class Task(abc.ABC):
    """A MuJoCo backend plus privileged reward, success test and episode limits."""

    name: str
    variant: str  # "sim" or "real"
    backend: RobotBackend
    max_steps: int

    # Named terms (name, dim) of the privileged task state the dataset stores for the world
    # model's auxiliary state loss (docs/world_model.md); () = the task defines none.
    state_terms: tuple[tuple[str, int], ...] = ()

    @property
    def spec(self) -> RobotSpec:
        return self.backend.spec

    @property
    def damping_mode(self) -> bool:
        """True where DAMP is a mode of its own that ends the episode (zero stiffness: a
        quadruped); False where the robot treats DAMP as HOLD (an arm stops). Its spec says."""
        return self.spec.damping_mode

    def privileged_state(self, obs: Observation) -> np.ndarray:
        """The task state of `obs` as a float32 vector laid out by `state_terms`."""
        raise NotImplementedError(f"{self.name} defines no privileged task state")

    def hold_action(self, obs: Observation) -> np.ndarray:
        """The action that keeps the robot where `obs` has it: what HOLD means in simulation."""
        raise NotImplementedError(f"{self.name} defines no hold action")

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> Observation: ...

    @abc.abstractmethod
    def step(self, action: np.ndarray) -> StepResult: ...

    def close(self) -> None:
        self.backend.close()
