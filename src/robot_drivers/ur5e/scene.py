"""Compose UR5e + Robotiq 2F-85 + table + cameras with `mujoco.MjSpec` from the menagerie models.

Models are resolved through `mujoco_menagerie` (offline: MENAGERIE_ROOT points at a local copy).
Task objects are added by a callback so every task shares one arm, one controller and one rig.
"""

from __future__ import annotations

from typing import Callable

import mujoco
import mujoco_menagerie
import numpy as np

from robot_drivers.ur5e.config import CameraPose, SceneConfig
from robot_drivers.ur5e.mesh_lod import decimate_visual_meshes

ARM_ROBOT, ARM_ENTRY = "universal_robots_ur5e", "ur5e"
GRIPPER_ROBOT, GRIPPER_ENTRY = "robotiq_2f85", "2f85"
GRIPPER_PREFIX = "gripper_"
TCP_SITE = "gripper_pinch"  # gripper_base + (0, 0, 0.145), between the pads
ARM_JOINTS = (
    "shoulder_pan_joint",
    "shoulder_lift_joint",
    "elbow_joint",
    "wrist_1_joint",
    "wrist_2_joint",
    "wrist_3_joint",
)


def _menagerie_spec(robot: str, entry: str) -> mujoco.MjSpec:
    try:
        return mujoco_menagerie.get(robot).spec(entry)
    except mujoco_menagerie.MenagerieError as e:
        raise RuntimeError(
            f"cannot resolve menagerie model {robot}/{entry}: {e}. Offline machines set "
            "MENAGERIE_ROOT to a folder holding the menagerie models (e.g. ../shared/menagerie)"
        ) from e


def look_at_xyaxes(pos, target, up) -> np.ndarray:
    """MuJoCo camera xyaxes for a camera at `pos` looking at `target` (camera -z = forward)."""
    f = np.asarray(target, float) - np.asarray(pos, float)
    f /= np.linalg.norm(f)
    x = np.cross(f, np.asarray(up, float))
    if np.linalg.norm(x) < 1e-6:
        raise ValueError(f"camera up vector {up} is parallel to its viewing direction")
    x /= np.linalg.norm(x)
    y = np.cross(x, f)
    return np.concatenate([x, y])


def _add_camera(spec: mujoco.MjSpec, name: str, pose: CameraPose, cfg: SceneConfig) -> None:
    world = pose.body == "world"
    offset = np.asarray(cfg.appearance.camera_offset) if world else np.zeros(3)
    pos = np.asarray(pose.pos) + offset
    body = spec.worldbody if world else spec.body(GRIPPER_PREFIX + "base")
    if body is None:
        raise ValueError(f"camera {name!r}: no body {pose.body!r}")
    body.add_camera(
        name=name,
        pos=pos,
        xyaxes=look_at_xyaxes(pos, pose.target, pose.up),
        fovy=pose.fovy + cfg.appearance.fovy_offset,
    )


def _add_table(spec: mujoco.MjSpec, cfg: SceneConfig) -> None:
    app = cfg.appearance
    if app.table_checker:
        spec.add_texture(
            name="table_tex",
            type=mujoco.mjtTexture.mjTEXTURE_2D,
            builtin=mujoco.mjtBuiltin.mjBUILTIN_CHECKER,
            width=256,
            height=256,
            rgb1=app.table_rgba[:3],
            rgb2=[0.9 * c for c in app.table_rgba[:3][::-1]],
        )
        mat = spec.add_material(name="table_mat", texrepeat=[8, 8])
        mat.textures[mujoco.mjtTextureRole.mjTEXROLE_RGB] = "table_tex"
    else:
        spec.add_material(name="table_mat", rgba=list(app.table_rgba))
    spec.worldbody.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_BOX,
        size=[0.6, 0.5, 0.02],
        pos=[0.05, 0.45, -0.02],
        material="table_mat",
    )
    spec.worldbody.add_light(
        name="top_light",
        pos=list(app.light_pos),
        dir=[0, 0, -1],
        diffuse=list(app.light_diffuse),
        castshadow=False,
    )
    spec.visual.headlight.ambient = [app.headlight] * 3
    spec.visual.headlight.diffuse = [0.2] * 3


def compose(
    cfg: SceneConfig, add_objects: Callable[[mujoco.MjSpec], None] | None = None
) -> mujoco.MjSpec:
    """The full scene spec: arm with gripper at the flange, gravcomp, solver options, render-only
    mesh detail, table, cameras, then the task's objects."""
    arm = _menagerie_spec(ARM_ROBOT, ARM_ENTRY)
    gripper = _menagerie_spec(GRIPPER_ROBOT, GRIPPER_ENTRY)
    for geom in gripper.geoms:  # the pad boxes carry the grasp friction
        if geom.classname.name in ("pad_box1", "pad_box2"):
            geom.friction = [cfg.pad_friction, geom.friction[1], geom.friction[2]]
    # The attach keeps the parent's options: set them first so the models agree.
    opt = arm.option
    opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    opt.impratio = cfg.impratio
    arm.attach(gripper, site=arm.site("attachment_site"), prefix=GRIPPER_PREFIX)
    for body in arm.bodies:
        if body.name != "world":
            body.gravcomp = 1.0  # the real arm's controller compensates gravity
    opt.timestep = cfg.timestep
    opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    opt.iterations = cfg.solver_iterations
    if cfg.render_mesh_faces:  # also state-only scenes: they render robot masks on demand
        decimate_visual_meshes(arm, cfg.render_mesh_faces)
    arm.visual.global_.offwidth = max(640, cfg.image_size[1])
    arm.visual.global_.offheight = max(480, cfg.image_size[0])
    arm.visual.quality.shadowsize = 0
    arm.visual.quality.offsamples = cfg.render_samples
    _add_table(arm, cfg)
    for name, pose in cfg.camera_poses.items():
        _add_camera(arm, name, pose, cfg)
    if add_objects is not None:
        add_objects(arm)
    return arm


def bare_scene() -> mujoco.MjSpec:
    """The arm with its gripper on the table as `compose` builds it, without cameras, task objects
    or render-only mesh detail (`RobotSpec.bare_scene`)."""
    return compose(SceneConfig(cameras=(), render_mesh_faces=0))


def robot_body_ids(model: mujoco.MjModel) -> np.ndarray:
    """Bodies of the arm and gripper (the robot mask), i.e. the subtree of the arm's base."""
    base = model.body("base").id
    ids = [b for b in range(model.nbody) if _has_ancestor(model, b, base)]
    return np.asarray(ids, int)


def _has_ancestor(model: mujoco.MjModel, body: int, ancestor: int) -> bool:
    while body > 0:
        if body == ancestor:
            return True
        body = model.body_parentid[body]
    return False
