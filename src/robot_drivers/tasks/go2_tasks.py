"""Go2 tasks: velocity tracking on flat ground and slopes, and the two hardware stand-ins.

| task | variant "sim" | variant "real" (hardware stand-in) |
|---|---|---|
| go2_flat | flat floor, walk: no fall, speed over the last 8 s within 0.2 m/s of vx | - |
| go2_slope | panels 3.0 deg + 5.7 deg, nominal friction; success 1.82 m | - (slippery_slope) |
| slippery_slope | same course as go2_slope | PTFE-like panels (`SLIPPERY_SLOPE_GAP`); 1.82 m |
| foam | two overlapping 5 cm rigid pads | compliant foam pads (`FOAM_GAP`); success 3.00 m |

The reward is the official task's velocity-tracking terms plus its base-stability penalties, from
privileged state, scaled by the control period as IsaacLab's reward manager does. The command
holds the start heading (the official WalkStraightCommand's yaw feedback) so that long straight
runs stay straight: wz = wz_cmd + heading_gain * wrap(heading_ref - yaw).

A course's episode limit follows its commanded speed: `COURSE_TIME_FACTOR` (2.5) x the course's
success distance / vx, so a robot walking at the commanded speed has 2.5 times the time it needs
(Slippery Slope: 9.1 s at 0.5 m/s, 15.2 s at 0.3, 45.5 s at 0.1). `make_go2_task` takes the two
settings the paper varies as task options (`Go2Options`, robot_drivers.tasks.options): `speed`
(the commanded vx; the paper's speeds per course are `PAPER_SPEEDS`) and, for the Slippery Slope
stand-in, `panel_friction` (the PTFE panels' friction, `SLIPPERY_SLOPE_GAP`'s 0.15 by default).

Every step reports `speed`: the mean forward speed along the start heading over the last
`speed_window_s` (or the whole episode while it is shorter). On go2_flat success means walking:
no fall (which includes base or thigh contact) for the whole episode and `speed` within
`walk_tolerance` of the commanded vx at its end.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from robot_drivers.go2.backend import MujocoGo2Backend
from robot_drivers.go2.config import Go2Config
from robot_drivers.go2.observation import PROPRIO_SLICES
from robot_drivers.go2.scene import SlopePanel, TerrainConfig
from robot_drivers.interface import Command, CommandKind, Observation
from robot_drivers.tasks.base import Policy, StepResult, Task
from robot_drivers.tasks.options import Go2Options

# The commanded forward speeds of the paper's real-world trials (m/s), five trials each.
PAPER_SPEEDS = {"slippery_slope": (0.1, 0.3, 0.5), "foam": (0.2, 0.7, 1.2)}
# A course's episode limit: this many times the time its success distance takes at the command.
COURSE_TIME_FACTOR = 2.5
FREE_EPISODE_S = 20.0  # the episode limit of a task without a success distance (go2_flat)


@dataclass(frozen=True)
class Go2RewardConfig:
    """Weights of the official Go2 velocity task terms (IsaacLab Go2 rough config + SimDist)."""

    track_lin_vel_xy: float = 1.5  # exp(-|v_xy* - v_xy|^2 / std^2)
    track_ang_vel_z: float = 0.75  # exp(-(wz* - wz)^2 / std^2)
    tracking_std: float = 0.5  # sqrt(0.25)
    lin_vel_z: float = -2.0  # vz^2
    ang_vel_xy: float = -0.05  # |w_xy|^2
    flat_orientation: float = -4.0  # |g_xy|^2 (SimDist's weight)
    joint_torques: float = -2e-4  # |tau|^2
    action_rate: float = -0.01  # |a_t - a_{t-1}|^2
    hip_deviation: float = -0.25  # sum |q_hip - q_hip_default| (SimDist)


@dataclass(frozen=True)
class Go2Gap:
    """A documented set of changes that turns a sim course into its hardware stand-in."""

    name: str
    description: str
    panel_friction: float | None = None  # replaces the slope panels' friction
    pad_solref: tuple[float, float] | None = None  # soft foam contact (time constant, damping)
    pad_solimp: tuple[float, ...] | None = None

    def apply(self, terrain: TerrainConfig) -> TerrainConfig:
        changes: dict[str, Any] = {}
        if self.panel_friction is not None:
            changes["panel_friction"] = self.panel_friction
        if self.pad_solref is not None:
            changes["pad_solref"] = self.pad_solref
        if self.pad_solimp is not None:
            changes["pad_solimp"] = self.pad_solimp
        return dataclasses.replace(terrain, **changes)


SLIPPERY_SLOPE_GAP = Go2Gap(
    name="slippery_slope",
    description="PTFE sheets on both panels: foot-panel friction 0.8 -> 0.15 (rubber on PTFE; "
    "1.5x the 0.10 needed to stand on the 5.7 deg panel). Geometry is unchanged, so "
    "the height scan cannot see the difference.",
    panel_friction=0.15,
)
FOAM_GAP = Go2Gap(
    name="foam",
    description="memory foam instead of rigid pads: soft contact (solref time constant 0.04 s, "
    "damping ratio 1; solimp 0.5 -> 0.95 over 4 cm) lets a standing foot sink about "
    "2.5 cm below the surface the height scan reports.",
    pad_solref=(0.04, 1.0),
    pad_solimp=(0.5, 0.95, 0.04, 0.5, 2.0),
)

SLOPE_COURSE = TerrainConfig(
    panels=(SlopePanel(1.0, 3.0), SlopePanel(1.2, 5.7)),
    panels_start_x=0.4,
    plateau_length=10.0,
)
FOAM_COURSE = TerrainConfig(pads_start_x=(0.5, 1.5), pad_length=1.5, pad_thickness=0.05)


@dataclass(frozen=True)
class Go2Course:
    """What makes one Go2 task: its ground, its success test and its hardware stand-in."""

    terrain: TerrainConfig = TerrainConfig()
    success_distance: float | None = None  # m along the start heading; None: survive / walk
    walk_tolerance: float | None = None  # with no distance: |speed - vx| at the end (None: survive)
    real_gap: Go2Gap | None = None  # the "real" variant's changes; None: no "real" variant


# The Go2 tasks, one course each: the one table make_go2_task builds from (a new Go2 task is a
# row here and an entry in robot_drivers.registry.TASKS; docs/extending.md).
GO2_COURSES: dict[str, Go2Course] = {
    "go2_flat": Go2Course(walk_tolerance=0.2),
    "go2_slope": Go2Course(SLOPE_COURSE, success_distance=1.82),
    "slippery_slope": Go2Course(SLOPE_COURSE, success_distance=1.82, real_gap=SLIPPERY_SLOPE_GAP),
    "foam": Go2Course(FOAM_COURSE, success_distance=3.0, real_gap=FOAM_GAP),
}


@dataclass(frozen=True)
class Go2TaskConfig:
    """One Go2 task; `make_go2_task(..., **overrides)` replaces any of these fields."""

    terrain: TerrainConfig = TerrainConfig()
    gap: Go2Gap | None = None
    command: tuple[float, float, float] = (0.5, 0.0, 0.0)  # vx, vy (m/s), wz (rad/s)
    command_ranges: tuple[tuple[float, float], ...] | None = None  # per-episode U(lo, hi) per axis
    # per-episode foot-ground friction U(lo, hi) (data generation); None keeps the scene's values
    friction_range: tuple[float, float] | None = None
    heading_gain: float = 1.0  # yaw feedback; 0 disables
    max_wz: float = 1.0  # the trained yaw-rate range
    # None: COURSE_TIME_FACTOR x success_distance / vx on a course, else FREE_EPISODE_S
    episode_s: float | None = None
    success_distance: float | None = None  # m along the start heading; None = survive the episode
    # With success_distance None: also |speed - vx| <= walk_tolerance at the end (None = survive)
    walk_tolerance: float | None = None
    speed_window_s: float = 8.0  # window of the reported mean forward speed
    go2: Go2Config = Go2Config()
    reward: Go2RewardConfig = Go2RewardConfig()

    def __post_init__(self) -> None:
        if len(self.command) != 3 or not np.all(np.isfinite(self.command)):
            raise ValueError(f"command must be 3 finite values (vx, vy, wz), got {self.command}")
        if self.command_ranges is not None and (
            len(self.command_ranges) != 3 or any(lo > hi for lo, hi in self.command_ranges)
        ):
            raise ValueError(f"command_ranges must be 3 (lo, hi) pairs, got {self.command_ranges}")
        if self.friction_range is not None and (
            len(self.friction_range) != 2
            or not 0 < self.friction_range[0] <= self.friction_range[1]
        ):
            raise ValueError(
                f"friction_range must be (lo, hi) with 0 < lo <= hi, got {self.friction_range}"
            )
        if (self.episode_s is not None and self.episode_s <= 0) or self.heading_gain < 0:
            raise ValueError("episode_s must be > 0 (or None) and heading_gain >= 0")
        if self.episode_s is None and self.success_distance is not None and self.command[0] <= 0:
            raise ValueError(
                f"a course's episode limit follows the commanded speed, which must be > 0; got "
                f"vx={self.command[0]} (give episode_s to run it anyway)"
            )
        if self.speed_window_s <= 0 or (
            self.walk_tolerance is not None and self.walk_tolerance <= 0
        ):
            raise ValueError("speed_window_s and walk_tolerance must be > 0")

    @property
    def episode_seconds(self) -> float:
        """The episode limit (s): episode_s, else derived from the course and the command."""
        if self.episode_s is not None:
            return self.episode_s
        if self.success_distance is not None:
            return COURSE_TIME_FACTOR * self.success_distance / self.command[0]
        return FREE_EPISODE_S


def _wrap(a: float) -> float:
    return float(np.arctan2(np.sin(a), np.cos(a)))


class Go2Task(Task):
    """Velocity tracking with privileged reward, a fall test and a distance / survival success."""

    backend: MujocoGo2Backend

    def __init__(self, name: str, variant: str, config: Go2TaskConfig):
        self.name, self.variant, self.config = name, variant, config
        terrain = config.gap.apply(config.terrain) if config.gap else config.terrain
        self.backend = MujocoGo2Backend(config.go2, terrain)
        self.max_steps = int(round(config.episode_seconds / config.go2.control_dt))
        self._base_command = np.asarray(config.command, dtype=np.float64)
        self._obs: Observation | None = None

    def hold_action(self, obs: Observation) -> np.ndarray:
        """Action 0: stand at the default pose."""
        return np.zeros(12)

    def reset(self, seed: int | None = None) -> Observation:
        rng = np.random.default_rng(seed)
        cfg = self.config
        if cfg.command_ranges is not None:
            self._base_command = np.array([rng.uniform(lo, hi) for lo, hi in cfg.command_ranges])
        if cfg.friction_range is not None:
            self.backend.set_ground_friction(rng.uniform(*cfg.friction_range))
        obs = self.backend.reset(seed)
        priv = obs.require_privileged()
        self._start = priv["base_pos"][:2].copy()
        self._heading0 = self._heading_ref = float(priv["yaw"][0])
        self._steps, self._prev_action = 0, np.zeros(12)
        self._vel_err_sq: list[float] = []
        self._distances = [0.0]  # distance() after each step, from the start
        self.backend.set_command(self._command(self.backend.yaw()))
        self._obs = self.backend.observe()
        return self._obs

    def _command(self, yaw: float) -> np.ndarray:
        cmd = self._base_command.copy()
        cmd[2] = np.clip(
            cmd[2] + self.config.heading_gain * _wrap(self._heading_ref - yaw),
            -self.config.max_wz,
            self.config.max_wz,
        )
        return cmd

    def distance(self) -> float:
        """Displacement along the start heading (m)."""
        d = self.backend.data.qpos[:2] - self._start
        return float(d @ np.array([np.cos(self._heading0), np.sin(self._heading0)]))

    def speed(self) -> float:
        """Mean forward speed (m/s) along the start heading over the last speed_window_s."""
        dt = self.config.go2.control_dt
        n = min(len(self._distances) - 1, int(round(self.config.speed_window_s / dt)))
        if n == 0:
            return 0.0
        return (self._distances[-1] - self._distances[-1 - n]) / (n * dt)

    def reward(self, obs: Observation, command: np.ndarray, action: np.ndarray) -> float:
        """Privileged reward of the transition that ended in `obs` under `command`."""
        w, p = self.config.reward, obs.require_privileged()
        cmd, v, om, g = command, p["base_lin_vel"], p["base_ang_vel"], p["projected_gravity"]
        q_rel = obs.proprio[PROPRIO_SLICES["joint_pos"]]
        terms = (
            w.track_lin_vel_xy * np.exp(-np.sum((cmd[:2] - v[:2]) ** 2) / w.tracking_std**2)
            + w.track_ang_vel_z * np.exp(-((cmd[2] - om[2]) ** 2) / w.tracking_std**2)
            + w.lin_vel_z * v[2] ** 2
            + w.ang_vel_xy * np.sum(om[:2] ** 2)
            + w.flat_orientation * np.sum(g[:2] ** 2)
            + w.joint_torques * np.sum(p["joint_torque"] ** 2)
            + w.action_rate * np.sum((action - self._prev_action) ** 2)
            + w.hip_deviation * np.sum(np.abs(q_rel[0::3]))
        )
        return float(terms * self.config.go2.control_dt)

    def step(self, action: np.ndarray) -> StepResult:
        if self._obs is None:
            raise RuntimeError(f"{self.name}: call reset() before step()")
        action = np.asarray(action, dtype=np.float64)
        self.backend.act(Command(CommandKind.JOINT_POSITION, action))
        assert self._obs.command is not None  # the Go2 backend always reports its command
        command = self._obs.command.astype(np.float64)
        self.backend.simulate()
        self._steps += 1
        self._heading_ref += self._base_command[2] * self.config.go2.control_dt
        self.backend.set_command(self._command(self.backend.yaw()))
        obs = self.backend.observe()
        reward = self.reward(obs, command, action)
        self._prev_action = action
        v_err = command[:2] - obs.require_privileged()["base_lin_vel"][:2]
        self._vel_err_sq.append(float(v_err @ v_err))
        fallen = self.backend.fallen()
        distance = self.distance()
        self._distances.append(distance)
        speed = self.speed()
        cfg = self.config
        target = cfg.success_distance
        truncated = self._steps >= self.max_steps
        if target is not None:
            success = not fallen and distance >= target
        else:
            error = abs(speed - self._base_command[0])
            tracks = cfg.walk_tolerance is None or error <= cfg.walk_tolerance
            success = not fallen and truncated and tracks
        self._obs = obs
        info = {  # plain Python values: the driver node publishes it as JSON
            "distance": distance,
            "speed": speed,
            "fallen": bool(fallen),
            "vel_rmse": float(np.sqrt(np.mean(self._vel_err_sq))),
            "command": [float(c) for c in self._base_command],
        }
        return StepResult(
            obs, reward, fallen or (success and target is not None), truncated, success, info
        )


@dataclass
class Rollout:
    """One episode's outcome, for reports and tests."""

    last: StepResult
    steps: int
    mean_velocity: np.ndarray  # (2,) mean base-frame vx, vy
    values: list[float]  # critic values per step (empty without a critic)


def rollout(
    task: Task, policy: Policy, seed: int, max_steps: int | None = None, value=None
) -> Rollout:
    """Run `policy` from `task.reset(seed)` until termination, truncation or `max_steps`."""
    obs = task.reset(seed)
    policy.reset(seed)
    vel, values = [], []
    for k in range(max_steps or task.max_steps):
        r = task.step(policy.act(obs))
        obs = r.obs
        vel.append(obs.require_privileged()["base_lin_vel"][:2])
        if value is not None:
            values.append(float(value(obs)))
        if r.terminated or r.truncated:
            break
    return Rollout(r, k + 1, np.mean(vel, axis=0), values)


def make_go2_task(
    name: str, variant: str = "sim", options: Go2Options | None = None, **overrides
) -> Go2Task:
    """Build one of the GO2_COURSES.

    Args:
        name: the task's name.
        variant: "sim" or "real" (the hardware stand-ins slippery_slope and foam).
        options: its episode options (robot_drivers.tasks.options.Go2Options, validated when
            built): `max_steps` sets the episode length in steps (so a shortened episode still
            ends the task's own way), `speed` the command's vx, `panel_friction` the PTFE panels'
            friction of the Slippery Slope stand-in.
        **overrides: `Go2TaskConfig` fields to replace (e.g. command=(0.3, 0, 0)).

    Returns:
        The task; ValueError for an unknown name, a variant the task lacks, an unknown override
        or an option that does not apply (Go2Options.check).
    """
    options = options or Go2Options()
    if name not in GO2_COURSES:
        raise ValueError(f"unknown Go2 task {name!r}; expected one of {tuple(GO2_COURSES)}")
    if variant not in ("sim", "real"):
        raise ValueError(f"variant must be 'sim' or 'real', got {variant!r}")
    course = GO2_COURSES[name]
    if variant == "real" and course.real_gap is None:
        stand_ins = [t for t, c in GO2_COURSES.items() if c.real_gap is not None]
        raise ValueError(
            f"{name} has no 'real' variant; the Go2 hardware stand-ins are "
            f"{', '.join(map(repr, stand_ins))} (variant='real')"
        )
    options.check(name, variant)
    base: dict[str, Any] = dict(
        terrain=course.terrain,
        success_distance=course.success_distance,
        walk_tolerance=course.walk_tolerance,
        gap=course.real_gap if variant == "real" else None,
    )
    known = {f.name for f in dataclasses.fields(Go2TaskConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown override(s) {unknown} for {name}; allowed: {sorted(known)}")
    if "command" in overrides:
        overrides["command"] = tuple(float(c) for c in overrides["command"])
    if options.max_steps is not None:
        if "episode_s" in overrides:
            raise ValueError("give either max_steps or episode_s, not both")
        overrides["episode_s"] = options.max_steps * overrides.get("go2", Go2Config()).control_dt
    if options.speed is not None:
        if "command" in overrides or "command_ranges" in overrides:
            raise ValueError("give either speed or command / command_ranges, not both")
        _, vy, wz = Go2TaskConfig.command
        overrides["command"] = (options.speed, vy, wz)
    if options.panel_friction is not None:
        base["gap"] = slippery_slope_gap(options.panel_friction)
    return Go2Task(name, variant, Go2TaskConfig(**{**base, **overrides}))


def slippery_slope_gap(panel_friction: float) -> Go2Gap:
    """The Slippery Slope stand-in with its panels' friction set to `panel_friction`."""
    if panel_friction == SLIPPERY_SLOPE_GAP.panel_friction:
        return SLIPPERY_SLOPE_GAP
    return dataclasses.replace(
        SLIPPERY_SLOPE_GAP,
        description=f"PTFE sheets on both panels: foot-panel friction 0.8 -> {panel_friction:g} "
        "(a rung of the stand-in ladder, docs/adaptation.md). Geometry is unchanged, so the "
        "height scan cannot see the difference.",
        panel_friction=float(panel_friction),
    )
