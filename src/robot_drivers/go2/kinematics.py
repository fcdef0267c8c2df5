"""The Go2's feet from its proprio vector alone: where they are and how fast they move.

The planner's proprio (`build_proprio`) holds the base velocity and angular velocity (base frame)
and the joint angles and speeds, so the feet follow by forward kinematics: a foot's position in
the base frame, and its velocity in the world expressed in the base frame,
v_foot = v_base + w x p_foot + J(q) dq. A standing foot that holds has a horizontal velocity near
zero; one that slips does not. Diagnoses of slipping (simdist_adapter.slip) read feet this way
from real and from predicted proprio alike.
"""

from __future__ import annotations

import mujoco
import numpy as np

from robot_drivers.go2.backend import FOOT_GEOMS
from robot_drivers.go2.config import (
    DEFAULT_POSE_UNITREE,
    MENAGERIE_JOINT_NAMES,
    Go2Config,
    to_menagerie,
)
from robot_drivers.go2.observation import PROPRIO_SLICES
from robot_drivers.go2.scene import TerrainConfig, build_go2_model


class Go2Kinematics:
    """`feet(proprio)` -> positions and velocities of FR, FL, RR, RL (Unitree order), base frame."""

    def __init__(self, config: Go2Config | None = None):
        self.model = build_go2_model(config or Go2Config(), TerrainConfig())
        self.data = mujoco.MjData(self.model)
        m = self.model
        self._qadr = np.array([m.jnt_qposadr[m.joint(n).id] for n in MENAGERIE_JOINT_NAMES])
        self._dadr = np.array([m.jnt_dofadr[m.joint(n).id] for n in MENAGERIE_JOINT_NAMES])
        self._feet = [m.geom(name).id for name in FOOT_GEOMS]

    def feet(self, proprio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions (..., 4, 3), velocities (..., 4, 3)) for proprio of shape (..., 35)."""
        proprio = np.asarray(proprio, dtype=np.float64)
        flat = proprio.reshape(-1, proprio.shape[-1])
        pos = np.empty((len(flat), len(self._feet), 3))
        vel = np.empty_like(pos)
        m, d = self.model, self.data
        res = np.zeros(6)
        for i, row in enumerate(flat):
            d.qpos[:] = 0.0
            d.qvel[:] = 0.0
            d.qpos[3] = 1.0  # the base at the origin, unrotated: world frame = base frame
            d.qpos[self._qadr] = to_menagerie(
                DEFAULT_POSE_UNITREE + row[PROPRIO_SLICES["joint_pos"]]
            )
            d.qvel[:3] = row[PROPRIO_SLICES["base_lin_vel"]]
            d.qvel[3:6] = row[PROPRIO_SLICES["base_ang_vel"]]
            d.qvel[self._dadr] = to_menagerie(row[PROPRIO_SLICES["joint_vel"]])
            mujoco.mj_kinematics(m, d)
            mujoco.mj_comPos(m, d)
            mujoco.mj_comVel(m, d)
            for k, geom in enumerate(self._feet):
                pos[i, k] = d.geom_xpos[geom]
                mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_GEOM, geom, res, 0)
                vel[i, k] = res[3:]
        shape = proprio.shape[:-1] + (len(self._feet), 3)
        return pos.reshape(shape), vel.reshape(shape)
