"""UR5e insertion tasks: Peg Insertion and Table Leg, each with Narrow / Wide initial regions and
a "real" variant (the hardware stand-in) that differs by a documented `RealGap`.

Peg: a 16 mm square peg (70 mm long) starts upright with yaw +-30 deg in the region; insert it
into a square hole (success: peg bottom >= 20 mm below the hole top, within 4 mm in xy).
Table Leg: a round leg (20 mm diameter, 100 mm long) must be inserted into a round hole down to
its seat and then threaded. Threading is modelled as a required rotation: once seated (bottom
within 3 mm of the hole floor) the leg must be turned clockwise seen from above (tightening a
right-hand thread) by `thread_turn` radians in total while staying seated; twist done while not
seated does not count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from robot_drivers.interface import Command, CommandKind, Observation, term_slices
from robot_drivers.tasks.base import StepResult, Task
from robot_drivers.tasks.options import Ur5eOptions
from robot_drivers.ur5e.backend import MujocoUR5eBackend
from robot_drivers.ur5e.config import Appearance, ControllerConfig, SceneConfig
from robot_drivers.ur5e.objects import FreeObject, HoleFixture, add_free_object, add_hole_fixture
from robot_drivers.ur5e.so3 import tcp_yaw, wrap_angle, yaw_of

GAMMA = 0.99  # discount of the planner's return; V^e is fitted with it
REGIONS = {"narrow": (0.01, 0.01), "wide": (0.175, 0.175)}  # half extents (2x2 cm, 35x35 cm)
OBJECT = "object"


@dataclass(frozen=True)
class InsertionConfig:
    """Geometry and scoring of one insertion task."""

    name: str
    obj: FreeObject
    fixture: HoleFixture
    region_center: tuple[float, float] = (-0.10, 0.50)
    region: str = "wide"
    yaw_range: float = np.radians(30.0)
    grasp_below_top: float = 0.015  # where the expert grasps, from the object's top
    success_depth: float = 0.020  # object bottom below the hole top
    success_xy: float = 0.004
    thread_turn: float = 0.0  # required clockwise turn once seated (0: no threading)
    seat_tolerance: float = 0.003  # "seated" = bottom within this of the hole floor
    max_steps: int = 150

    def __post_init__(self):
        if self.region not in REGIONS:
            raise ValueError(f"region must be one of {sorted(REGIONS)}, got {self.region!r}")


def peg_config(region: str = "wide") -> InsertionConfig:
    return InsertionConfig(
        name="peg",
        obj=FreeObject("box", 0.008, 0.035, 0.05, 1.0),
        fixture=HoleFixture(hole_half_width=0.008, clearance=0.001, height=0.04, sides=4),
        region=region,
        max_steps=150,
    )


def table_leg_config(region: str = "wide") -> InsertionConfig:
    return InsertionConfig(
        name="table_leg",
        obj=FreeObject("cylinder", 0.010, 0.05, 0.08, 1.0, rgba=(0.75, 0.6, 0.35, 1.0)),
        fixture=HoleFixture(
            hole_half_width=0.010,
            clearance=0.001,
            height=0.03,
            wall=0.03,
            sides=12,
            rgba=(0.5, 0.35, 0.2, 1.0),
        ),
        region=region,
        success_depth=0.027,
        thread_turn=np.pi,
        max_steps=200,
    )


@dataclass(frozen=True)
class RealGap:
    """Everything the "real" variant changes relative to sim (the sim-to-real gap)."""

    clearance_scale: float = 0.3  # hole clearance per side x this (peg: 1.0 -> 0.3 mm)
    object_friction: float = 0.6  # sim 1.0
    fixture_friction: float = 0.6  # sim 1.0
    pad_friction: float = 0.5  # sim 0.7
    object_mass_scale: float = 1.6
    actuator_gain_scale: float = 0.5  # arm servo stiffness (kv unchanged): softer, lagging
    action_latency_s: float = 0.18  # commands take effect 180 ms into the 200 ms period
    camera_offset: tuple[float, float, float] = (0.02, -0.015, 0.01)  # world cameras (m)
    fovy_offset: float = 3.0  # deg
    table_rgba: tuple[float, float, float, float] = (0.35, 0.38, 0.42, 1.0)
    table_checker: bool = True
    light_pos: tuple[float, float, float] = (0.6, -0.2, 1.6)
    light_diffuse: tuple[float, float, float] = (0.55, 0.5, 0.45)
    headlight: float = 0.25


# The default gap per task: the same kinds of change, sized so the sim expert is measurably
# worse on "real" without becoming hopeless (measured rates: docs/ur5e_sim.md).
REAL_GAPS = {
    "peg": RealGap(),
    "table_leg": RealGap(
        clearance_scale=0.5,
        pad_friction=0.6,
        object_mass_scale=1.3,
        actuator_gain_scale=0.7,
        action_latency_s=0.11,
    ),
}


def real_gap(name: str) -> RealGap:
    """The documented default sim-to-real gap of a UR5e task."""
    if name not in REAL_GAPS:
        raise ValueError(f"no real gap for {name!r}; known: {sorted(REAL_GAPS)}")
    return REAL_GAPS[name]


class InsertionObjects:
    """The task's scene objects (SceneObjects protocol): object + hole fixture + twist tracking."""

    def __init__(self, cfg: InsertionConfig):
        self.cfg = cfg
        self.twist = 0.0
        self._last_yaw: float | None = None
        self._last_time = -1.0

    def build(self, spec: mujoco.MjSpec) -> None:
        add_free_object(spec, self.cfg.obj, OBJECT)
        add_hole_fixture(spec, self.cfg.fixture)

    def reset(self, model, data, rng: np.random.Generator) -> None:
        c = self.cfg
        half = np.asarray(REGIONS[c.region])
        xy = np.asarray(c.region_center) + rng.uniform(-half, half)
        yaw = rng.uniform(-c.yaw_range, c.yaw_range)
        adr = model.joint(f"{OBJECT}_free").qposadr[0]
        data.qpos[adr : adr + 3] = [xy[0], xy[1], c.obj.half_length + 1e-4]
        data.qpos[adr + 3 : adr + 7] = [np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]
        self.twist, self._last_yaw, self._last_time = 0.0, None, -1.0

    def privileged(self, model, data) -> dict[str, np.ndarray]:
        c = self.cfg
        body = model.body(OBJECT).id
        pos = data.xpos[body].copy()
        mat = data.xmat[body].reshape(3, 3).copy()
        axis = mat[:, 2]
        bottom = pos - c.obj.half_length * axis
        hole = np.array([c.fixture.center[0], c.fixture.center[1], c.fixture.top_z])
        depth = hole[2] - bottom[2]
        xy_err = np.linalg.norm(bottom[:2] - hole[:2])
        seated = depth >= c.fixture.height - c.seat_tolerance and xy_err < c.success_xy
        yaw = yaw_of(mat)
        if data.time != self._last_time:  # integrate the turn once per new sim time
            if self._last_yaw is not None and seated:
                self.twist += -wrap_angle(yaw - self._last_yaw)  # clockwise from above = +
            self._last_yaw, self._last_time = yaw, data.time
        grasp = pos + (c.obj.half_length - c.grasp_below_top) * axis
        return {
            "obj_pos": pos,
            "obj_mat": mat,
            "obj_bottom": bottom,
            "obj_grasp": grasp,
            "obj_vel": data.cvel[body][3:].copy(),
            "hole": hole,
            "depth": np.array([depth]),
            "xy_err": np.array([xy_err]),
            "tilt": np.array([np.arccos(np.clip(axis[2], -1.0, 1.0))]),
            "twist": np.array([self.twist]),
            "seated": np.array([float(seated)]),
        }


def grasp_yaw_error(priv: dict[str, np.ndarray]) -> float:
    """The square object's yaw to the hand: how far one must turn about z for a face-on grip
    (rad, within +-45 deg: a square looks the same every 90 deg)."""
    hand = tcp_yaw(priv["tcp_mat"])
    return wrap_angle(yaw_of(priv["obj_mat"]) - hand, np.pi / 2)


# The privileged task state (Task.state_terms): where the object is relative to the hand and
# to the hole, how it sits and whether it is held. Units: m, rad, fractions and flags.
STATE_TERMS = (
    ("tcp_to_grasp", 3),
    ("bottom_to_hole", 3),
    ("grasp_yaw_error", 1),
    ("tilt", 1),
    ("depth", 1),
    ("gripper", 1),
    ("grasped", 1),
    ("seated", 1),
    ("twist", 1),
)


STATE_SLICES = term_slices(STATE_TERMS)  # term name -> its columns in the task state


class UR5eInsertionTask(Task):
    """Backend + dense privileged reward in [0, 1] (1 on success) + success test."""

    state_terms = STATE_TERMS

    def __init__(
        self,
        cfg: InsertionConfig,
        variant: str,
        backend: MujocoUR5eBackend,
        objects: InsertionObjects,
        gap: RealGap | None,
    ):
        self.cfg, self.name, self.variant = cfg, cfg.name, variant
        self.backend, self.objects, self.gap = backend, objects, gap
        self.max_steps = cfg.max_steps
        self._t = 0
        self._obs: Observation | None = None

    def hold_action(self, obs: Observation) -> np.ndarray:
        """A zero pose delta that keeps the gripper's state."""
        return np.r_[np.zeros(6), obs.require_privileged()["gripper_cmd"][0]]

    def reset(self, seed: int | None = None) -> Observation:
        self._t = 0
        self._obs = self.backend.reset(seed)
        return self._obs

    def step(self, action: np.ndarray) -> StepResult:
        if self._obs is None:
            raise RuntimeError(f"{self.name}: call reset() before step()")
        a = np.asarray(action, dtype=np.float64)
        self.backend.act(Command(CommandKind.EE_DELTA, a))
        obs = self.backend.step()
        self._t += 1
        self._obs = obs
        priv = obs.require_privileged()
        success = self.is_success(priv)
        fell = bool(priv["obj_pos"][2] < -0.05)
        diverged = any(f.code == "sim_diverged" for f in self.backend.faults())
        reward = 1.0 if success else self.dense_reward(priv)
        return StepResult(
            obs,
            reward,
            terminated=success or fell or diverged,
            truncated=self._t >= self.max_steps and not success,
            success=success,
            info={
                "step": self._t,
                "depth": float(priv["depth"][0]),
                "twist": float(priv["twist"][0]),
                "xy_err": float(priv["xy_err"][0]),
                "tilt": float(priv["tilt"][0]),
                "held": self.grasped(priv),
            },
        )

    def is_success(self, priv: dict[str, np.ndarray]) -> bool:
        c = self.cfg
        inserted = priv["depth"][0] >= c.success_depth and priv["xy_err"][0] <= c.success_xy
        return bool(inserted and priv["twist"][0] >= c.thread_turn)

    def privileged_state(self, obs: Observation) -> np.ndarray:
        p = obs.privileged
        if p is None:
            raise ValueError(f"{self.name}: the task state needs obs.privileged (simulation only)")
        c = self.cfg
        yaw = 0.0 if c.obj.shape == "cylinder" else grasp_yaw_error(p)
        twist = p["twist"][0] / c.thread_turn if c.thread_turn > 0 else 0.0
        return np.concatenate(
            [
                p["obj_grasp"] - p["tcp_pos"],
                p["obj_bottom"] - p["hole"],
                [
                    yaw,
                    p["tilt"][0],
                    p["depth"][0],
                    p["gripper"][0],
                    float(self.grasped(p)),
                    p["seated"][0],
                    twist,
                ],
            ]
        ).astype(np.float32)

    def grasped(self, priv: dict[str, np.ndarray]) -> bool:
        near = np.linalg.norm(priv["tcp_pos"] - priv["obj_grasp"]) < 0.015
        return bool(near and priv["gripper_cmd"][0] > 0.5 and priv["gripper"][0] > 0.05)

    def dense_reward(self, priv: dict[str, np.ndarray]) -> float:
        """Stages: reach the grasp point, hold it, align over the hole, insert (, thread)."""
        c = self.cfg
        reach = 1.0 - np.tanh(10.0 * np.linalg.norm(priv["tcp_pos"] - priv["obj_grasp"]))
        held = float(self.grasped(priv))
        lateral = np.linalg.norm(priv["obj_bottom"][:2] - priv["hole"][:2])
        align = 1.0 - np.tanh(20.0 * lateral)
        insert = (
            float(np.clip(priv["depth"][0] / c.success_depth, 0.0, 1.0))
            if priv["xy_err"][0] < c.success_xy
            else 0.0
        )
        terms = [reach, held, held * align, insert]
        if c.thread_turn > 0:
            terms.append(float(np.clip(priv["twist"][0] / c.thread_turn, 0.0, 1.0)))
        return float(np.mean(terms)) * 0.99  # strictly below the success reward


def _real(cfg: InsertionConfig, gap: RealGap) -> InsertionConfig:
    fx = dataclasses.replace(
        cfg.fixture,
        clearance=cfg.fixture.clearance * gap.clearance_scale,
        friction=gap.fixture_friction,
    )
    obj = dataclasses.replace(
        cfg.obj, friction=gap.object_friction, mass=cfg.obj.mass * gap.object_mass_scale
    )
    return dataclasses.replace(cfg, fixture=fx, obj=obj)


OVERRIDES = ("ik_hz", "gap", "clearance")


def make_ur5e_task(
    name: str, variant: str = "sim", options: Ur5eOptions | None = None, **overrides
) -> UR5eInsertionTask:
    """Build `peg` or `table_leg`.

    Args:
        name: the task's name.
        variant: "sim" or "real" (its hardware stand-in).
        options: its episode options (robot_drivers.tasks.options.Ur5eOptions, validated when
            built): region (default "wide"), image_size, cameras, max_steps.
        **overrides: ik_hz, gap (a RealGap, "real" only), clearance (per side, m).

    Returns:
        The task; ValueError for an unknown name, variant or override.
    """
    options = options or Ur5eOptions()
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise ValueError(f"unknown overrides {unknown} for {name}; allowed: {list(OVERRIDES)}")
    if variant not in ("sim", "real"):
        raise ValueError(f"variant must be 'sim' or 'real', got {variant!r}")
    options.check(name, variant)
    overrides = {**options.given(), **overrides}
    builders = {"peg": peg_config, "table_leg": table_leg_config}
    if name not in builders:
        raise ValueError(f"unknown UR5e task {name!r}; expected one of {sorted(builders)}")
    cfg = builders[name](overrides.get("region", "wide"))
    if "max_steps" in overrides:
        cfg = dataclasses.replace(cfg, max_steps=int(overrides["max_steps"]))
    if "clearance" in overrides:
        cfg = dataclasses.replace(
            cfg, fixture=dataclasses.replace(cfg.fixture, clearance=float(overrides["clearance"]))
        )
    gap = overrides.get("gap")
    if gap is not None and variant != "real":
        raise ValueError("the `gap` override applies to variant='real' only")
    if variant == "real":
        gap = gap or real_gap(name)
        cfg = _real(cfg, gap)
    scene_kw: dict[str, Any] = {
        k: overrides[k] for k in ("image_size", "cameras") if k in overrides
    }
    ctrl_kw: dict[str, Any] = {"ik_hz": overrides["ik_hz"]} if "ik_hz" in overrides else {}
    if gap is not None:
        scene_kw.update(
            pad_friction=gap.pad_friction,
            appearance=Appearance(
                table_rgba=gap.table_rgba,
                table_checker=gap.table_checker,
                light_pos=gap.light_pos,
                light_diffuse=gap.light_diffuse,
                headlight=gap.headlight,
                camera_offset=gap.camera_offset,
                fovy_offset=gap.fovy_offset,
            ),
        )
        ctrl_kw.update(
            actuator_gain_scale=gap.actuator_gain_scale, action_latency_s=gap.action_latency_s
        )
    if "cameras" in scene_kw:
        scene_kw["cameras"] = tuple(scene_kw["cameras"])
    if "image_size" in scene_kw:
        scene_kw["image_size"] = tuple(scene_kw["image_size"])
    objects = InsertionObjects(cfg)
    backend = MujocoUR5eBackend(SceneConfig(**scene_kw), ControllerConfig(**ctrl_kw), objects)
    return UR5eInsertionTask(cfg, variant, backend, objects, gap)


LIFT_DZ = 0.005  # m per step: an action that raises the TCP more than this while closed lifts
AT_HOLE_XY, AT_HOLE_Z = 0.025, 0.015  # m: the "at_hole" phase's box about the hole top


def step_phases(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Named phases of one logged episode, a (rows,) bool mask each, read off its actions
    (EE_DELTA [dx dy dz rx ry rz gripper]) and, where logged, its privileged task state;
    pretraining can draw them more often (PretrainConfig.phase_weights).

    "closing": from the episode's first close command through the lift of that grasp (or the
    grasp's end). There the expert decides, from a few tenths of a millimetre of pad travel,
    whether the peg sits square enough to lift; about 4 % of the windows, which a uniform draw
    leaves to be averaged away. Re-grasps after a drop or a noise burst are left out: there the
    expert's lift follows the reading less (34 of 45 clean lifts off the flat band, against 8 of
    64 in first grasps), and a fine-tuning that drew them as often as first grasps did not teach
    pi to hold on a half-turned peg, where one drawing first grasps only did
    (docs/notebook/peg_wide.md).

    "at_hole" (only with this task's privileged state, STATE_TERMS, in `rows["state"]`): held
    with its bottom within AT_HOLE_XY of the hole in xy and at most AT_HOLE_Z above its top:
    the last centimetre, where the expert corrects by millimetres before it pushes in. Few
    windows of expert data lie there, and pi shrank its corrections there to a fifth of the
    expert's (docs/notebook/peg_wide.md).
    """
    phases = {"closing": _closing_phase(rows["action"])}
    state = rows.get("state")
    if state is not None and state.shape[1:] == (STATE_SLICES["twist"].stop,):
        b2h, held = (
            state[:, STATE_SLICES["bottom_to_hole"]],
            state[:, STATE_SLICES["grasped"]][:, 0],
        )
        phases["at_hole"] = (
            (held > 0.5)
            & (np.linalg.norm(b2h[:, :2], axis=1) < AT_HOLE_XY)
            & (b2h[:, 2] < AT_HOLE_Z)
        )
    return phases


def _closing_phase(action: np.ndarray) -> np.ndarray:
    closed = np.nonzero(action[:, 6] > 0.5)[0]
    closing = np.zeros(len(action), bool)
    t = int(closed[0]) if len(closed) else len(action)
    while t < len(action) and action[t, 6] > 0.5:
        closing[t] = True
        if action[t, 2] > LIFT_DZ:
            break
        t += 1
    return closing
