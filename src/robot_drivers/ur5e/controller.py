"""servoL-like Cartesian controller: a world-frame pose target tracked by damped-least-squares IK.

The IK integrates a commanded joint vector q_cmd (a reference trajectory, as the UR controller
does); the menagerie position servos track it. `ctrl = q_cmd + (kv/kp) qdot_cmd` is a velocity
feed-forward that cancels the servos' built-in damping, without which they lag ~0.2 s x speed.
"""

from __future__ import annotations

import mujoco
import numpy as np

from robot_drivers.ur5e.config import HOME_QPOS, ControllerConfig
from robot_drivers.ur5e.scene import ARM_JOINTS, GRIPPER_PREFIX, TCP_SITE
from robot_drivers.ur5e.so3 import rot_error, rotvec_to_mat

ARM_ACTUATORS = ("shoulder_pan", "shoulder_lift", "elbow", "wrist_1", "wrist_2", "wrist_3")
GRIPPER_ACTUATOR = GRIPPER_PREFIX + "fingers_actuator"


class CartesianController:
    """Owns the arm and gripper actuators of one MjData; `physics_step` runs once per mj_step."""

    def __init__(self, model: mujoco.MjModel, cfg: ControllerConfig):
        self.model, self.cfg = model, cfg
        joints = [model.joint(n) for n in ARM_JOINTS]
        self.qadr = np.array([j.qposadr[0] for j in joints])
        self.dadr = np.array([j.dofadr[0] for j in joints])
        self.act = np.array([model.actuator(n).id for n in ARM_ACTUATORS])
        self.grip_act = model.actuator(GRIPPER_ACTUATOR).id
        self.tcp = model.site(TCP_SITE).id
        lim = np.array([j.range for j in joints])
        self.q_lo = lim[:, 0] + cfg.joint_limit_margin
        self.q_hi = lim[:, 1] - cfg.joint_limit_margin
        self.home = np.asarray(HOME_QPOS)
        # The controller believes the nominal servo ratio kv/kp (a "real" gain change breaks it).
        kp = model.actuator_gainprm[self.act, 0]
        kv = -model.actuator_biasprm[self.act, 2]
        self.ff_ratio = kv / kp
        self.ik_every = max(1, round(1.0 / (cfg.ik_hz * model.opt.timestep)))
        self.kin = mujoco.MjData(model)  # kinematics of q_cmd, separate from the physics state
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))
        self.q_cmd = self.home.copy()
        self.qd_cmd = np.zeros(6)
        self.target_pos = np.zeros(3)
        self.target_mat = np.eye(3)
        self.gripper_closed = False
        self._tick = 0

    # -- targets -------------------------------------------------------------------------
    def tcp_pose(self, data: mujoco.MjData) -> tuple[np.ndarray, np.ndarray]:
        """Measured TCP position and rotation matrix (data must be forwarded)."""
        return data.site_xpos[self.tcp].copy(), data.site_xmat[self.tcp].reshape(3, 3).copy()

    def reset(self, data: mujoco.MjData) -> None:
        self.q_cmd = data.qpos[self.qadr].copy()
        self.qd_cmd = np.zeros(6)
        self.target_pos, self.target_mat = self.tcp_pose(data)
        self.gripper_closed = False
        self._tick = 0
        self._write_ctrl(data)

    def delta_target(self, pos: np.ndarray, mat: np.ndarray, delta: np.ndarray) -> tuple:
        """World-frame delta [dx dy dz rx ry rz] applied to a measured pose (rotation on the
        left), norms clipped to the per-step limits."""
        cfg = self.cfg
        dp = np.asarray(delta[:3], float)
        dr = np.asarray(delta[3:6], float)
        n = np.linalg.norm(dp)
        if n > cfg.max_step_pos:
            dp = dp * (cfg.max_step_pos / n)
        n = np.linalg.norm(dr)
        if n > cfg.max_step_rot:
            dr = dr * (cfg.max_step_rot / n)
        return pos + dp, rotvec_to_mat(dr) @ mat

    def set_target(self, pos: np.ndarray, mat: np.ndarray, gripper_closed: bool) -> None:
        self.target_pos, self.target_mat = np.asarray(pos, float), np.asarray(mat, float)
        self.gripper_closed = bool(gripper_closed)

    # -- tracking ------------------------------------------------------------------------
    def physics_step(self, data: mujoco.MjData) -> None:
        """Update q_cmd (IK every `ik_every` steps, integrate in between) and write ctrl."""
        if self._tick % self.ik_every == 0:
            self.qd_cmd = self._ik_velocity()
        self._tick += 1
        dt = self.model.opt.timestep
        q_next = np.clip(self.q_cmd + self.qd_cmd * dt, self.q_lo, self.q_hi)
        self.qd_cmd = (q_next - self.q_cmd) / dt
        self.q_cmd = q_next
        self._write_ctrl(data)

    def _write_ctrl(self, data: mujoco.MjData) -> None:
        ff = self.ff_ratio * self.qd_cmd if self.cfg.feedforward else 0.0
        data.ctrl[self.act] = self.q_cmd + ff
        data.ctrl[self.grip_act] = self.cfg.gripper_close if self.gripper_closed else 0.0

    def _ik_velocity(self) -> np.ndarray:
        cfg, m, kin = self.cfg, self.model, self.kin
        kin.qpos[self.qadr] = self.q_cmd
        mujoco.mj_kinematics(m, kin)
        mujoco.mj_comPos(m, kin)
        pos = kin.site_xpos[self.tcp]
        mat = kin.site_xmat[self.tcp].reshape(3, 3)
        v_lin = cfg.kp * (self.target_pos - pos)
        v_ang = cfg.kp * rot_error(self.target_mat, mat)
        n = np.linalg.norm(v_lin)
        if n > cfg.max_lin_vel:
            v_lin *= cfg.max_lin_vel / n
        n = np.linalg.norm(v_ang)
        if n > cfg.max_ang_vel:
            v_ang *= cfg.max_ang_vel / n
        mujoco.mj_jacSite(m, kin, self._jacp, self._jacr, self.tcp)
        jac = np.vstack([self._jacp[:, self.dadr], self._jacr[:, self.dadr]])
        sigma_min = np.linalg.svd(jac, compute_uv=False)[-1]
        lam = cfg.damping + 2.0 * max(0.0, cfg.singular_threshold - sigma_min)
        jjt = jac @ jac.T + lam**2 * np.eye(6)
        pinv = jac.T @ np.linalg.inv(jjt)
        qd = pinv @ np.concatenate([v_lin, v_ang])
        qd += (np.eye(6) - pinv @ jac) @ (cfg.nullspace_gain * (self.home - self.q_cmd))
        peak = np.max(np.abs(qd))
        if peak > cfg.max_joint_vel:
            qd *= cfg.max_joint_vel / peak
        return qd
