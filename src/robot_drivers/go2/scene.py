"""Compose the MuJoCo Go2 scene with MjSpec: menagerie Go2, floor, slope panels / foam pads.

Terrain geoms live in geom group 0 and the robot's in groups 2-3, so the height scan (which
casts rays against group 0 only) never sees the robot itself. Terrain pieces get a higher
contact priority than the feet (menagerie foot priority 1), so THEIR friction and softness
govern foot contacts: that is how the "real" stand-ins change the ground.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import mujoco
import mujoco_menagerie
import numpy as np

from robot_drivers.go2.config import Go2Config

TERRAIN_GROUP = 0
TERRAIN_PRIORITY = 2
MUJOCO_DEFAULT_SOLIMP = (0.9, 0.95, 0.001, 0.5, 2.0)
MUJOCO_DEFAULT_SOLREF = (0.02, 1.0)


@dataclass(frozen=True)
class SlopePanel:
    length: float  # m along x (in the panel's inclined plane)
    angle_deg: float  # incline, positive = uphill in +x


@dataclass(frozen=True)
class TerrainConfig:
    """The ground the robot walks on. Empty panels and pads = flat floor only."""

    floor_friction: float = 0.8  # matches the menagerie foot (official static friction 0.8)
    panels: tuple[SlopePanel, ...] = ()
    panels_start_x: float = 0.4  # the first panel's lower edge, m ahead of the start pose
    panel_width: float = 2.0
    panel_friction: float = 0.8
    plateau_length: float = 2.0  # flat top after the last panel
    pads_start_x: tuple[float, ...] = ()  # each pad's near edge (m); overlaps stack
    pad_length: float = 1.5
    pad_width: float = 2.0
    pad_thickness: float = 0.05
    pad_friction: float = 0.8
    pad_solref: tuple[float, float] = MUJOCO_DEFAULT_SOLREF  # rigid unless a variant softens it
    pad_solimp: tuple[float, ...] = MUJOCO_DEFAULT_SOLIMP

    def __post_init__(self) -> None:
        for p in self.panels:
            if p.length <= 0 or not -30.0 <= p.angle_deg <= 30.0:
                raise ValueError(f"slope panel needs length > 0 and |angle| <= 30 deg, got {p}")
        if min(self.floor_friction, self.panel_friction, self.pad_friction) <= 0:
            raise ValueError("friction coefficients must be > 0")
        if self.pads_start_x and (self.pad_length <= 0 or self.pad_thickness <= 0):
            raise ValueError("pads need pad_length > 0 and pad_thickness > 0")
        if self.pads_start_x and self.panels:
            raise ValueError("a terrain has slope panels or foam pads, not both")

    def pad_profile(self) -> list[tuple[float, float, int]]:
        """(x0, x1, layers) segments of the stacked pads, layers >= 1 only."""
        edges = sorted({x for s in self.pads_start_x for x in (s, s + self.pad_length)})
        out = []
        for x0, x1 in zip(edges[:-1], edges[1:]):
            mid = 0.5 * (x0 + x1)
            layers = sum(s <= mid < s + self.pad_length for s in self.pads_start_x)
            if layers:
                out.append((x0, x1, layers))
        return out

    def ground_height(self, x: float) -> float:
        """Terrain top height at world x (the rigid geometry; soft pads sink below it)."""
        for x0, x1, layers in self.pad_profile():
            if x0 <= x < x1:
                return layers * self.pad_thickness
        xs, z = self.panels_start_x, 0.0
        for p in self.panels:
            a = math.radians(p.angle_deg)
            dx = p.length * math.cos(a)
            if xs <= x < xs + dx:
                return z + (x - xs) * math.tan(a)
            xs, z = xs + dx, z + p.length * math.sin(a)
        if self.panels and xs <= x < xs + self.plateau_length:
            return z
        return 0.0


def menagerie_go2_path() -> str:
    """The menagerie go2.xml, resolved by `mujoco_menagerie` (offline through MENAGERIE_ROOT)."""
    try:
        return str(mujoco_menagerie.get("unitree_go2").xml("go2"))
    except Exception as e:
        raise RuntimeError(
            "cannot resolve the menagerie Go2 model: set MENAGERIE_ROOT to a folder holding "
            f"unitree_go2/ (e.g. ../shared/menagerie) or allow downloads; MENAGERIE_ROOT="
            f"{os.environ.get('MENAGERIE_ROOT')!r}: {e}"
        ) from e


def _add_box(
    spec: mujoco.MjSpec,
    name: str,
    center,
    half,
    euler_y: float,
    friction: float,
    solref=MUJOCO_DEFAULT_SOLREF,
    solimp=MUJOCO_DEFAULT_SOLIMP,
    rgba=(0.6, 0.6, 0.65, 1),
):
    quat = np.zeros(4)
    mujoco.mju_euler2Quat(quat, np.array([0.0, euler_y, 0.0]), "xyz")
    spec.worldbody.add_geom(
        name=name,
        type=mujoco.mjtGeom.mjGEOM_BOX,
        pos=list(center),
        size=list(half),
        quat=list(quat),
        friction=[friction, 0.02, 0.01],
        condim=6,
        priority=TERRAIN_PRIORITY,
        group=TERRAIN_GROUP,
        solref=list(solref),
        solimp=list(solimp),
        rgba=list(rgba),
    )


def _add_panels(spec: mujoco.MjSpec, t: TerrainConfig, z0: float) -> None:
    thick = 0.1  # half thickness of each slab; tops meet at the panel seams
    x, z = t.panels_start_x, z0
    for i, p in enumerate(t.panels):
        a = math.radians(p.angle_deg)
        x1, z1 = x + p.length * math.cos(a), z + p.length * math.sin(a)
        normal = np.array([-math.sin(a), 0.0, math.cos(a)])
        centre = np.array([(x + x1) / 2, 0.0, (z + z1) / 2]) - thick * normal
        # MuJoCo's rotation about +y tilts +x downwards, so an uphill panel uses -a.
        _add_box(
            spec,
            f"slope_panel_{i}",
            centre,
            (p.length / 2, t.panel_width / 2, thick),
            -a,
            t.panel_friction,
            rgba=(0.85, 0.85, 0.9, 1),
        )
        x, z = x1, z1
    if t.panels and t.plateau_length > 0:
        _add_box(
            spec,
            "slope_plateau",
            (x + t.plateau_length / 2, 0.0, z - thick),
            (t.plateau_length / 2, t.panel_width / 2, thick),
            0.0,
            t.panel_friction,
            rgba=(0.85, 0.85, 0.9, 1),
        )


def _add_pads(spec: mujoco.MjSpec, t: TerrainConfig) -> None:
    for i, (x0, x1, layers) in enumerate(t.pad_profile()):
        h = layers * t.pad_thickness
        _add_box(
            spec,
            f"foam_pad_{i}",
            ((x0 + x1) / 2, 0.0, h / 2),
            ((x1 - x0) / 2, t.pad_width / 2, h / 2),
            0.0,
            t.pad_friction,
            solref=t.pad_solref,
            solimp=t.pad_solimp,
            rgba=(0.3, 0.45, 0.8, 1),
        )


def build_go2_spec(config: Go2Config, terrain: TerrainConfig) -> mujoco.MjSpec:
    """The Go2 scene as an editable spec (compile with `spec.compile()`)."""
    spec = mujoco.MjSpec.from_file(menagerie_go2_path())
    spec.option.timestep = config.physics_dt
    # The menagerie joints carry damping 2 and frictionloss 0.2 that the IsaacLab-trained
    # expert never saw; left in, the robot falls within seconds. The PD lives in Python.
    for joint in spec.joints:
        if joint.type == mujoco.mjtJoint.mjJNT_FREE:
            continue
        joint.damping = np.zeros_like(np.atleast_1d(joint.damping))
        joint.frictionloss = 0.0
    if config.foot_solimp_default:
        for leg in ("FL", "FR", "RL", "RR"):
            spec.geom(leg).solimp = list(MUJOCO_DEFAULT_SOLIMP)
    for name, kind in (
        ("imu_quat", mujoco.mjtSensor.mjSENS_FRAMEQUAT),
        ("imu_gyro", mujoco.mjtSensor.mjSENS_GYRO),
        ("imu_acc", mujoco.mjtSensor.mjSENS_ACCELEROMETER),
    ):
        spec.add_sensor(name=name, type=kind, objtype=mujoco.mjtObj.mjOBJ_SITE, objname="imu")
    spec.worldbody.add_light(
        name="sun", pos=[0, 0, 4], dir=[0, 0, -1], type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL
    )
    spec.worldbody.add_geom(
        name="floor",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[0, 0, 0.05],
        friction=[terrain.floor_friction, 0.02, 0.01],
        condim=6,
        group=TERRAIN_GROUP,
        rgba=[0.4, 0.45, 0.4, 1],
    )
    _add_pads(spec, terrain)
    _add_panels(spec, terrain, 0.0)
    return spec


def build_go2_model(config: Go2Config, terrain: TerrainConfig) -> mujoco.MjModel:
    return build_go2_spec(config, terrain).compile()


def bare_scene() -> mujoco.MjSpec:
    """The Go2 on flat ground with the default settings (`RobotSpec.bare_scene`)."""
    return build_go2_spec(Go2Config(), TerrainConfig())
