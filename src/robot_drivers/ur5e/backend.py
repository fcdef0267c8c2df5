"""MuJoCo UR5e + Robotiq 2F-85 behind the common RobotBackend interface (lockstep, 5 Hz)."""

from __future__ import annotations

from typing import Protocol

import mujoco
import numpy as np

from robot_drivers.interface import (
    Command,
    CommandKind,
    Fault,
    FaultLevel,
    Observation,
    ProprioTerm,
    RobotBackend,
    RobotSpec,
    validate_command,
)
from robot_drivers.ur5e.config import HOME_QPOS, ControllerConfig, SceneConfig
from robot_drivers.ur5e.controller import ARM_ACTUATORS, CartesianController
from robot_drivers.ur5e.render import CameraRig
from robot_drivers.ur5e.scene import ARM_JOINTS, GRIPPER_PREFIX, compose
from robot_drivers.ur5e.so3 import rot_error

PROPRIO_TERMS = (
    ProprioTerm("joint_pos", 6),  # rad, ARM_JOINTS order
    ProprioTerm("joint_vel", 6),  # rad/s
    ProprioTerm("tcp_pos", 3),  # m, world frame (arm base at the origin, table top z = 0)
    ProprioTerm("tcp_rot6d", 6),  # first two columns of the TCP rotation matrix (continuous)
    ProprioTerm("gripper", 1),  # 0 open .. 1 closed (driver joint / its range)
)
GRIPPER_DRIVER = GRIPPER_PREFIX + "right_driver_joint"
TRACKING_WARN_M = 0.02  # TCP further than this from its target at the end of a period


class SceneObjects(Protocol):
    """What a task adds to the scene: objects, their reset, and privileged task state."""

    def build(self, spec: mujoco.MjSpec) -> None: ...

    def reset(
        self, model: mujoco.MjModel, data: mujoco.MjData, rng: np.random.Generator
    ) -> None: ...

    def privileged(self, model: mujoco.MjModel, data: mujoco.MjData) -> dict[str, np.ndarray]: ...


def make_spec(scene: SceneConfig, controller: ControllerConfig) -> RobotSpec:
    """The RobotSpec of a UR5e backend with these settings."""
    c = controller
    return RobotSpec(
        name="ur5e",
        action_dim=7,
        control_rate_hz=c.control_hz,
        proprio_terms=PROPRIO_TERMS,
        cameras=tuple(scene.cameras),
        image_shape=(scene.image_size[0], scene.image_size[1]),
        action_low=(-c.max_step_pos,) * 3 + (-c.max_step_rot,) * 3 + (0.0,),
        action_high=(c.max_step_pos,) * 3 + (c.max_step_rot,) * 3 + (1.0,),
        joint_names=ARM_JOINTS,
        command_kind=CommandKind.EE_DELTA,
        bare_scene="robot_drivers.ur5e.scene:bare_scene",
    )


class MujocoUR5eBackend(RobotBackend):
    """EE_DELTA commands = [dx dy dz rx ry rz gripper]: a world-frame delta on the measured TCP
    pose (rotation vector applied on the left; per-step norms clipped to the spec limits),
    gripper > 0.5 closes. HOLD / DAMP keep the current pose. `step()` runs one 0.2 s period."""

    def __init__(
        self,
        scene: SceneConfig | None = None,
        controller: ControllerConfig | None = None,
        objects: SceneObjects | None = None,
    ):
        self.scene_cfg = scene or SceneConfig()
        self.ctrl_cfg = controller or ControllerConfig()
        self.objects = objects
        self.mjspec = compose(self.scene_cfg, objects.build if objects is not None else None)
        self.model = self.mjspec.compile()
        self._scale_servo_kp(self.ctrl_cfg.actuator_gain_scale)
        self.data = mujoco.MjData(self.model)
        self.controller = CartesianController(self.model, self.ctrl_cfg)
        self.spec = make_spec(self.scene_cfg, self.ctrl_cfg)
        self.rig = (
            CameraRig(self.model, self.spec.cameras, self.scene_cfg.image_size)
            if self.spec.cameras
            else None
        )
        self._mask_rig: CameraRig | None = None
        self.n_substeps = round(1.0 / (self.ctrl_cfg.control_hz * self.model.opt.timestep))
        self.latency_steps = round(self.ctrl_cfg.action_latency_s / self.model.opt.timestep)
        self._grip_q = self.model.joint(GRIPPER_DRIVER).qposadr[0]
        self._grip_range = self.model.joint(GRIPPER_DRIVER).range[1]
        self._rng = np.random.default_rng()
        self._pending: np.ndarray | None = None
        self._faults: list[Fault] = []

    def _scale_servo_kp(self, scale: float) -> None:
        """Scale the arm servos' stiffness only (kv kept): a controller-gain gap that also makes
        the nominal feed-forward ratio wrong."""
        if scale != 1.0:
            ids = [self.model.actuator(n).id for n in ARM_ACTUATORS]
            self.model.actuator_gainprm[ids, 0] *= scale
            self.model.actuator_biasprm[ids, 1] *= scale

    # -- RobotBackend --------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Observation:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)  # not the keyframe: menagerie's `home` key has the arm's size
        d.qpos[self.controller.qadr] = HOME_QPOS
        if self.objects is not None:
            self.objects.reset(m, d, self._rng)
        mujoco.mj_forward(m, d)
        self.controller.reset(d)
        self._pending = None
        self._faults = []
        for _ in range(50):  # let objects settle under a holding controller
            self.controller.physics_step(d)
            mujoco.mj_step(m, d)
        mujoco.mj_forward(m, d)
        return self.observe()

    def act(self, command: Command) -> None:
        validate_command(self.spec, command)
        if any(f.level >= FaultLevel.ERROR for f in self._faults):
            raise RuntimeError(f"ur5e: refusing a command while faulted: {self._faults}; reset()")
        if command.kind == CommandKind.EE_DELTA:
            values = np.asarray(command.values, float).copy()
        elif command.kind in (CommandKind.HOLD, CommandKind.DAMP):
            values = np.r_[np.zeros(6), float(self.controller.gripper_closed)]
        else:
            raise ValueError(f"ur5e accepts EE_DELTA, HOLD or DAMP commands, got {command.kind}")
        self._pending = values

    def _activate(self, values: np.ndarray) -> None:
        """Anchor the delta on the TCP pose measured when the command takes effect (as a driver
        converting a relative command to an absolute servoL target on reception would)."""
        pos, mat = self.controller.tcp_pose(self.data)
        pos, mat = self.controller.delta_target(pos, mat, values[:6])
        self.controller.set_target(pos, mat, bool(values[6] > 0.5))

    def step(self) -> Observation:
        m, d = self.model, self.data
        for i in range(self.n_substeps):
            if i == self.latency_steps and self._pending is not None:
                self._activate(self._pending)
                self._pending = None
            self.controller.physics_step(d)
            mujoco.mj_step(m, d)
        mujoco.mj_forward(m, d)
        self._check_faults()
        return self.observe()

    def observe(self) -> Observation:
        d = self.data
        ctl = self.controller
        q = d.qpos[ctl.qadr].astype(np.float32)
        qd = d.qvel[ctl.dadr].astype(np.float32)
        pos, mat = ctl.tcp_pose(d)
        grip = np.clip(d.qpos[self._grip_q] / self._grip_range, 0.0, 1.0)
        proprio = np.concatenate([q, qd, pos, mat[:, :2].T.reshape(6), [grip]]).astype(np.float32)
        privileged = {
            "tcp_pos": pos,
            "tcp_mat": mat,
            "gripper": np.array([grip]),
            "gripper_cmd": np.array([float(ctl.gripper_closed)]),
        }
        if self.objects is not None:
            privileged.update(self.objects.privileged(self.model, d))
        images = self.rig.render(d) if self.rig is not None else {}
        return Observation(
            stamp=float(d.time),
            proprio=proprio,
            images=images,
            joint_pos=q,
            joint_vel=qd,
            privileged=privileged,
        )

    def faults(self) -> list[Fault]:
        return list(self._faults)

    def close(self) -> None:
        for rig in (self.rig, self._mask_rig):
            if rig is not None:
                rig.close()

    # -- extras --------------------------------------------------------------------------
    def render_robot_mask(self, camera: str) -> np.ndarray:
        """(H, W) bool mask of the arm and gripper as seen by `camera` (current state)."""
        rig = self.rig or self._mask_rig
        if rig is None:  # a state-only backend: render anyway
            rig = self._mask_rig = CameraRig(self.model, (), self.scene_cfg.image_size)
        return rig.robot_mask(self.data, camera)

    def tracking_error(self) -> tuple[float, float]:
        """(m, rad) between the TCP and the active target."""
        pos, mat = self.controller.tcp_pose(self.data)
        return (
            float(np.linalg.norm(self.controller.target_pos - pos)),
            float(np.linalg.norm(rot_error(self.controller.target_mat, mat))),
        )

    def _check_faults(self) -> None:
        d = self.data
        if not (np.all(np.isfinite(d.qpos)) and np.all(np.isfinite(d.qvel))):
            self._faults = [
                Fault(
                    FaultLevel.ERROR,
                    "sim_diverged",
                    "simulation state is not finite; reset() the backend",
                )
            ]
            return
        err, _ = self.tracking_error()
        self._faults = (
            [
                Fault(
                    FaultLevel.WARN,
                    "tracking_error",
                    f"TCP is {err * 1000:.1f} mm from its target (contact or limits)",
                )
            ]
            if err > TRACKING_WARN_M
            else []
        )
