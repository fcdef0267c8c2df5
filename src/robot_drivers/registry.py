"""Task registry: one name per task, variants "sim" (training) and "real" (hardware stand-in), and
the privileged experts that go with each task.

The registry sits above both tasks and experts: an expert module may import its task, a task
never imports an expert. Entries are "module:factory" strings, imported on first use, so a UR5e
user never loads the Go2 stack, and a spawned worker process can register the same entry again.
"""

from __future__ import annotations

import importlib

import numpy as np

from robot_drivers.tasks.base import Policy, Task

# name -> "module:factory"; each factory takes (name, variant, **overrides) and returns a Task.
TASKS: dict[str, str] = {
    "peg": "robot_drivers.tasks.ur5e_tasks:make_ur5e_task",
    "table_leg": "robot_drivers.tasks.ur5e_tasks:make_ur5e_task",
    "go2_flat": "robot_drivers.tasks.go2_tasks:make_go2_task",
    "go2_slope": "robot_drivers.tasks.go2_tasks:make_go2_task",
    "slippery_slope": "robot_drivers.tasks.go2_tasks:make_go2_task",
    "foam": "robot_drivers.tasks.go2_tasks:make_go2_task",
}


def _factory(name: str):
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    module, attr = TASKS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def make_task(name: str, variant: str = "sim", **overrides) -> Task:
    if variant not in ("sim", "real"):
        raise ValueError(f"variant must be 'sim' or 'real', got {variant!r}")
    return _factory(name)(name, variant, **overrides)


# task module -> the module of its experts (expert_ladder(task), expert_value(task)); a task module
# missing here provides both itself (the test suite's toy task).
EXPERTS: dict[str, str] = {
    "robot_drivers.tasks.ur5e_tasks": "robot_drivers.experts.ur5e",
    "robot_drivers.tasks.go2_tasks": "robot_drivers.experts.go2",
}


def _experts(task: Task):
    module = TASKS[task.name].split(":")[0]
    return importlib.import_module(EXPERTS.get(module, module))


def expert_ladder(task: Task) -> list[Policy]:
    """The expert first, then its sub-optimal checkpoints (best to worst)."""
    return _experts(task).expert_ladder(task)


def expert_value(task: Task):
    """V^e as a callable Observation -> float (privileged inputs allowed)."""
    return _experts(task).expert_value(task)


def step_phases(name: str, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The named phases of task `name` in one logged episode's rows ({} when it names none)."""
    _factory(name)  # an unknown task name fails here, with the list of known ones
    module = importlib.import_module(TASKS[name].split(":")[0])
    phases = getattr(module, "step_phases", None)
    return phases(rows) if phases else {}


__all__ = ["EXPERTS", "TASKS", "make_task", "expert_ladder", "expert_value", "step_phases"]
