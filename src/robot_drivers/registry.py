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
from robot_drivers.tasks.options import Go2Options, Option, TaskOptions, Ur5eOptions

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
    # Its episode options (robot_drivers.tasks.options): what make_task takes besides the
    # factory's own settings, validated there; the driver, launcher and commands read them.
    options: type[TaskOptions] = TaskOptions

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
        options=Ur5eOptions,
    ),
    "table_leg": TaskEntry(
        "ur5e",
        f"{UR5E_TASK_MODULE}:make_ur5e_task",
        experts="robot_drivers.experts.ur5e",
        graph="table_leg",
        pretrain_preset="ur5e_peg",
        options=Ur5eOptions,
    ),
    "go2_flat": TaskEntry(
        "go2",
        f"{GO2_TASK_MODULE}:make_go2_task",
        experts="robot_drivers.experts.go2",
        graph="go2_flat",
        pretrain_preset="go2",
        headline="mean_return",
        options=Go2Options,
    ),
    "go2_slope": TaskEntry(
        "go2",
        f"{GO2_TASK_MODULE}:make_go2_task",
        experts="robot_drivers.experts.go2",
        graph="go2_slope",
        pretrain_preset="go2",
        headline="mean_return",
        options=Go2Options,
    ),
    "slippery_slope": TaskEntry(
        "go2",
        f"{GO2_TASK_MODULE}:make_go2_task",
        experts="robot_drivers.experts.go2",
        graph="go2_slope",
        headline="mean_return",
        options=Go2Options,
    ),
    "foam": TaskEntry(
        "go2",
        f"{GO2_TASK_MODULE}:make_go2_task",
        experts="robot_drivers.experts.go2",
        graph="go2_foam",
        headline="mean_return",
        options=Go2Options,
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


def task_list() -> str:
    """The registered tasks by robot, in words (help strings and parameter descriptions).

    Returns:
        E.g. "peg | table_leg (ur5e); go2_flat | ... (go2)", in registry order.
    """
    robots = dict.fromkeys(e.robot for e in TASKS.values())
    return "; ".join(f"{' | '.join(tasks_of(r))} ({r})" for r in robots)


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


def make_task(name: str, variant: str = "sim", **settings) -> Task:
    """Build a task.

    Args:
        name: a task name.
        variant: "sim" (the training world) or "real" (its real-world stand-in).
        **settings: its episode options (the entry's `options`, e.g. from `episode_overrides`)
            and the task factory's own settings (e.g. a Go2 task's `command`).

    Returns:
        The task, ready for `reset(seed)`; ValueError for a bad name, variant or option (the
        options' message, robot_drivers.tasks.options).
    """
    if variant not in ("sim", "real"):
        raise ValueError(f"variant must be 'sim' or 'real', got {variant!r}")
    options_type = entry(name).options
    given = {k: settings.pop(k) for k in options_type.names() if k in settings}
    options = options_type.of(name, variant, **given)
    return _factory(name)(name, variant, options, **settings)


def task_options(name: str) -> tuple[str, ...]:
    """The episode options a task takes.

    Args:
        name: a task name.

    Returns:
        The names of its entry's options (robot_drivers.tasks.options), in field order.
    """
    return entry(name).options.names()


def episode_overrides(name: str, **options) -> dict:
    """`make_task` keywords from the stack's episode options, validated.

    Args:
        name: a task name.
        **options: option values (`max_steps`, `region`, `speed`, `panel_friction`, ...);
            None: not set.

    Returns:
        The options set, by name; ValueError for an option the task lacks or a bad value (the
        variant's check comes with `make_task`).
    """
    return entry(name).options.of(name, **options).given()


def robot_options(robot: str) -> type[TaskOptions]:
    """The options class of a robot's tasks.

    Args:
        robot: a robot name with registered tasks.

    Returns:
        The TaskOptions subclass its tasks share; ValueError when they do not share one.
    """
    kinds = {TASKS[t].options for t in tasks_of(robot)}
    if len(kinds) != 1:
        raise ValueError(f"robot {robot!r}: its tasks must share one options class, got {kinds}")
    return kinds.pop()


def all_options() -> tuple[Option, ...]:
    """Every registered task option, once by name (an option every family inherits, such as
    `max_steps`, is described once), in registry order: the MuJoCo driver's parameters and the
    commands' flags.

    Returns:
        The Option descriptions.
    """
    seen: dict[str, Option] = {}
    for e in TASKS.values():
        for o in e.options.described():
            seen.setdefault(o.name, o)
    return tuple(seen.values())


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
    "all_options",
    "entry",
    "episode_overrides",
    "expert_ladder",
    "expert_value",
    "make_task",
    "robot_of",
    "robot_options",
    "step_phases",
    "task_options",
    "task_list",
    "task_spec",
    "tasks_of",
]
