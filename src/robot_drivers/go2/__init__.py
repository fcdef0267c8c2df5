"""Unitree Go2 in MuJoCo: scene, PD actuation, sensing and the official expert observation."""

from robot_drivers.go2.backend import MujocoGo2Backend, go2_spec, pd_torque
from robot_drivers.go2.config import (
    DEFAULT_POSE_UNITREE,
    UNITREE_JOINT_NAMES,
    ActuationConfig,
    Go2Config,
    HeightScanConfig,
    to_menagerie,
    to_unitree,
)
from robot_drivers.go2.observation import (
    EXPERT_OBS_DIM,
    EXPERT_OBS_SLICES,
    EXPERT_OBS_TERMS,
    PROPRIO_DIM,
    Go2State,
    build_expert_observation,
    build_proprio,
)
from robot_drivers.go2.scene import SlopePanel, TerrainConfig, build_go2_model

__all__ = [
    "ActuationConfig",
    "DEFAULT_POSE_UNITREE",
    "EXPERT_OBS_DIM",
    "EXPERT_OBS_SLICES",
    "EXPERT_OBS_TERMS",
    "Go2Config",
    "Go2State",
    "HeightScanConfig",
    "MujocoGo2Backend",
    "PROPRIO_DIM",
    "SlopePanel",
    "TerrainConfig",
    "UNITREE_JOINT_NAMES",
    "build_expert_observation",
    "build_go2_model",
    "build_proprio",
    "go2_spec",
    "pd_torque",
    "to_menagerie",
    "to_unitree",
]
