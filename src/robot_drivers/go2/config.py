"""Go2 constants and typed configuration: actuation, joint order, default pose, height scan.

The numbers follow the official SimDist Go2 task (IsaacLab, `simdist/rl/go2.py`) so that the
released expert sees the same robot in MuJoCo that it was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Unitree / official policy order: FR, FL, RR, RL x (hip, thigh, calf).
UNITREE_LEGS = ("FR", "FL", "RR", "RL")
# Menagerie MJCF order (qpos, qvel and actuators): FL, FR, RL, RR x (hip, thigh, calf).
MENAGERIE_LEGS = ("FL", "FR", "RL", "RR")
JOINT_KINDS = ("hip", "thigh", "calf")

UNITREE_JOINT_NAMES = tuple(f"{leg}_{kind}_joint" for leg in UNITREE_LEGS for kind in JOINT_KINDS)
MENAGERIE_JOINT_NAMES = tuple(
    f"{leg}_{kind}_joint" for leg in MENAGERIE_LEGS for kind in JOINT_KINDS
)
# UNITREE_FROM_MENAGERIE[i] = menagerie index of Unitree joint i (and vice versa: the map swaps
# legs pairwise, so it is its own inverse; both names are kept for readable call sites).
UNITREE_FROM_MENAGERIE = np.array(
    [MENAGERIE_JOINT_NAMES.index(n) for n in UNITREE_JOINT_NAMES], dtype=np.int64
)
MENAGERIE_FROM_UNITREE = np.array(
    [UNITREE_JOINT_NAMES.index(n) for n in MENAGERIE_JOINT_NAMES], dtype=np.int64
)
FOOT_GEOMS_UNITREE = UNITREE_LEGS  # menagerie names each foot sphere geom after its leg


def to_unitree(x_menagerie: np.ndarray) -> np.ndarray:
    """Reorder a (..., 12) array from menagerie joint order to Unitree order."""
    return np.asarray(x_menagerie)[..., UNITREE_FROM_MENAGERIE]


def to_menagerie(x_unitree: np.ndarray) -> np.ndarray:
    """Reorder a (..., 12) array from Unitree joint order to menagerie order."""
    return np.asarray(x_unitree)[..., MENAGERIE_FROM_UNITREE]


def _default_pose_unitree() -> np.ndarray:
    """IsaacLab default stance: hips left +0.1 / right -0.1, thighs 0.8 front / 1.0 rear,
    calves -1.5."""
    pose = []
    for leg in UNITREE_LEGS:
        hip = 0.1 if leg.endswith("L") else -0.1
        thigh = 0.8 if leg.startswith("F") else 1.0
        pose += [hip, thigh, -1.5]
    return np.array(pose, dtype=np.float64)


DEFAULT_POSE_UNITREE = _default_pose_unitree()
# Joint ranges (rad, low / high) of the menagerie go2.xml, Unitree order: hip (abduction), thigh
# (the rear thighs reach further back than the front ones), calf. Static, so that the hardware and
# planner nodes need no model (tests/test_go2_sim.py checks them against the MJCF); the RobotSpec
# carries them (joint_low / joint_high) to the safety supervisor.
_HIP, _CALF = (-1.0472, 1.0472), (-2.7227, -0.83776)
_THIGH = {"F": (-1.5708, 3.4907), "R": (-0.5236, 4.5379)}
JOINT_RANGE_UNITREE = np.array(
    [joint for leg in UNITREE_LEGS for joint in (_HIP, _THIGH[leg[0]], _CALF)], dtype=np.float64
)


@dataclass(frozen=True)
class ActuationConfig:
    """IsaacLab DC-motor model, applied every physics step (menagerie motors are torque-only)."""

    kp: float = 25.0
    kd: float = 0.5
    torque_limit: float = 23.5  # Nm, all joints (effort and saturation limit)
    velocity_limit: float = 30.0  # rad/s, end of the torque-speed line
    action_scale: float = 0.25  # target = default + action_scale * action
    damp_kd: float = 0.5  # DAMP mode: zero stiffness, this damping

    def __post_init__(self) -> None:
        for name in ("kp", "kd", "torque_limit", "velocity_limit", "action_scale", "damp_kd"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"ActuationConfig.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class HeightScanConfig:
    """Yaw-aligned grid of vertical rays: 2.0 x 1.4 m at 0.1 m, centred 0.5 m ahead of the base."""

    size_x: float = 2.0
    size_y: float = 1.4
    resolution: float = 0.1
    offset_x: float = 0.5
    ray_start: float = 20.0  # rays start this far above the base, like IsaacLab's ray caster

    @property
    def nx(self) -> int:
        return int(round(self.size_x / self.resolution)) + 1

    @property
    def ny(self) -> int:
        return int(round(self.size_y / self.resolution)) + 1

    def grid_xy(self) -> np.ndarray:
        """(ny * nx, 2) base-frame points, x varying fastest (official flattening)."""
        xs = np.linspace(-self.size_x / 2, self.size_x / 2, self.nx) + self.offset_x
        ys = np.linspace(-self.size_y / 2, self.size_y / 2, self.ny)
        gx, gy = np.meshgrid(xs, ys, indexing="xy")  # (ny, nx)
        return np.stack([gx.ravel(), gy.ravel()], axis=1)


@dataclass(frozen=True)
class Go2Config:
    """Everything the MuJoCo Go2 backend needs besides the terrain."""

    physics_dt: float = 0.005
    decimation: int = 4  # control at 1 / (0.005 * 4) = 50 Hz
    actuation: ActuationConfig = ActuationConfig()
    scan: HeightScanConfig = HeightScanConfig()
    gait_period: float = 0.5  # s, cos/sin phase clock
    foot_solimp_default: bool = True  # MuJoCo default solimp on feet (menagerie's lets them sink)
    init_joint_scale: tuple[float, float] = (0.95, 1.05)  # reset: default pose times U(lo, hi)
    init_yaw_range: float = 0.0  # reset: base yaw ~ U(-r, r) rad
    fall_tilt: float = 1.0472  # rad, official bad-orientation termination

    def __post_init__(self) -> None:
        if self.physics_dt <= 0 or self.decimation < 1:
            raise ValueError(
                f"Go2Config needs physics_dt > 0 and decimation >= 1, got "
                f"{self.physics_dt}, {self.decimation}"
            )
        lo, hi = self.init_joint_scale
        if not 0 < lo <= hi:
            raise ValueError(
                f"init_joint_scale must satisfy 0 < lo <= hi, got {self.init_joint_scale}"
            )

    @property
    def control_dt(self) -> float:
        return self.physics_dt * self.decimation
