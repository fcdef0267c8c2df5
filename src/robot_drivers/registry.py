"""Task registry: one entry per task, the single place that says which robot a task runs on,
which experts, launch graph and pretraining preset go with it, and how its variants ("sim" for
training, "real" for the hardware stand-in) are built.

The registry sits above both tasks and experts: an expert module may import its task, a task
never imports an expert. Factories and expert modules are "module:function" / module strings,
imported on first use, so a UR5e user never loads the Go2 stack, and a spawned worker process
can register the same entry again. Everything outside `robot_drivers` that needs a task's robot
asks here (`robot_of`, `tasks_of`, `task_spec`), never a table of its own.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from robot_drivers.interface import RobotSpec
from robot_drivers.tasks.base import Policy, Task

UR5E_TASK_MODULE = "robot_drivers.tasks.ur5e_tasks"
GO2_TASK_MODULE = "robot_drivers.tasks.go2_tasks"


@dataclass(frozen=True)
class TaskEntry:
    """Everything the stack knows about one task by name."""

    robot: str  # the robot it runs on (robot_drivers.specs.robot_spec), e.g. "ur5e"
    factory: str  # "module:function" taking (name, variant, **overrides), returning a Task
    experts: str = ""  # module with expert_ladder(task), expert_value(task); "": the factory's
    graph: str = ""  # the launch graph (config/<graph>.yaml) that runs it; "": none
    # The pretraining preset its models start from (simdist_planner.training.config
    # PRETRAIN_PRESETS); "": none (a hardware stand-in is never trained on).
    pretrain_preset: str = ""
    # The summary figure tables judge it by (a simdist_planner AgentSummary field).
    headline: str = "success_rate"

    @property
    def module(self) -> str:
        """The task module (its factory's), which also names its episode options."""
        return self.factory.split(":")[0]

    @property
    def spec(self) -> RobotSpec:
        """The RobotSpec of its robot with the default backend settings (robot_drivers.specs,
        imported on first use: it loads every robot's backend)."""
        return importlib.import_module("robot_drivers.specs").robot_spec(self.robot)


TASKS: dict[str, TaskEntry] = {
    "peg": TaskEntry(
        "ur5e",
        f"{UR5E_TASK_MODULE}:make_ur5e_task",
        experts="robot_drivers.experts.ur5e",
        graph="peg",
        pretrain_preset="ur5e_peg",
    ),
    "table_leg": TaskEntry(
        "ur5e",
        f"{UR5E_TASK_MODULE}:make_ur5e_task",
        experts="robot_drivers.experts.ur5e",
        graph="table_leg",
        pretrain_preset="ur5e_peg",
    ),
    "go2_flat": TaskEntry(
        "go2",
        f"{GO2_TASK_MODULE}:make_go2_task",
        experts="robot_drivers.experts.go2",
        graph="go2_flat",
        pretrain_preset="go2",
        headline="mean_return",
    ),
    "go2_slope": TaskEntry(
        "go2",
        f"{GO2_TASK_MODULE}:make_go2_task",
        experts="robot_drivers.experts.go2",
        graph="go2_slope",
        pretrain_preset="go2",
        headline="mean_return",
    ),
    "slippery_slope": TaskEntry(
        "go2",
        f"{GO2_TASK_MODULE}:make_go2_task",
        experts="robot_drivers.experts.go2",
        graph="go2_slope",
        headline="mean_return",
    ),
    "foam": TaskEntry(
        "go2",
        f"{GO2_TASK_MODULE}:make_go2_task",
        experts="robot_drivers.experts.go2",
        graph="go2_foam",
        headline="mean_return",
    ),
}


def entry(name: str) -> TaskEntry:
    """The registry entry of a task.

    Args:
        name: a task name (a key of TASKS).

    Returns:
        Its TaskEntry; ValueError listing the known tasks for an unknown name.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    return TASKS[name]


def robot_of(name: str) -> str:
    """The robot a task runs on.

    Args:
        name: a task name.

    Returns:
        The robot's name (a key of robot_drivers.specs.ROBOT_SPECS).
    """
    return entry(name).robot


def tasks_of(robot: str) -> tuple[str, ...]:
    """The tasks of a robot.

    Args:
        robot: a robot name.

    Returns:
        Its registered task names, in registry order (() for a robot with none).
    """
    return tuple(name for name, e in TASKS.items() if e.robot == robot)


def task_spec(name: str) -> RobotSpec:
    """The spec of a task's robot.

    Args:
        name: a task name.

    Returns:
        The RobotSpec of the robot it runs on, with the default backend settings.
    """
    return entry(name).spec


def _factory(name: str):
    module, attr = entry(name).factory.split(":")
    return getattr(importlib.import_module(module), attr)


def make_task(name: str, variant: str = "sim", **overrides) -> Task:
    """Build a task.

    Args:
        name: a task name.
        variant: "sim" (the training world) or "real" (its real-world stand-in).
        **overrides: the task factory's settings (e.g. from `episode_overrides`).

    Returns:
        The task, ready for `reset(seed)`; ValueError for a bad name or variant.
    """
    if variant not in ("sim", "real"):
        raise ValueError(f"variant must be 'sim' or 'real', got {variant!r}")
    return _factory(name)(name, variant, **overrides)


def task_options(name: str) -> tuple[str, ...]:
    """The episode options a task takes.

    Args:
        name: a task name.

    Returns:
        The `episode_overrides` keywords its task module accepts; () for none.
    """
    module = importlib.import_module(entry(name).module)
    return tuple(getattr(module, "EPISODE_OPTIONS", ()))


def episode_overrides(name: str, **options) -> dict:
    """`make_task` overrides from the stack's episode options. The task module turns them into
    its own overrides (e.g. the Go2's episode length in seconds).

    Args:
        name: a task name.
        **options: `max_steps`, `region`, `image_size`, `cameras`, `speed`, `panel_friction`;
            None: not set.

    Returns:
        The overrides for `make_task(name, ...)`; ValueError for an option set for a task that
        lacks it.
    """
    given = {k: v for k, v in options.items() if v is not None}
    known = task_options(name)
    foreign = [k for k in given if k not in known]
    if foreign:
        raise ValueError(
            f"{', '.join(foreign)}: not an option of task {name!r}; its options: {list(known)}"
        )
    if not given:
        return {}
    module = importlib.import_module(entry(name).module)
    return module.episode_overrides(name, **given)


def _experts(task: Task):
    e = entry(task.name)
    return importlib.import_module(e.experts or e.module)


def expert_ladder(task: Task) -> list[Policy]:
    """A task's experts.

    Args:
        task: a task built by `make_task`.

    Returns:
        The expert first, then its sub-optimal checkpoints (best to worst), as Policies.
    """
    return _experts(task).expert_ladder(task)


def expert_value(task: Task):
    """A task's expert value function.

    Args:
        task: a task built by `make_task`.

    Returns:
        V^e as a callable Observation -> float (it may read privileged inputs).
    """
    return _experts(task).expert_value(task)


def step_phases(name: str, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The named phases of a logged episode.

    Args:
        name: a task name.
        rows: one episode's stored rows (actions, task state, ...) by key.

    Returns:
        Phase name -> a boolean mask over the rows; {} for a task that names none.
    """
    module = importlib.import_module(entry(name).module)
    phases = getattr(module, "step_phases", None)
    return phases(rows) if phases else {}


__all__ = [
    "TASKS",
    "TaskEntry",
    "entry",
    "episode_overrides",
    "expert_ladder",
    "expert_value",
    "make_task",
    "robot_of",
    "step_phases",
    "task_options",
    "task_spec",
    "tasks_of",
]
