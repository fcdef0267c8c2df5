"""Privileged scripted experts for the UR5e insertion tasks, their degraded ladder, and V^e.

The expert reads `obs.privileged` (object and hole poses) and walks through phases: approach
above the grasp point -> descend -> close (held a fixed count of steps, in which the pads turn
the square peg square to the hand) -> lift until the object's bottom is 3 cm above the hole ->
carry, steering on the object's BOTTOM and keeping it vertical -> lower to 4 mm above the hole,
gated on xy error -> insert (xy correction until the tip is inside, then push only; stalled on
the fixture, a spiral search about the hole) -> (table leg) thread: turn clockwise while
pressing. A lost object sends it back to the approach. The expert's hole estimate is off by
EXPERT_HOLE_ERROR per episode, so its data holds searches (see LADDER).

The hand keeps its yaw. Turning it to the peg's yaw first (as the expert of UR5E_PEG_NOTES does)
makes every approach action depend on a yaw that a 64 x 64 image cannot show, so a policy
distilled from it cannot tell when to close (docs/notebook/peg_wide.md). Instead the closing
pads turn the standing peg square (up to 12 control steps at +-30 deg; a peg caught on its edges
stays so), and the expert holds still and closed for a fixed CLOSE_STEPS before it lifts.
Lifting when the privileged state showed the peg square (with a gripper reading in a band 0.005
wide) made the lift depend on a reading the learned latent did not keep, and the distilled
policy lifted at every reading alike; a fixed count is in the action history that a policy with
H > CLOSE_STEPS sees (`ur5e_small_config`). Lifting a peg that is not square yet lets it slide
1-2 cm along the pads, and tilts it. For the same reason it closes on the step that finds the
hand at the grasp point: one more still step with the gripper open made the open and the closing
state alike, and the distilled policy hovered there at a closing command of 0.4.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from dataclasses import dataclass

import numpy as np

from robot_drivers.cache import cache_dir, save_npz_atomic
from robot_drivers.interface import Observation
from robot_drivers.tasks.options import Ur5eOptions
from robot_drivers.tasks.ur5e_tasks import GAMMA, UR5eInsertionTask, make_ur5e_task
from robot_drivers.ur5e.so3 import mat_to_rotvec, rotvec_to_mat, rotz, tcp_yaw, wrap_angle

TCP_HOME_MAT = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, -1.0]])  # pointing down
APPROACH, DESCEND, CLOSE, LIFT, CARRY, LOWER, INSERT, THREAD = range(8)
PHASE_NAMES = (
    "approach",
    "descend",
    "close",
    "lift",
    "carry",
    "lower",
    "insert",
    "thread",
)


@dataclass(frozen=True)
class Degradation:
    """How a ladder rung departs from exact privileged control (the defaults)."""

    name: str = "expert"
    gain: float = 1.0  # scales every commanded step (slow, undershooting checkpoints)
    pos_jitter: float = 0.0  # m, Gaussian noise per axis per step
    rot_jitter: float = 0.0  # rad
    align_gate: float = 0.0004  # m: xy error allowed before pushing in
    stale_steps: int = 0  # acts on an observation this many steps old
    yaw_bias: float = 0.0  # rad added to the grasp yaw (a mis-learned alignment)
    hole_error: float = 0.0  # m, std per axis of a per-episode error in the hole's xy estimate


# The expert's own hole estimate is off by about what a learned latent resolves (a few mm,
# docs/notebook/peg_wide.md), so the data shows the spiral search that recovers from a
# missed hole; an exact expert never misses, and a policy distilled from it presses beside the
# hole for good. A larger error (3 mm) makes the searches longer and pi worse.
EXPERT_HOLE_ERROR = 0.0015  # m

LADDER = (
    Degradation(hole_error=EXPERT_HOLE_ERROR),
    Degradation("ckpt_slow", gain=0.6, pos_jitter=0.0005),
    Degradation("ckpt_sloppy", gain=0.8, pos_jitter=0.0015, rot_jitter=0.01, align_gate=0.0015),
    Degradation(
        "ckpt_stale", gain=0.5, pos_jitter=0.002, rot_jitter=0.02, align_gate=0.002, stale_steps=1
    ),
    Degradation(
        "ckpt_clumsy",
        gain=0.5,
        pos_jitter=0.004,
        rot_jitter=0.04,
        align_gate=0.004,
        stale_steps=1,
        yaw_bias=np.radians(12.0),
    ),
)


class InsertionExpert:
    """Phase-based privileged expert (a `Policy`); `degradation` makes a sub-optimal rung."""

    COARSE, FINE, ROT_CAP = 0.03, 0.012, 0.25  # step caps: m, m, rad
    CARRY_HEIGHT, HOVER = 0.03, 0.004  # bottom above the hole top while carrying / before entry
    # Still, closed steps before the lift: the square peg is square by then on 37 of 40 Wide seeds
    # (the rest stay caught on their edges); the round table leg needs no turning.
    CLOSE_STEPS, CLOSE_STEPS_ROUND = 11, 1
    # Insertion: the bottom this far below the hole top is in; after STALL_STEPS not in, search
    # on a spiral (SPIRAL_RATE rad per step), pressing the bottom only SEARCH_PRESS below the
    # top (a deeper press drags a half-entered peg out again; UR5E_PEG_NOTES).
    ENTERED, STALL_STEPS, SPIRAL_RATE, SEARCH_PRESS, MIN_PITCH = 0.0004, 3, 0.8, 0.001, 0.0005
    # A peg slipped up to SLIPPED from the grasp point is still held while the gripper reads
    # under EMPTY_READING (closed on nothing it reads 0.978, on the peg 0.77-0.90): opening it
    # there dropped pegs that noise bursts had shifted in the pads, mostly onto their sides.
    SLIPPED, EMPTY_READING = 0.04, 0.95

    def __init__(self, task: UR5eInsertionTask, degradation: Degradation = Degradation()):
        self.cfg = task.cfg
        self.deg = degradation
        self.name = degradation.name
        self.round_object = task.cfg.obj.shape == "cylinder"
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.hole_offset = np.r_[self.rng.normal(0.0, self.deg.hole_error, 2), 0.0]
        self.phase = APPROACH
        self.phase_steps = 0
        self.grasp_yaw: float | None = None
        self._history: list[dict] = []

    # -- geometry helpers ----------------------------------------------------------------
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

    def _move(
        self,
        p: dict,
        pos_des: np.ndarray,
        mat_des: np.ndarray,
        cap: float,
        gripper: float,
        rot_cap: float | None = None,
    ) -> np.ndarray:
        dp = pos_des - p["tcp_pos"]
        n = np.linalg.norm(dp)
        if n > cap:
            dp *= cap / n
        dr = mat_to_rotvec(mat_des @ p["tcp_mat"].T)
        n, rot_cap = np.linalg.norm(dr), self.ROT_CAP if rot_cap is None else rot_cap
        if n > rot_cap:
            dr *= rot_cap / n
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
        self._history = self._history[-(self.deg.stale_steps + 1) :]
        action = self._phase_action(p)
        self.phase_steps += 1
        d = self.deg
        action[:3] = d.gain * action[:3] + self.rng.normal(0.0, d.pos_jitter, 3)
        action[3:6] = d.gain * action[3:6] + self.rng.normal(0.0, d.rot_jitter, 3)
        return action.astype(np.float32)

    def _phase_action(self, p: dict) -> np.ndarray:
        c = self.cfg
        hole = p["hole"] + self.hole_offset  # the expert's estimate (exact unless hole_error)
        gap = np.linalg.norm(p["tcp_pos"] - p["obj_grasp"])
        # slipped in the grasp but still between the pads (they stop short of closing on nothing)
        held = gap < 0.02 or (gap < self.SLIPPED and p["gripper"][0] < self.EMPTY_READING)
        if self.phase >= LIFT and not held:  # dropped it: start over with the gripper open
            self._next(APPROACH)
        if self.phase == APPROACH:
            if self.grasp_yaw is None or self.phase_steps == 0:
                self.grasp_yaw = self._grasp_yaw(p)
            mat = rotz(self.grasp_yaw) @ TCP_HOME_MAT
            target = p["obj_grasp"] + [0.0, 0.0, 0.06]
            err = target - p["tcp_pos"]
            yaw_err = abs(wrap_angle(self.grasp_yaw - tcp_yaw(p["tcp_mat"])))
            if np.linalg.norm(err[:2]) < 0.002 and abs(err[2]) < 0.005 and yaw_err < 0.02:
                self._next(DESCEND)
            return self._move(p, target, mat, self.COARSE, 0.0)
        if self.phase == DESCEND:
            assert self.grasp_yaw is not None  # APPROACH, the only way into DESCEND, set it
            mat = rotz(self.grasp_yaw) @ TCP_HOME_MAT
            target = p["obj_grasp"]
            if np.linalg.norm(target - p["tcp_pos"]) >= 0.002:
                return self._move(p, target, mat, self.FINE, 0.0)
            self._next(CLOSE)  # close on the step that finds the hand there (see the docstring)
        if self.phase == CLOSE:
            if self.phase_steps < (
                self.CLOSE_STEPS_ROUND if self.round_object else self.CLOSE_STEPS
            ):
                return np.r_[np.zeros(6), 1.0]
            # re-grasped inside the hole: carry on from there
            inside = p["depth"][0] > 0.002 and p["xy_err"][0] < c.success_xy
            self._next(INSERT if inside else LIFT)
        if self.phase == LIFT:
            bottom_des = np.r_[p["obj_bottom"][:2], hole[2] + self.CARRY_HEIGHT]
            if p["obj_bottom"][2] > hole[2] + self.CARRY_HEIGHT - 0.005:
                self._next(CARRY)
            return self._move(
                p, bottom_des - (p["obj_bottom"] - p["tcp_pos"]), p["tcp_mat"], self.COARSE, 1.0
            )
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
            if p["obj_bottom"][2] > hole[2] - self.ENTERED:  # not in yet
                if self.phase_steps < self.STALL_STEPS:  # straight in, correcting xy
                    bottom_des = np.r_[hole[:2], p["obj_bottom"][2] - 0.004]
                else:  # stalled on the fixture: the hole is not where we think
                    bottom_des = np.r_[
                        hole[:2] + self._spiral(self.phase_steps - self.STALL_STEPS),
                        hole[2] - self.SEARCH_PRESS,
                    ]
                pos, mat = self._carry_target(p, bottom_des)
                return self._move(p, pos, mat, self.FINE, 1.0)
            return np.r_[0.0, 0.0, -0.01, 0.0, 0.0, 0.0, 1.0]
        # THREAD: turn clockwise from above (negative world z rotation) holding the grasp
        # height on the seated leg (pushing a position-controlled arm down slides the pads)
        seated_grasp_z = hole[2] - c.fixture.height + 2 * c.obj.half_length - c.grasp_below_top
        dz = seated_grasp_z - 0.001 - p["tcp_pos"][2]
        return np.r_[0.0, 0.0, dz, 0.0, 0.0, -self.ROT_CAP, 1.0]

    def _spiral(self, k: int) -> np.ndarray:
        """xy offset of search step k: an Archimedean spiral whose pitch just exceeds the hole's
        clearance, so a peg within the searched radius drops in (UR5E_PEG_NOTES)."""
        pitch = max(1.2 * self.cfg.fixture.clearance, self.MIN_PITCH)
        theta = self.SPIRAL_RATE * k
        return pitch * theta / (2 * np.pi) * np.r_[np.cos(theta), np.sin(theta)]

    def _grasp_yaw(self, p: dict) -> float:
        """The hand's own yaw (see the module docstring), off by the rung's bias."""
        return tcp_yaw(p["tcp_mat"]) + self.deg.yaw_bias


def expert_ladder(task: UR5eInsertionTask) -> list[InsertionExpert]:
    """The expert and K=4 degraded checkpoints, best to worst (see LADDER).

    The round table leg's expert keeps the exact hole: entering off-centre, its threading
    failed 6 of 50 Wide episodes with a 1.5 mm estimate error (docs/ur5e_sim.md)."""
    rungs = list(LADDER)
    if task.cfg.obj.shape == "cylinder":
        rungs[0] = dataclasses.replace(rungs[0], hole_error=0.0)
    return [InsertionExpert(task, d) for d in rungs]


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
    return {
        "states": states,
        "rewards": np.asarray(rewards),
        "success": success,
        "steps": len(rewards),
    }


# -- V^e: ridge regression on random Fourier features of the privileged state ---------------

VALUE_VERSION = 6


@dataclass(frozen=True)
class ValueFitConfig:
    """How V^e is fitted (random-Fourier-feature ridge regression); part of the cache key."""

    episodes: int = 40  # expert rollouts on the Wide region (half with an early noise burst)
    holdout: float = 0.2  # fraction of episodes held out for the reported error
    features: int = 512  # random Fourier features (plus the linear terms)
    bandwidth: float = 4.0  # RBF length scale on standardised inputs
    ridge: float = 1e-2
    seed: int = 0


def value_features(priv: dict, cfg) -> np.ndarray:
    """Task-state features V^e reads (all privileged, in metres / radians / flags)."""
    grasped = float(
        np.linalg.norm(priv["tcp_pos"] - priv["obj_grasp"]) < 0.015 and priv["gripper_cmd"][0] > 0.5
    )
    twist = priv["twist"][0] / cfg.thread_turn if cfg.thread_turn > 0 else 0.0
    return np.concatenate(
        [
            (priv["tcp_pos"] - priv["obj_grasp"]) * 10.0,
            (priv["obj_bottom"] - priv["hole"]) * 10.0,
            [
                priv["depth"][0] / cfg.success_depth,
                priv["xy_err"][0] * 100.0,
                grasped,
                priv["gripper"][0],
                priv["gripper_cmd"][0],
                priv["tilt"][0],
                twist,
                priv["seated"][0],
            ],
            priv["obj_vel"] * 10.0,
        ]
    ).astype(np.float64)


def discounted_returns(rewards: np.ndarray, success: bool, gamma: float = GAMMA) -> np.ndarray:
    """G_t for every state s_0..s_T of an episode. Success is absorbing with reward 1 per step
    (so a quick success is worth more than lingering); a failure or timeout adds nothing."""
    out = np.empty(len(rewards) + 1)
    out[-1] = 1.0 / (1.0 - gamma) if success else 0.0
    for t in range(len(rewards) - 1, -1, -1):
        out[t] = rewards[t] + gamma * out[t + 1]
    return out


class ExpertValue:
    """V^e(obs) -> float from obs.privileged; `metrics` holds the held-out error of the fit.

    Pure numpy (no torch), so it is cheap to call per step and safe in rendering processes."""

    def __init__(self, task_cfg, params: dict[str, np.ndarray], metrics: dict):
        self.task_cfg, self.params, self.metrics = task_cfg, params, metrics

    def _design(self, feats: np.ndarray) -> np.ndarray:
        p = self.params
        x = (np.atleast_2d(feats) - p["x_mean"]) / p["x_std"]
        rff = np.sqrt(2.0 / p["omega"].shape[1]) * np.cos(x @ p["omega"] + p["phase"])
        return np.hstack([rff, x, np.ones((len(x), 1))])

    def predict(self, feats: np.ndarray) -> np.ndarray:
        p = self.params
        return self._design(feats) @ p["w"] * p["y_std"] + p["y_mean"]

    def __call__(self, obs: Observation) -> float:
        if obs.privileged is None:
            raise ValueError("V^e needs obs.privileged (simulation only)")
        return float(self.predict(value_features(obs.privileged, self.task_cfg))[0])


def _collect(task: UR5eInsertionTask, cfg: ValueFitConfig):
    # the exact expert: the data expert's hole-estimate error is hidden from the privileged
    # state, and a value fitted to its returns did worse than a constant on held-out episodes
    expert = InsertionExpert(task, Degradation())
    rng = np.random.default_rng(cfg.seed)
    episodes = []
    for ep in range(cfg.episodes):
        seed = 10_000 + cfg.seed * 1000 + ep
        obs = task.reset(seed)
        expert.reset(seed)
        burst = (rng.integers(0, 10), rng.integers(1, 6)) if ep % 2 else (0, 0)
        scale = rng.uniform(0.005, 0.02)
        feats, rewards, success = [value_features(obs.require_privileged(), task.cfg)], [], False
        for t in range(task.max_steps):
            a = expert.act(obs)
            if burst[0] <= t < burst[0] + burst[1]:
                a[:6] += rng.normal(0.0, scale, 6) * [1, 1, 1, 10, 10, 10]
            res = task.step(a)
            obs = res.obs
            feats.append(value_features(obs.require_privileged(), task.cfg))
            rewards.append(res.reward)
            if res.terminated or res.truncated:
                success = res.success
                break
        episodes.append((np.stack(feats), discounted_returns(np.asarray(rewards), success)))
    return episodes


def fit_value(task: UR5eInsertionTask, cfg: ValueFitConfig = ValueFitConfig()) -> ExpertValue:
    """Roll out the expert, fit on (1 - holdout) of the episodes, report the error on the rest."""
    episodes = _collect(task, cfg)
    n_hold = max(1, int(round(cfg.holdout * len(episodes))))
    train, hold = episodes[:-n_hold], episodes[-n_hold:]
    x = np.concatenate([e[0] for e in train])
    y = np.concatenate([e[1] for e in train])
    rng = np.random.default_rng(cfg.seed)
    params = {
        "x_mean": x.mean(0),
        "x_std": x.std(0) + 1e-6,
        "omega": rng.normal(0.0, 1.0 / cfg.bandwidth, (x.shape[1], cfg.features)),
        "phase": rng.uniform(0.0, 2 * np.pi, cfg.features),
        "y_mean": np.float64(y.mean()),
        "y_std": np.float64(y.std() + 1e-6),
    }
    value = ExpertValue(task.cfg, params, {})
    phi = value._design(x)
    target = (y - params["y_mean"]) / params["y_std"]
    gram = phi.T @ phi + cfg.ridge * len(x) / 100.0 * np.eye(phi.shape[1])
    params["w"] = np.linalg.solve(gram, phi.T @ target)
    xh = np.concatenate([e[0] for e in hold])
    yh = np.concatenate([e[1] for e in hold])
    err = value.predict(xh) - yh
    value.metrics = {
        "heldout_rmse": float(np.sqrt(np.mean(err**2))),
        "heldout_mae": float(np.mean(np.abs(err))),
        "heldout_return_std": float(yh.std()),
        "heldout_states": int(len(yh)),
        "train_states": int(len(y)),
        "episodes": len(episodes),
    }
    return value


def _cache_path(task_cfg, cfg: ValueFitConfig) -> pathlib.Path:
    key = hashlib.sha256(repr((VALUE_VERSION, task_cfg, cfg)).encode()).hexdigest()[:16]
    return cache_dir() / f"ur5e_value_{task_cfg.name}_{key}.npz"


def expert_value(task: UR5eInsertionTask, cfg: ValueFitConfig = ValueFitConfig()) -> ExpertValue:
    """V^e of the task's exact SIM expert (Wide region), fitted once and cached as an .npz file."""

    sim = make_ur5e_task(task.name, "sim", Ur5eOptions(region="wide", cameras=()))
    path = _cache_path(sim.cfg, cfg)
    if path.exists():
        with np.load(path, allow_pickle=False) as f:
            params = {k: f[k] for k in f.files if k != "metrics"}
            metrics = json.loads(str(f["metrics"]))
        sim.close()
        return ExpertValue(sim.cfg, params, metrics)
    value = fit_value(sim, cfg)
    sim.close()
    save_npz_atomic(path, metrics=np.array(json.dumps(value.metrics)), **value.params)
    return value


__all__ = [
    "Degradation",
    "ExpertValue",
    "InsertionExpert",
    "LADDER",
    "PHASE_NAMES",
    "ValueFitConfig",
    "discounted_returns",
    "expert_ladder",
    "expert_value",
    "fit_value",
    "rollout",
    "value_features",
]
