"""The RobotSpec of each robot with its default backend settings: one lookup for every node."""

from __future__ import annotations

from robot_drivers.go2.backend import go2_spec
from robot_drivers.go2.config import Go2Config
from robot_drivers.interface import RobotSpec
from robot_drivers.ur5e.backend import make_spec
from robot_drivers.ur5e.config import ControllerConfig, SceneConfig

# robot -> its RobotSpec with the default backend settings
ROBOT_SPECS = {
    "ur5e": lambda: make_spec(SceneConfig(), ControllerConfig()),
    "go2": lambda: go2_spec(Go2Config()),
}


def robot_spec(robot: str) -> RobotSpec:
    """Action bounds, control rate and observation layout of `robot` (a key of ROBOT_SPECS)."""
    if robot not in ROBOT_SPECS:
        raise ValueError(f"unknown robot {robot!r}; expected one of {sorted(ROBOT_SPECS)}")
    return ROBOT_SPECS[robot]()
