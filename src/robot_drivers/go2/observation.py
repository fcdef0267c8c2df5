"""The official SimDist Go2 expert observation (433 inputs) and the planner's proprio vector.

Pure functions of a small `Go2State` (no MjData), so the MuJoCo backend and the unitree_sdk2py
hardware backend build bit-identical inputs. Term order and scales follow the official
`simdist/rl/go2.py` policy group (see ../shared/simdist_go2_experts/OBSERVATION.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from robot_drivers.go2.config import DEFAULT_POSE_UNITREE
from robot_drivers.interface import term_slices

# (name, dim) in the order the policy and critic read them.
EXPERT_OBS_TERMS: tuple[tuple[str, int], ...] = (
    ("base_lin_vel", 3),
    ("base_ang_vel", 3),
    ("projected_gravity", 3),
    ("velocity_commands", 3),
    ("joint_pos_rel", 12),
    ("joint_vel_rel", 12),
    ("actions", 12),
    ("height_scan", 315),
    ("cos_sin_phase", 2),
    ("feet_body_forces", 24),
    ("feet_height", 4),
    ("base_mass", 1),
    ("material_properties", 3),
    ("joint_stiffness", 12),
    ("joint_damping", 12),
    ("joint_friction", 12),
)


EXPERT_OBS_SLICES: dict[str, slice] = term_slices(EXPERT_OBS_TERMS)
EXPERT_OBS_DIM = sum(d for _, d in EXPERT_OBS_TERMS)  # 433

# The planner's proprioception (system_go2.yaml proprio_obs), in this order.
PROPRIO_TERMS: tuple[tuple[str, int], ...] = (
    ("base_lin_vel", 3),
    ("base_ang_vel", 3),
    ("projected_gravity", 3),
    ("joint_pos", 12),  # relative to the default pose, Unitree order
    ("joint_vel", 12),
    ("cos_sin_phase", 2),
)
PROPRIO_DIM = sum(d for _, d in PROPRIO_TERMS)  # 35
PROPRIO_SLICES: dict[str, slice] = term_slices(PROPRIO_TERMS)

# Official privileged-term scalings (go2.py): stiffness / damping as deviation from nominal over a
# 10 % band, friction over [0, 0.05] mapped to [-1, 1], foot wrench x 0.1.
NOMINAL_KP, NOMINAL_KD, GAIN_BAND, MAX_JOINT_FRICTION = 25.0, 0.5, 0.1, 0.05
FOOT_FORCE_SCALE = 0.1
HEIGHT_SCAN_OFFSET, HEIGHT_SCAN_CLIP = 0.3, 1.0
FOOT_RADIUS, FEET_HEIGHT_CLIP = 0.023, 2.0
NOMINAL_MATERIAL = (0.8, 0.6, 0.05)  # static friction, dynamic friction, restitution


@dataclass
class Go2State:
    """What the expert needs, in physical units; joint arrays in Unitree order (FR, FL, RR, RL)."""

    base_lin_vel: np.ndarray  # (3,) m/s, base frame
    base_ang_vel: np.ndarray  # (3,) rad/s, base frame
    projected_gravity: np.ndarray  # (3,) R_base^T (0, 0, -1)
    command: np.ndarray  # (3,) vx, vy (m/s), wz (rad/s)
    joint_pos: np.ndarray  # (12,) rad, absolute
    joint_vel: np.ndarray  # (12,) rad/s
    last_action: np.ndarray  # (12,) the last raw policy output (before the 0.25 scale)
    scan_heights: np.ndarray  # (315,) base_z - hit_z (m), x varying fastest
    step: int  # control steps since reset (0 on the first observation)
    foot_wrench: np.ndarray = field(
        default_factory=lambda: np.zeros((4, 6))
    )  # joint wrench on feet
    foot_clearance: np.ndarray = field(default_factory=lambda: np.zeros(4))  # foot z - ground z (m)
    base_mass_delta: float = 0.0  # kg over the nominal mass
    material: tuple[float, float, float] = NOMINAL_MATERIAL
    kp: np.ndarray = field(default_factory=lambda: np.full(12, NOMINAL_KP))
    kd: np.ndarray = field(default_factory=lambda: np.full(12, NOMINAL_KD))
    joint_friction: np.ndarray = field(default_factory=lambda: np.zeros(12))
    default_pose: np.ndarray = field(default_factory=lambda: DEFAULT_POSE_UNITREE.copy())
    control_dt: float = 0.02
    gait_period: float = 0.5

    def validate(self) -> None:
        """Raise ValueError naming the first field with a wrong shape or a non-finite value."""
        shapes = {
            "base_lin_vel": (3,),
            "base_ang_vel": (3,),
            "projected_gravity": (3,),
            "command": (3,),
            "joint_pos": (12,),
            "joint_vel": (12,),
            "last_action": (12,),
            "scan_heights": (315,),
            "foot_wrench": (4, 6),
            "foot_clearance": (4,),
            "kp": (12,),
            "kd": (12,),
            "joint_friction": (12,),
            "default_pose": (12,),
        }
        for name, shape in shapes.items():
            value = np.asarray(getattr(self, name), dtype=np.float64)
            if value.shape != shape:
                raise ValueError(f"Go2State.{name} has shape {value.shape}, expected {shape}")
            if name != "scan_heights" and not np.all(np.isfinite(value)):
                raise ValueError(f"Go2State.{name} contains NaN or Inf: {value.tolist()}")


def cos_sin_phase(step: int, control_dt: float, period: float) -> np.ndarray:
    phi = step * control_dt * 2.0 * np.pi / period
    return np.array([np.cos(phi), np.sin(phi)])


def height_scan_term(scan_heights: np.ndarray) -> np.ndarray:
    """base_z - hit_z - 0.3, clipped to [-1, 1]; a ray that hit nothing (NaN/inf) reads as +1."""
    h = np.asarray(scan_heights, dtype=np.float64) - HEIGHT_SCAN_OFFSET
    h = np.where(np.isfinite(h), h, HEIGHT_SCAN_CLIP)
    return np.clip(h, -HEIGHT_SCAN_CLIP, HEIGHT_SCAN_CLIP)


def build_expert_observation(state: Go2State) -> np.ndarray:
    """The 433-dim input of the official policy / critic, float32."""
    state.validate()
    parts = {
        "base_lin_vel": state.base_lin_vel,
        "base_ang_vel": state.base_ang_vel,
        "projected_gravity": state.projected_gravity,
        "velocity_commands": state.command,
        "joint_pos_rel": np.asarray(state.joint_pos) - state.default_pose,
        "joint_vel_rel": state.joint_vel,
        "actions": state.last_action,
        "height_scan": height_scan_term(state.scan_heights),
        "cos_sin_phase": cos_sin_phase(state.step, state.control_dt, state.gait_period),
        "feet_body_forces": FOOT_FORCE_SCALE * np.asarray(state.foot_wrench).reshape(-1),
        "feet_height": np.clip(
            np.asarray(state.foot_clearance) - FOOT_RADIUS, -FEET_HEIGHT_CLIP, FEET_HEIGHT_CLIP
        ),
        "base_mass": [state.base_mass_delta],
        "material_properties": state.material,
        "joint_stiffness": np.asarray(state.kp) / (GAIN_BAND * NOMINAL_KP)
        + 1.0
        - (1.0 + GAIN_BAND) / GAIN_BAND,
        "joint_damping": np.asarray(state.kd) / (GAIN_BAND * NOMINAL_KD)
        + 1.0
        - (1.0 + GAIN_BAND) / GAIN_BAND,
        "joint_friction": np.asarray(state.joint_friction) * 2.0 / MAX_JOINT_FRICTION - 1.0,
    }
    obs = np.concatenate(
        [np.asarray(parts[name], dtype=np.float64).reshape(-1) for name, _ in EXPERT_OBS_TERMS]
    )
    assert obs.shape == (EXPERT_OBS_DIM,)
    return obs.astype(np.float32)


def build_proprio(state: Go2State) -> np.ndarray:
    """The planner's 35-dim proprio vector (system_go2.yaml order), float32."""
    state.validate()
    return np.concatenate(
        [
            state.base_lin_vel,
            state.base_ang_vel,
            state.projected_gravity,
            np.asarray(state.joint_pos) - state.default_pose,
            state.joint_vel,
            cos_sin_phase(state.step, state.control_dt, state.gait_period),
        ]
    ).astype(np.float32)


def scan_to_grid(scan_flat: np.ndarray, nx: int = 21, ny: int = 15) -> np.ndarray:
    """(ny * nx,) x-fastest scan -> (nx, ny) grid indexed [ix, iy] (the model's 21 x 15 map)."""
    return np.asarray(scan_flat).reshape(ny, nx).T.copy()


def grid_to_scan(grid: np.ndarray) -> np.ndarray:
    """Inverse of `scan_to_grid`."""
    return np.asarray(grid).T.reshape(-1).copy()
