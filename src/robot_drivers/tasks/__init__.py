"""Simulated tasks: a robot backend plus reward, success and resets.

`robot_drivers.registry` names them and pairs each with its expert.
"""

from robot_drivers.tasks.base import Policy, StepResult, Task

__all__ = ["Policy", "StepResult", "Task"]
