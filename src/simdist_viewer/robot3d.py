"""The robot in 3D: the task's MuJoCo model, its visible geoms logged once, body poses per tick.

The model is the one the MuJoCo driver simulates, as its `RobotSpec.bare_scene` builds it (UR5e:
`ur5e.scene.compose` without cameras; Go2: `go2.scene.build_go2_spec` on flat ground), with the
simulator's render-only mesh detail (`ur5e/mesh_lod.py`). Geoms visible by default
in MuJoCo (groups 0-2, planes left out) are logged static under `world/robot/<body>/<geom>`
(boxes, capsules, spheres, cylinders, ellipsoids; meshes as triangle meshes), and each update
sets the joints it is given (by name), runs forward kinematics and logs every moving body's world
pose as a `Transform3D`.
"""

from __future__ import annotations

import importlib
import re

import mujoco
import numpy as np
import rerun as rr

from robot_drivers.specs import robot_spec
from robot_drivers.ur5e.mesh_lod import decimate_visual_meshes
from simdist_viewer.layout import ROBOT_3D

VISIBLE_GROUPS = (0, 1, 2)  # MuJoCo's viewer shows these geom groups by default
RENDER_MESH_FACES = 1000  # triangles per visual mesh (ur5e/mesh_lod.py), the simulator's setting


def build_model(robot: str) -> mujoco.MjModel:
    """The robot's MuJoCo model as the simulator composes it (no cameras, no task objects)."""
    scene = robot_spec(robot).bare_scene  # ValueError naming the known robots
    if not scene:
        raise ValueError(f"robot {robot!r} has no bare_scene in its RobotSpec to show in 3-D")
    module, function = scene.split(":")
    spec = getattr(importlib.import_module(module), function)()
    decimate_visual_meshes(spec, RENDER_MESH_FACES)
    return spec.compile()


def _entity_part(name: str, index: int, prefix: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name) if name else f"{prefix}{index}"


def _quat_xyzw(wxyz) -> rr.Quaternion:
    w, x, y, z = (float(v) for v in wxyz)
    return rr.Quaternion(xyzw=[x, y, z, w])


class RobotScene:
    """MuJoCo bodies of one robot, logged to Rerun."""

    def __init__(self, robot: str, model: mujoco.MjModel | None = None):
        self.robot = robot
        self.model = build_model(robot) if model is None else model
        self.data = mujoco.MjData(self.model)
        mujoco.mj_kinematics(self.model, self.data)
        m = self.model
        self.paths = [
            f"{ROBOT_3D}/{_entity_part(m.body(b).name, b, 'body')}" for b in range(m.nbody)
        ]
        # bodies that move with a joint (or below one): their pose is logged per update
        moving = np.zeros(m.nbody, bool)
        for b in range(1, m.nbody):
            moving[b] = m.body_jntnum[b] > 0 or moving[m.body_parentid[b]]
        self.moving = np.flatnonzero(moving)
        self.joint_qpos = {
            m.joint(j).name: int(m.jnt_qposadr[j])
            for j in range(m.njnt)
            if int(m.jnt_type[j])
            in (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE))
        }
        free = [j for j in range(m.njnt) if int(m.jnt_type[j]) == int(mujoco.mjtJoint.mjJNT_FREE)]
        self.free_qpos = int(m.jnt_qposadr[free[0]]) if free else None

    def log_static(self, rec: rr.RecordingStream) -> int:
        """Every visible geom, once, in its body's frame; returns how many were logged."""
        m = self.model
        count = 0
        for g in range(m.ngeom):
            if (
                m.geom_group[g] not in VISIBLE_GROUPS
                or int(m.geom_type[g]) == mujoco.mjtGeom.mjGEOM_PLANE
            ):
                continue
            shape = self._shape(g)
            if shape is None:
                continue
            body = int(m.geom_bodyid[g])
            path = f"{self.paths[body]}/{_entity_part(m.geom(g).name, g, 'geom')}"
            rec.log(
                path,
                rr.Transform3D(translation=m.geom_pos[g], quaternion=_quat_xyzw(m.geom_quat[g])),
                shape,
                static=True,
            )
            count += 1
        for b in range(1, m.nbody):  # fixed bodies (table, terrain) once, the rest per update
            if b not in self.moving:
                self._log_body(rec, b, static=True)
        return count

    def _shape(self, g: int):
        m = self.model
        size = m.geom_size[g]
        rgba = m.mat_rgba[m.geom_matid[g]] if m.geom_matid[g] >= 0 else m.geom_rgba[g]
        color = (np.clip(rgba, 0, 1) * 255).astype(np.uint8)
        kind = int(m.geom_type[g])
        if kind == mujoco.mjtGeom.mjGEOM_BOX:
            return rr.Boxes3D(half_sizes=[size], colors=[color], fill_mode="solid")
        if kind == mujoco.mjtGeom.mjGEOM_SPHERE:
            return rr.Ellipsoids3D(half_sizes=[[size[0]] * 3], colors=[color], fill_mode="solid")
        if kind == mujoco.mjtGeom.mjGEOM_ELLIPSOID:
            return rr.Ellipsoids3D(half_sizes=[size], colors=[color], fill_mode="solid")
        if kind == mujoco.mjtGeom.mjGEOM_CAPSULE:  # MuJoCo's capsule runs along z, centred
            return rr.Capsules3D(
                lengths=[2 * size[1]],
                radii=[size[0]],
                translations=[[0, 0, -size[1]]],
                colors=[color],
            )
        if kind == mujoco.mjtGeom.mjGEOM_CYLINDER:
            return rr.Cylinders3D(lengths=[2 * size[1]], radii=[size[0]], colors=[color])
        if kind == mujoco.mjtGeom.mjGEOM_MESH:
            mesh = m.geom_dataid[g]
            v0, nv = m.mesh_vertadr[mesh], m.mesh_vertnum[mesh]
            f0, nf = m.mesh_faceadr[mesh], m.mesh_facenum[mesh]
            return rr.Mesh3D(
                vertex_positions=m.mesh_vert[v0 : v0 + nv],
                triangle_indices=m.mesh_face[f0 : f0 + nf],
                albedo_factor=color,
            )
        return None

    def set_joints(self, names, positions) -> int:
        """Joint positions by name (unknown names are ignored); returns how many were set."""
        n = 0
        for name, value in zip(names, positions):
            adr = self.joint_qpos.get(name)
            if adr is not None:
                self.data.qpos[adr] = float(value)
                n += 1
        return n

    def set_base(self, position, quat_wxyz) -> None:
        """The floating base's world pose (Go2, from /odom)."""
        if self.free_qpos is not None:
            self.data.qpos[self.free_qpos : self.free_qpos + 3] = position
            self.data.qpos[self.free_qpos + 3 : self.free_qpos + 7] = quat_wxyz

    def log_poses(self, rec: rr.RecordingStream) -> list[str]:
        """Forward kinematics, then every moving body's world pose at the current time; returns
        the entities logged."""
        mujoco.mj_kinematics(self.model, self.data)
        for b in self.moving:
            self._log_body(rec, int(b))
        return [self.paths[b] for b in self.moving]

    def _log_body(self, rec: rr.RecordingStream, b: int, static: bool = False) -> None:
        rec.log(
            self.paths[b],
            rr.Transform3D(
                translation=self.data.xpos[b], quaternion=_quat_xyzw(self.data.xquat[b])
            ),
            static=static,
        )
