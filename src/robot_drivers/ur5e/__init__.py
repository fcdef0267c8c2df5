"""MuJoCo UR5e + Robotiq 2F-85: scene composition, servoL-like controller, backend.

Rendering is headless: MUJOCO_GL defaults to `egl` here (set it to `osmesa` before the first
`import mujoco` to use OSMesa instead).
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])

from robot_drivers.ur5e.backend import PROPRIO_TERMS, MujocoUR5eBackend, SceneObjects, make_spec  # noqa: E402
from robot_drivers.ur5e.config import (  # noqa: E402
    CAMERA_NAMES,
    HOME_QPOS,
    Appearance,
    CameraPose,
    ControllerConfig,
    SceneConfig,
)

__all__ = [
    "Appearance",
    "CAMERA_NAMES",
    "CameraPose",
    "ControllerConfig",
    "HOME_QPOS",
    "MujocoUR5eBackend",
    "PROPRIO_TERMS",
    "SceneConfig",
    "SceneObjects",
    "make_spec",
]
