"""MuJoCo-side sensing for the Go2: height scan, foot clearance, foot wrenches, terrain contacts.

Rays see terrain geoms only (geom group 0), never the robot, like IsaacLab's ray caster
pointed at the ground mesh.
"""

from __future__ import annotations

import mujoco
import numpy as np

from robot_drivers.go2.config import HeightScanConfig
from robot_drivers.go2.scene import TERRAIN_GROUP

_TERRAIN_ONLY = np.zeros(6, dtype=np.uint8)
_TERRAIN_ONLY[TERRAIN_GROUP] = 1
_DOWN = np.array([0.0, 0.0, -1.0])


def yaw_of(quat_wxyz: np.ndarray) -> float:
    w, x, y, z = quat_wxyz
    return float(np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z)))


def ground_z(
    model: mujoco.MjModel, data: mujoco.MjData, x: float, y: float, start_z: float
) -> float:
    """Terrain height below (x, y); NaN when no terrain lies under that point."""
    geomid = np.zeros(1, dtype=np.int32)
    dist = mujoco.mj_ray(
        model, data, np.array([x, y, start_z]), _DOWN, _TERRAIN_ONLY, 1, -1, geomid
    )
    return start_z - dist if dist >= 0 else float("nan")


class HeightScanner:
    """The 21 x 15 yaw-aligned grid; returns base_z - hit_z per ray, x varying fastest.

    All 315 rays leave one point `apex` metres above the base and aim at the grid points at
    the base's height, so one `mj_multiRay` call does the whole scan (10x faster than 315
    `mj_ray` calls). At 1000 m the rays are within 0.1 deg of vertical: a hit 0.2 m above or
    below the aim height lands < 0.3 mm from its grid point.
    """

    def __init__(self, config: HeightScanConfig, apex: float = 1000.0):
        self.config = config
        self.apex = apex
        self.grid = config.grid_xy()  # (n, 2) base-yaw frame
        n = len(self.grid)
        self._geomid = np.zeros(n, dtype=np.int32)
        self._dist = np.zeros(n)

    def scan(
        self, model: mujoco.MjModel, data: mujoco.MjData, base_pos: np.ndarray, yaw: float
    ) -> np.ndarray:
        c, s = np.cos(yaw), np.sin(yaw)
        offsets = self.grid @ np.array([[c, s], [-s, c]])  # world-frame xy offsets
        origin = np.array([base_pos[0], base_pos[1], base_pos[2] + self.apex])
        vec = np.column_stack([offsets, np.full(len(offsets), -self.apex)])
        mujoco.mj_multiRay(
            model,
            data,
            origin,
            vec.ravel(),
            _TERRAIN_ONLY,
            1,
            -1,
            self._geomid,
            self._dist,
            None,
            len(offsets),
            np.inf,
        )
        hit_z = np.where(self._dist >= 0, origin[2] - self._dist * self.apex, np.nan)
        return base_pos[2] - hit_z


def foot_wrenches(
    model: mujoco.MjModel, data: mujoco.MjData, foot_geoms: np.ndarray, foot_centres: np.ndarray
) -> np.ndarray:
    """Per foot: the wrench the leg applies to the foot (= minus the ground's), world frame,
    about the foot centre, as (4, 6) [F, tau]."""
    wrench = np.zeros((len(foot_geoms), 6))
    f6 = np.zeros(6)
    for i in range(data.ncon):
        con = data.contact[i]
        for k, g in enumerate(foot_geoms):
            if con.geom1 == g or con.geom2 == g:
                mujoco.mj_contactForce(model, data, i, f6)
                frame = con.frame.reshape(3, 3)
                f_world = frame.T @ f6[:3]  # force of geom1 on geom2
                on_foot = f_world if con.geom2 == g else -f_world
                r = con.pos - foot_centres[k]
                wrench[k, :3] -= on_foot
                wrench[k, 3:] -= (
                    r[1] * on_foot[2] - r[2] * on_foot[1],  # r x F, inlined:
                    r[2] * on_foot[0] - r[0] * on_foot[2],  # np.cross costs
                    r[0] * on_foot[1] - r[1] * on_foot[0],
                )  # more than physics
    return wrench


def terrain_contact(data: mujoco.MjData, body_geoms: np.ndarray, terrain_geoms: np.ndarray) -> bool:
    """True when any of `body_geoms` touches any terrain geom."""
    for i in range(data.ncon):
        g1, g2 = data.contact.geom1[i], data.contact.geom2[i]
        if (g1 in terrain_geoms and g2 in body_geoms) or (g2 in terrain_geoms and g1 in body_geoms):
            return True
    return False
