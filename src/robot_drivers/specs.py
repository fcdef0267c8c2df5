"""The RobotSpec of each robot with its default backend settings: one lookup for every node."""

from __future__ import annotations

from robot_drivers.go2.backend import go2_spec
from robot_drivers.go2.config import Go2Config
from robot_drivers.interface import RobotSpec
from robot_drivers.ur5e.backend import make_spec
from robot_drivers.ur5e.config import ControllerConfig, SceneConfig


def robot_spec(robot: str) -> RobotSpec:
    """Action bounds, control rate and observation layout of `robot` ("ur5e" | "go2")."""
    if robot == "ur5e":
        return make_spec(SceneConfig(), ControllerConfig())
    if robot == "go2":
        return go2_spec(Go2Config())
    raise ValueError(f"unknown robot {robot!r}; expected 'ur5e' or 'go2'")
