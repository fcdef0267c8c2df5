"""MuJoCo UR5e + Robotiq 2F-85: scene composition, servoL-like controller, backend."""
from robot_drivers.ur5e.backend import PROPRIO_TERMS, MujocoUR5eBackend, SceneObjects, make_spec
from robot_drivers.ur5e.config import (
    CAMERA_NAMES, HOME_QPOS, Appearance, CameraPose, ControllerConfig, SceneConfig)

__all__ = ["Appearance", "CAMERA_NAMES", "CameraPose", "ControllerConfig", "HOME_QPOS",
           "MujocoUR5eBackend", "PROPRIO_TERMS", "SceneConfig", "SceneObjects", "make_spec"]
