"""Privileged scripted experts for the UR5e insertion tasks, their degraded ladder, and V^e.

The expert reads `obs.privileged` (object and hole poses) and walks through phases:
approach above the grasp point (yaw aligned for the square peg) -> descend -> close ->
lift until the object's bottom is 3 cm above the hole -> carry, steering on the object's BOTTOM
and keeping it vertical -> lower to 4 mm above the hole, gated on xy error -> insert (xy
correction until the tip is inside, then push only) -> (table leg) thread: turn clockwise
while pressing. A lost object sends it back to the approach.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robot_drivers.interface import Observation
from robot_drivers.tasks.ur5e_tasks import UR5eInsertionTask
from robot_drivers.ur5e.so3 import mat_to_rotvec, rotvec_to_mat, rotz, wrap_angle

TCP_HOME_MAT = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # pointing down
APPROACH, DESCEND, CLOSE, LIFT, CARRY, LOWER, INSERT, THREAD = range(8)
PHASE_NAMES = ("approach", "descend", "close", "lift", "carry", "lower", "insert", "thread")


@dataclass(frozen=True)
class Degradation:
    """How a ladder rung departs from the expert (all zeros / ones = the expert)."""

    name: str = "expert"
    gain: float = 1.0  # scales every commanded step (slow, undershooting checkpoints)
    pos_jitter: float = 0.0  # m, Gaussian noise per axis per step
    rot_jitter: float = 0.0  # rad
    align_gate: float = 0.0004  # m: xy error allowed before pushing in
    stale_steps: int = 0  # acts on an observation this many steps old
    yaw_bias: float = 0.0  # rad added to the grasp yaw (a mis-learned alignment)


LADDER = (
    Degradation(),
    Degradation("ckpt_slow", gain=0.6, pos_jitter=0.0005),
    Degradation("ckpt_sloppy", gain=0.8, pos_jitter=0.0015, rot_jitter=0.01, align_gate=0.0015),
    Degradation("ckpt_stale", pos_jitter=0.002, rot_jitter=0.02, align_gate=0.002,
                stale_steps=1),
    Degradation("ckpt_clumsy", gain=0.5, pos_jitter=0.004, rot_jitter=0.04, align_gate=0.004,
                stale_steps=1, yaw_bias=np.radians(12.0)),
)


class InsertionExpert:
    """Phase-based privileged expert (a `Policy`); `degradation` makes a sub-optimal rung."""

    COARSE, FINE, ROT_CAP = 0.03, 0.012, 0.25  # step caps: m, m, rad
    CARRY_HEIGHT, HOVER = 0.03, 0.004  # bottom above the hole top while carrying / before entry

    def __init__(self, task: UR5eInsertionTask, degradation: Degradation = Degradation()):
        self.cfg = task.cfg
        self.deg = degradation
        self.name = degradation.name
        self.round_object = task.cfg.obj.shape == "cylinder"
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.phase = APPROACH
        self.phase_steps = 0
        self.grasp_yaw: float | None = None
        self._history: list[dict] = []

    # -- geometry helpers ----------------------------------------------------------------
    @staticmethod
    def _tcp_yaw(mat: np.ndarray) -> float:
        return float(np.arctan2(-mat[0, 0], mat[1, 0]))

    def _upright_correction(self, obj_mat: np.ndarray) -> np.ndarray:
        """World rotation that makes the object vertical and (square peg) yaw-aligned."""
        axis = obj_mat[:, 2]
        tilt_axis = np.cross(axis, [0.0, 0.0, 1.0])
        s = np.linalg.norm(tilt_axis)
        tilt = np.arctan2(s, axis[2])
        r_tilt = rotvec_to_mat(tilt_axis / s * tilt) if s > 1e-9 else np.eye(3)
        if self.round_object:
            return r_tilt
        upright = r_tilt @ obj_mat
        yaw = np.arctan2(upright[1, 0], upright[0, 0])
        return rotz(-wrap_angle(yaw, np.pi / 2)) @ r_tilt

    def _move(self, p: dict, pos_des: np.ndarray, mat_des: np.ndarray, cap: float,
              gripper: float) -> np.ndarray:
        dp = pos_des - p["tcp_pos"]
        n = np.linalg.norm(dp)
        if n > cap:
            dp *= cap / n
        dr = mat_to_rotvec(mat_des @ p["tcp_mat"].T)
        n = np.linalg.norm(dr)
        if n > self.ROT_CAP:
            dr *= self.ROT_CAP / n
        return np.concatenate([dp, dr, [gripper]])

    def _carry_target(self, p: dict, bottom_des: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """TCP pose that puts the held object's bottom at `bottom_des`, upright."""
        corr = self._upright_correction(p["obj_mat"])
        offset = p["obj_bottom"] - p["tcp_pos"]
        return bottom_des - corr @ offset, corr @ p["tcp_mat"]

    def _next(self, phase: int) -> None:
        self.phase, self.phase_steps = phase, 0

    # -- policy --------------------------------------------------------------------------
    def act(self, obs: Observation) -> np.ndarray:
        if obs.privileged is None:
            raise ValueError("the UR5e expert needs obs.privileged (simulation only)")
        self._history.append(obs.privileged)
        p = self._history[max(0, len(self._history) - 1 - self.deg.stale_steps)]
        self._history = self._history[-(self.deg.stale_steps + 1):]
        action = self._phase_action(p)
        self.phase_steps += 1
        d = self.deg
        action[:3] = d.gain * action[:3] + self.rng.normal(0.0, d.pos_jitter, 3) * (d.pos_jitter > 0)
        action[3:6] = d.gain * action[3:6] + self.rng.normal(0.0, d.rot_jitter, 3) * (d.rot_jitter > 0)
        return action.astype(np.float32)

    def _phase_action(self, p: dict) -> np.ndarray:
        c = self.cfg
        hole = p["hole"]
        held = (np.linalg.norm(p["tcp_pos"] - p["obj_grasp"]) < 0.02)
        if self.phase >= LIFT and not held:  # dropped it: start over with the gripper open
            self._next(APPROACH)
        if self.phase == APPROACH:
            if self.grasp_yaw is None or self.phase_steps == 0:
                self.grasp_yaw = self._grasp_yaw(p)
            mat = rotz(self.grasp_yaw) @ TCP_HOME_MAT
            target = p["obj_grasp"] + [0.0, 0.0, 0.06]
            err = target - p["tcp_pos"]
            yaw_err = abs(wrap_angle(self.grasp_yaw - self._tcp_yaw(p["tcp_mat"])))
            if np.linalg.norm(err[:2]) < 0.002 and abs(err[2]) < 0.005 and yaw_err < 0.02:
                self._next(DESCEND)
            return self._move(p, target, mat, self.COARSE, 0.0)
        if self.phase == DESCEND:
            mat = rotz(self.grasp_yaw) @ TCP_HOME_MAT
            target = p["obj_grasp"]
            if np.linalg.norm(target - p["tcp_pos"]) < 0.002:
                self._next(CLOSE)
            return self._move(p, target, mat, self.FINE, 0.0)
        if self.phase == CLOSE:
            if self.phase_steps >= 2:
                self._next(LIFT)
            return np.r_[np.zeros(6), 1.0]
        if self.phase == LIFT:
            bottom_des = np.r_[p["obj_bottom"][:2], hole[2] + self.CARRY_HEIGHT]
            if p["obj_bottom"][2] > hole[2] + self.CARRY_HEIGHT - 0.005:
                self._next(CARRY)
            return self._move(p, bottom_des - (p["obj_bottom"] - p["tcp_pos"]), p["tcp_mat"],
                              self.COARSE, 1.0)
        if self.phase in (CARRY, LOWER):
            height = self.CARRY_HEIGHT if self.phase == CARRY else self.HOVER
            bottom_des = np.r_[hole[:2], hole[2] + height]
            pos, mat = self._carry_target(p, bottom_des)
            xy_err = np.linalg.norm(p["obj_bottom"][:2] - hole[:2])
            z_err = abs(p["obj_bottom"][2] - bottom_des[2])
            if self.phase == CARRY and xy_err < 0.002 and z_err < 0.005:
                self._next(LOWER)
            elif self.phase == LOWER and xy_err < self.deg.align_gate and z_err < 0.001:
                self._next(INSERT)
            return self._move(p, pos, mat, self.COARSE if self.phase == CARRY else self.FINE, 1.0)
        if self.phase == INSERT:
            if self.round_object and p["seated"][0] > 0.5:
                self._next(THREAD)
            if p["obj_bottom"][2] > hole[2] - 0.0004:  # not in yet: keep correcting xy
                pos, mat = self._carry_target(p, np.r_[hole[:2], p["obj_bottom"][2] - 0.004])
                return self._move(p, pos, mat, self.FINE, 1.0)
            return np.r_[0.0, 0.0, -0.01, 0.0, 0.0, 0.0, 1.0]
        # THREAD: clockwise from above (negative world z rotation) while pressing down
        return np.r_[0.0, 0.0, -0.003, 0.0, 0.0, -self.ROT_CAP, 1.0]

    def _grasp_yaw(self, p: dict) -> float:
        tcp_yaw = self._tcp_yaw(p["tcp_mat"])
        if self.round_object:
            return tcp_yaw + self.deg.yaw_bias
        obj_yaw = np.arctan2(p["obj_mat"][1, 0], p["obj_mat"][0, 0])
        return tcp_yaw + wrap_angle(obj_yaw - tcp_yaw, np.pi / 2) + self.deg.yaw_bias


def expert_ladder(task: UR5eInsertionTask) -> list[InsertionExpert]:
    """The expert and K=4 degraded checkpoints, best to worst (see LADDER)."""
    return [InsertionExpert(task, d) for d in LADDER]


def make_expert(task: UR5eInsertionTask) -> InsertionExpert:
    return InsertionExpert(task)


def rollout(task: UR5eInsertionTask, policy, seed: int) -> dict:
    """Run one episode; returns privileged states, rewards, success, length."""
    obs = task.reset(seed)
    policy.reset(seed)
    states, rewards = [obs.privileged], []
    success = False
    for _ in range(task.max_steps):
        res = task.step(policy.act(obs))
        obs = res.obs
        rewards.append(res.reward)
        states.append(obs.privileged)
        if res.terminated or res.truncated:
            success = res.success
            break
    return {"states": states, "rewards": np.asarray(rewards), "success": success,
            "steps": len(rewards)}


def expert_value(task: UR5eInsertionTask):
    from robot_drivers.experts.value import fitted_value
    return fitted_value(task)


__all__ = ["Degradation", "InsertionExpert", "LADDER", "PHASE_NAMES", "expert_ladder",
           "expert_value", "make_expert", "rollout"]
