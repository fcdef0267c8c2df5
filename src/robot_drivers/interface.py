"""The one robot interface every backend implements.

Backends: MuJoCo sim, MuJoCo "real", ur_rtde and unitree_sdk2py.

The ROS driver nodes, the dataset generator and the closed-loop evaluation talk to robots only
through this module, so a hardware backend and its MuJoCo stand-in are interchangeable.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field

import numpy as np


class CommandKind(enum.Enum):
    """What a command's values mean. HOLD and DAMP are the explicit safe actions."""

    EE_DELTA = "ee_delta"  # UR5e: world-frame [dx, dy, dz, rx, ry, rz] + gripper (>0.5 closes)
    JOINT_POSITION = "joint_position"  # Go2: raw policy action a; target = default + scale * a
    HOLD = "hold"  # keep the current pose (arm) / stand (quadruped)
    DAMP = "damp"  # zero stiffness, damping only (quadruped fault mode); arm treats it as stop


@dataclass(frozen=True)
class ProprioTerm:
    name: str
    dim: int


@dataclass(frozen=True)
class RobotSpec:
    """Static facts about a robot that nodes and models size themselves from: the one description
    of a robot that the stack outside its own package (safety supervisor, viewer, planner, data)
    reads instead of branching on its name."""

    name: str  # "ur5e" | "go2"
    action_dim: int
    control_rate_hz: float
    proprio_terms: tuple[ProprioTerm, ...]
    cameras: tuple[str, ...] = ()
    image_shape: tuple[int, int] = (0, 0)  # (height, width) of every camera
    height_map_shape: tuple[int, int] | None = None
    command_dim: int = 0  # Go2 velocity command (vx, vy, wz)
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()  # EE_DELTA: the per-step caps (the chunk view's scale)
    joint_names: tuple[str, ...] = ()
    command_kind: CommandKind = CommandKind.JOINT_POSITION  # what its actions are commanded as
    # JOINT_POSITION: joint target = default_pose + action_scale * action (joint_names order)
    default_pose: tuple[float, ...] = ()
    action_scale: float = 1.0
    joint_low: tuple[float, ...] = ()  # JOINT_POSITION: the joint ranges (rad, joint_names order)
    joint_high: tuple[float, ...] = ()
    # True: DAMP is a mode of its own (zero stiffness, a quadruped: it lies down, the episode
    # ends); False: DAMP stops the robot as HOLD does (an arm)
    damping_mode: bool = False
    # "module:function" returning the robot's mujoco.MjSpec as the simulator builds it, without
    # cameras, task objects or render-only mesh detail (the viewer's 3-D robot); "": none
    bare_scene: str = ""

    @property
    def proprio_dim(self) -> int:
        return sum(t.dim for t in self.proprio_terms)


@dataclass
class Observation:
    """One stamped snapshot of everything a robot senses.

    `privileged` exists only in simulation (rewards, experts, labels); planners never read it.
    """

    stamp: float  # seconds, sim time or wall clock
    proprio: np.ndarray  # (spec.proprio_dim,) float32, terms in spec.proprio_terms order
    images: dict[str, np.ndarray] = field(default_factory=dict)  # camera -> (H, W, 3) uint8 RGB
    height_map: np.ndarray | None = None  # spec.height_map_shape float32
    command: np.ndarray | None = None  # (spec.command_dim,) float32
    joint_pos: np.ndarray | None = None  # measured joint positions (rad), spec.joint_names order
    joint_vel: np.ndarray | None = None
    privileged: dict[str, np.ndarray] | None = None

    def require_privileged(self) -> dict[str, np.ndarray]:
        """`privileged` for the simulation-only readers (rewards, experts, labels); ValueError
        where the observation has none (hardware)."""
        if self.privileged is None:
            raise ValueError("this observation has no privileged state (simulation only)")
        return self.privileged


@dataclass
class Command:
    kind: CommandKind
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    stamp: float = 0.0


class FaultLevel(enum.IntEnum):
    WARN = 1
    ERROR = 2  # the robot must not be commanded until cleared (protective stop, lost link)


@dataclass(frozen=True)
class Fault:
    level: FaultLevel
    code: str  # short machine-readable id, e.g. "protective_stop", "disconnected"
    message: str  # what happened and what to do about it


class RobotBackend(abc.ABC):
    """A robot: reset, observe, command, report faults. MuJoCo backends add `step` for lockstep."""

    spec: RobotSpec

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> Observation:
        """Bring the robot to its start state (sim) or confirm it is ready (hardware)."""

    @abc.abstractmethod
    def observe(self) -> Observation: ...

    @abc.abstractmethod
    def act(self, command: Command) -> None:
        """Apply a command; validated values only (the safety supervisor checks upstream too)."""

    @abc.abstractmethod
    def faults(self) -> list[Fault]: ...

    def step(self) -> Observation:
        """Advance one control period (simulation only; hardware runs in real time)."""
        raise NotImplementedError(f"{type(self).__name__} runs in real time and cannot be stepped")

    def close(self) -> None:
        """Release connections; hardware backends leave the robot in its safe state."""


def term_slices(terms) -> dict[str, slice]:
    """(name, size) terms laid end to end -> name: its columns in the flat vector."""
    out, start = {}, 0
    for name, size in terms:
        out[name] = slice(start, start + size)
        start += size
    return out


def validate_command(spec: RobotSpec, command: Command) -> None:
    """Raise ValueError for a command a backend must never execute (wrong size, NaN/Inf)."""
    if command.kind in (CommandKind.HOLD, CommandKind.DAMP):
        return
    values = np.asarray(command.values)
    if values.shape != (spec.action_dim,):
        raise ValueError(
            f"{spec.name}: command has shape {values.shape}, expected ({spec.action_dim},)"
        )
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{spec.name}: command contains NaN or Inf: {values.tolist()}")
