"""Typed settings of the UR5e scene and its servoL-like controller (one source of truth each).

Defaults are the measured values of `shared/UR5E_PEG_NOTES.md`; the "real" task variants derive
changed copies with `dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The arm's start pose: gripper pointing straight down, TCP at about (-0.13, 0.49, 0.33).
HOME_QPOS: tuple[float, ...] = (-1.5708, -1.5708, 1.5708, -1.5708, -1.5708, 0.0)
CAMERA_NAMES: tuple[str, ...] = ("wrist", "overhead", "side")


@dataclass(frozen=True)
class CameraPose:
    """A camera placed by position and look-at point, in its parent body's frame."""

    pos: tuple[float, float, float]
    target: tuple[float, float, float]
    up: tuple[float, float, float] = (0.0, 0.0, 1.0)
    fovy: float = 40.0
    body: str = "world"  # "world" or "gripper_base" (the wrist camera moves with the hand)


def default_cameras() -> dict[str, CameraPose]:
    """Overhead and side as measured in the notes; the wrist camera sits beside the fingertips.

    The wrist camera looks at the held peg's bottom from 8 cm (a 6 cm field, about 0.9 mm per
    pixel at 64 x 64): where the peg sits in the hand decides the insertion against a 1 mm
    clearance, and a small CNN reads it from this view to 0.4 / 0.7 mm (along the pads / the
    fingers) where a view from behind the hand (fovy 70) gives 1.0 / 1.1 mm (measurements:
    docs/notebook/peg_wide.md)."""
    return {
        # in gripper_base's frame: +z points along the fingers, the fingers close along y.
        "wrist": CameraPose(
            (0.05, 0.03, 0.15),
            (0.0, 0.0, 0.205),
            up=(0.0, 0.0, -1.0),
            fovy=40.0,
            body="gripper_base",
        ),
        "overhead": CameraPose((0.05, 0.5, 1.1), (0.05, 0.5, 0.0), up=(0.0, 1.0, 0.0)),
        "side": CameraPose((0.05, 1.3, 0.35), (0.05, 0.5, 0.15)),
    }


@dataclass(frozen=True)
class Appearance:
    """What the cameras see beyond geometry: the "real" variant changes these."""

    table_rgba: tuple[float, float, float, float] = (0.55, 0.45, 0.35, 1.0)
    table_checker: bool = False  # a checker texture on the table instead of a flat colour
    light_pos: tuple[float, float, float] = (0.0, 0.5, 2.0)
    light_diffuse: tuple[float, float, float] = (0.5, 0.5, 0.5)
    headlight: float = 0.15  # ambient headlight intensity
    camera_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)  # added to world cameras' pos
    fovy_offset: float = 0.0


@dataclass(frozen=True)
class SceneConfig:
    """Rendering and physics settings of the composed scene."""

    image_size: tuple[int, int] = (64, 64)  # (height, width) of every camera; 224x224 works too
    cameras: tuple[str, ...] = CAMERA_NAMES  # () renders nothing (fast state-only rollouts)
    camera_poses: dict[str, CameraPose] = field(default_factory=default_cameras)
    appearance: Appearance = Appearance()
    timestep: float = 0.002
    solver_iterations: int = 50
    impratio: float = 10.0
    pad_friction: float = 0.7  # Robotiq pad boxes (menagerie: 0.7 / 0.6)
    # Triangles per visual mesh (ur5e/mesh_lod.py): 1000 renders ~3x faster on a software GL and
    # looks the same at 64x64; physics never changes. 0 keeps the full meshes.
    render_mesh_faces: int = 1000
    # Multisample anti-aliasing of the offscreen buffer (MuJoCo's default is 4). On llvmpipe 4x
    # MSAA costs 2.5x per camera once the arm fills the view; 0 gives aliased but exact edges.
    render_samples: int = 0

    def __post_init__(self):
        unknown = [c for c in self.cameras if c not in self.camera_poses]
        if unknown:
            raise ValueError(f"unknown cameras {unknown}; known: {sorted(self.camera_poses)}")
        h, w = self.image_size
        if h < 8 or w < 8:
            raise ValueError(f"image_size must be at least 8x8, got {self.image_size}")
        if self.render_samples not in (0, 2, 4, 8, 16):
            raise ValueError(f"render_samples must be 0, 2, 4, 8 or 16, got {self.render_samples}")
        if self.render_mesh_faces != 0 and self.render_mesh_faces < 4:
            raise ValueError(
                f"render_mesh_faces must be 0 (full meshes) or >= 4, got {self.render_mesh_faces}"
            )


@dataclass(frozen=True)
class ControllerConfig:
    """servoL-like Cartesian control: 5 Hz relative pose targets tracked by DLS IK.

    `ik_hz` may be below the physics rate: between IK updates the commanded joints keep moving
    at the last joint velocity (measured tracking is in docs/ur5e_sim.md).
    """

    control_hz: float = 5.0
    ik_hz: float = 100.0
    kp: float = 25.0  # pose-error gain (1/s) of the IK velocity command
    max_lin_vel: float = 0.3  # m/s
    max_ang_vel: float = 2.0  # rad/s
    damping: float = 0.03  # DLS damping
    singular_threshold: float = 0.05  # extra damping 2 * (threshold - sigma_min) below it
    nullspace_gain: float = 0.5  # pull towards HOME_QPOS in the DLS null space
    max_joint_vel: float = 3.0  # rad/s
    joint_limit_margin: float = 0.05  # rad
    feedforward: bool = True  # ctrl = q_cmd + (kv/kp) qdot_cmd cancels actuator damping
    actuator_gain_scale: float = 1.0  # scales the arm's position-servo kp and kv ("real" gap)
    action_latency_s: float = 0.0  # a new command takes effect this late within the period
    max_step_pos: float = 0.05  # m per 5 Hz step; larger commands are clipped
    max_step_rot: float = 0.5  # rad per 5 Hz step
    gripper_close: float = 255.0  # Robotiq ctrl for "closed" (force capped by the actuator)

    def __post_init__(self):
        period = 1.0 / self.control_hz
        if not 0.0 <= self.action_latency_s < period:
            raise ValueError(
                f"action_latency_s must be in [0, {period}), got {self.action_latency_s}"
            )
        if self.kp <= 0 or self.ik_hz <= 0:
            raise ValueError("kp and ik_hz must be positive")
