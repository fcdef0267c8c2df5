"""The planner node's logic without ROS: `PlannerCore` and the model loading it rests on.

`PlannerCore` decides everything a tick of the planner node needs that is not a topic, a thread
or a diagnostic's publication: which model plans (loading a checkpoint, the checks a hot swap
must pass, installing it), with which PlannerConfig (parameter values -> a validated config),
which observation a tick plans on (the newest one not yet answered; one older than
`max_observation_age_s` is not planned on in real time; a lockstep tick re-sent after it was
answered gets the same answer again), whether a tick runs MPPI or falls back to the base policy
(the running latency estimate against the deadline, with optional re-probes), the plan of one
observation (a cold start at each new episode; non-finite output raises, never becomes an
action), the counters (deadline misses, fallbacks, stale and superseded observations, the share
answered) and what the planning diagnostic says. `ros/planner_node.py` only moves messages in and
out of it; this module imports no rclpy, so it is tested without ROS (tests/test_planner_core.py).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from robot_drivers.interface import Observation, RobotSpec
from robot_drivers.specs import robot_spec
from simdist_planner.model.checkpoint import load_checkpoint, read_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning.config import (
    PLANNER_CONFIGS,
    PLANNER_FIELDS,
    PRESET_ROBOT,
    PlannerConfig,
    default_preset,
    planner_config_for,
)
from simdist_planner.planning.observation import (
    ObservationError,
    ObservationHistory,
    observation_to_inputs,
)
from simdist_planner.planning.planner import Planner, PlannerError, check_precision, make_planner

# The robot whose defaults a node takes when neither `robot` nor a readable checkpoint names one.
DEFAULT_ROBOT = "ur5e"


def _checkpoint_config(checkpoint: str):
    """The checkpoint's config.json (the weights are not read), or None if it cannot be read."""
    try:
        return read_config(checkpoint) if checkpoint else None
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is reported when it is loaded
        return None


def resolve_robot(robot: str, checkpoint: str, preset: str = "") -> str:
    """The robot whose defaults the node takes.

    Args:
        robot: the `robot` parameter ("" when not set).
        checkpoint: the start-up checkpoint directory ("" for none); only its config is read.
        preset: the `planner_preset` parameter ("" when not set).

    Returns:
        `robot` if given, else the preset's robot, else the checkpoint's (when it has a planner
        config), else DEFAULT_ROBOT.
    """
    if robot:
        return robot
    if preset:
        return PRESET_ROBOT[preset]
    config = _checkpoint_config(checkpoint)
    named = config.robot if config is not None else ""
    return named if named in PLANNER_CONFIGS else DEFAULT_ROBOT


def resolve_preset(preset: str, robot: str, checkpoint: str) -> str:
    """The planner preset the node's defaults come from.

    Args:
        preset: the `planner_preset` parameter ("" when not set).
        robot: the resolved robot (`resolve_robot`).
        checkpoint: the start-up checkpoint directory ("" for none).

    Returns:
        `preset` if given, else config.default_preset for the checkpoint on `robot`.
    """
    return preset or default_preset(robot, _checkpoint_config(checkpoint))


_NEVER = object()  # "no episode planned yet" (differs from every /simdist/episode id, even None)

# Observations the answered share (min_answer_share) is taken over, and the fewest it needs.
ANSWER_WINDOW = 100
ANSWER_MIN_SEEN = 20
# Observations older than this many control periods are not planned on (real-time mode).
MAX_OBSERVATION_AGE_PERIODS = 2.5
LATENCY_EMA = 0.2  # default smoothing factor of the latency estimate (parameter latency_ema)
# Counters the planning diagnostic reports.
REPORTED_COUNTS = (
    "ticks", "mppi_ticks", "policy_fallbacks", "deadline_misses", "failed_plans",
    "stale_observations", "swaps", "republished",
)  # fmt: skip
# The planning diagnostic's levels (robot_drivers.diagnostics.Level's values).
OK, WARN, ERROR = 0, 1, 2


class LatencyEstimate:
    """Running latency estimate: EMA of the mean and of the absolute deviation."""

    def __init__(self, alpha: float):
        self.alpha = alpha
        self.mean: float | None = None
        self.dev = 0.0

    def update(self, seconds: float) -> None:
        """Fold one measured MPPI latency into the estimate (the first measurement sets the mean).

        Args:
            seconds: the latency measured.

        Returns:
            None.
        """
        if self.mean is None:
            self.mean = seconds
            return
        self.dev += self.alpha * (abs(seconds - self.mean) - self.dev)
        self.mean += self.alpha * (seconds - self.mean)

    def predict(self) -> float:
        """The pessimistic next latency.

        Returns:
            Mean + 3 x deviation in seconds; 0 before the first measurement (MPPI is tried first).
        """
        return 0.0 if self.mean is None else self.mean + 3.0 * self.dev

    def reset(self) -> None:
        """Forget every measurement (a new model plans at its own speed).

        Returns:
            None.
        """
        self.mean, self.dev = None, 0.0

    def scale(self, factor: float) -> None:
        """MPPI settings changed: its cost scales with candidates x iterations (no blind re-probe).

        Args:
            factor: new cost / old cost.

        Returns:
            None.
        """
        if self.mean is not None:
            self.mean *= factor
            self.dev *= factor


@dataclass
class LoadedModel:
    """A world model ready to plan with, and the facts the node checks a swap against."""

    model: WorldModel
    path: str
    device: str
    robot: str
    cameras: tuple[str, ...]
    has_height_map: bool
    proprio_dim: int
    action_dim: int
    command_dim: int
    history: int
    horizon: int

    def interface(self) -> tuple:
        """What must stay the same across a hot swap.

        Returns:
            (robot, cameras, height map, proprio_dim, action_dim, command_dim, history): topics,
            shapes and the action layout.
        """
        return (self.robot, self.cameras, self.has_height_map, self.proprio_dim, self.action_dim,
                self.command_dim, self.history)  # fmt: skip


def load_world_model(path: str, device: str) -> LoadedModel:
    """Load and validate a checkpoint directory (never unpickles) and put the model in eval mode.

    Args:
        path: the checkpoint directory.
        device: the torch device to load onto.

    Returns:
        The LoadedModel; ValueError for an empty path, the checkpoint loader's errors for a bad
        directory.
    """

    if not path:
        raise ValueError(
            "no checkpoint given: set the 'checkpoint' parameter to a checkpoint directory"
        )
    model = load_checkpoint(path, device=device)
    model.eval()
    cfg = model.config
    return LoadedModel(
        model=model,
        path=str(path),
        device=device,
        robot=cfg.robot,
        cameras=tuple(cfg.image.cameras) if cfg.image is not None else (),
        has_height_map=cfg.height_map is not None,
        proprio_dim=cfg.proprio_dim,
        action_dim=cfg.action_dim,
        command_dim=cfg.command_dim,
        history=cfg.history,
        horizon=cfg.horizon,
    )


def checked_spec(loaded: LoadedModel) -> RobotSpec:
    """The robot spec the planner checks observations against.

    Args:
        loaded: the model.

    Returns:
        Its robot's RobotSpec with the model's cameras; ValueError when the model's action,
        proprio or height-map input does not match the robot.
    """
    spec = robot_spec(loaded.robot)
    if (spec.action_dim, spec.proprio_dim) != (loaded.action_dim, loaded.proprio_dim):
        raise ValueError(
            f"checkpoint {loaded.path}: action_dim {loaded.action_dim} / "
            f"proprio_dim {loaded.proprio_dim} "
            f"do not match the {loaded.robot} spec ({spec.action_dim} / {spec.proprio_dim})"
        )
    if loaded.has_height_map != (spec.height_map_shape is not None):
        raise ValueError(
            f"checkpoint {loaded.path}: height-map input does not match the {loaded.robot} spec"
        )
    return replace(spec, cameras=loaded.cameras)


def parse_device(device: str) -> str | None:
    """Whether a torch device is usable here.

    Args:
        device: e.g. "cpu", "cuda", "cuda:1".

    Returns:
        None if usable, else the reason (not a device, no CUDA here, not cpu / cuda).
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        return f"device {device!r} is not a torch device ({exc})"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return f"device {device!r}: CUDA is not available on this machine"
    if dev.type not in ("cpu", "cuda"):
        return f"device {device!r}: only cpu and cuda[:N] are supported"
    return None


class PlannerCore:
    """The planner node's decisions for one robot and planner preset (module docstring).

    `values` arguments are the node's parameter values by name: the PLANNER_FIELDS and
    `lockstep`, `fallback_to_policy`, `deadline_fraction`, `reprobe_ticks`. Not thread-safe: the
    node calls it from one tick at a time (a hot swap installs between two ticks)."""

    def __init__(self, robot: str, preset: str, latency_ema: float):
        self.robot, self.preset = robot, preset
        self.latency = LatencyEstimate(latency_ema)
        self.loaded: LoadedModel | None = None
        self.spec: RobotSpec | None = None  # the robot's spec with the loaded model's cameras
        self.planner: Planner | None = None
        self.history: ObservationHistory | None = None
        self._planned_episode: object = _NEVER
        self._since_probe = 0

    def _active(self) -> tuple[LoadedModel, RobotSpec, Planner, ObservationHistory]:
        """The installed model, its spec, planner and history (RuntimeError before install)."""
        if self.loaded is None or self.spec is None or self.planner is None or self.history is None:
            raise RuntimeError("no model installed: install() one first")
        return self.loaded, self.spec, self.planner, self.history

    # -- configuration ---------------------------------------------------------------------------
    def planner_config(self, values: dict, loaded: LoadedModel, spec: RobotSpec) -> PlannerConfig:
        """The PlannerConfig these parameter values imply for a model.

        Args:
            values: the node's parameter values (the planner fields among them).
            loaded: the model to plan with.
            spec: its checked spec.

        Returns:
            The config on the core's preset with the values' settings; ValueError says what is wrong
            (another robot's model, a horizon other than the model's, a precision the device lacks).
        """
        if loaded.robot != self.robot:
            raise ValueError(
                f"checkpoint {loaded.path} is a {loaded.robot} model; this planner's parameters "
                f"are {self.robot}'s (parameter robot)"
            )
        if values["horizon"] != loaded.horizon:
            raise ValueError(
                f"horizon={values['horizon']} must equal the model's horizon T={loaded.horizon}"
            )
        config = planner_config_for(spec, self.preset, **{f: values[f] for f in PLANNER_FIELDS})
        check_precision(config, loaded.model, loaded.device)
        return config

    def check_planner_values(self, values: dict) -> str | None:
        """Why these planner parameter values cannot plan with the loaded model.

        Args:
            values: the node's parameter values with the proposed ones.

        Returns:
            The reason, or None (they can, or no model is loaded yet).
        """
        if self.loaded is None:
            return None
        loaded, spec, _, _ = self._active()
        try:
            self.planner_config(values, loaded, spec)
        except ValueError as exc:
            return str(exc)
        return None

    def retune(self, values: dict) -> None:
        """Planner parameters changed: a planner with the new config; the latency estimate scales
        with candidates x iterations (no blind re-probe). Nothing before a model is installed.

        Args:
            values: the node's parameter values.

        Returns:
            None; ValueError for values the model cannot plan with.
        """
        if self.loaded is None:
            return
        loaded, spec, planner, _ = self._active()
        config = self.planner_config(values, loaded, spec)
        old = planner.config
        self.latency.scale(
            (config.num_candidates * config.iterations) / (old.num_candidates * old.iterations)
        )
        self.planner = make_planner(config, loaded.model, loaded.device)

    def check_param(self, name: str, values: dict) -> str | None:
        """Why the node's parameter `name` cannot take its value in `values` (None: it can).

        Args:
            name: the parameter set.
            values: every parameter's value with the new one.

        Returns:
            The reason (an unusable device, planner settings the loaded model cannot plan with),
            or None.
        """
        if name == "device":
            return parse_device(values["device"])
        if name in PLANNER_FIELDS:
            return self.check_planner_values(values)
        return None

    def apply_params(self, changed: dict, values: dict) -> None:
        """Accepted parameter changes take effect: a planner with the new settings, the latency
        smoothing factor.

        Args:
            changed: the parameters changed, by name.
            values: every parameter's value.

        Returns:
            None.
        """
        if set(changed) & set(PLANNER_FIELDS):
            self.retune(values)
        if "latency_ema" in changed:
            self.latency.alpha = values["latency_ema"]

    def current_path(self) -> str:
        """The planning model's checkpoint.

        Returns:
            Its path, or 'no model'.
        """
        return self.loaded.path if self.loaded else "no model"

    # -- models ----------------------------------------------------------------------------------
    def install(self, loaded: LoadedModel, values: dict) -> None:
        """Make a model the planning model; the next plan cold-starts the planner and the history.

        Args:
            loaded: the model (validated, `validate`, when it replaces another).
            values: the node's parameter values.

        Returns:
            None; ValueError when its spec or the planner settings do not fit it.
        """
        spec = checked_spec(loaded)
        config = self.planner_config(values, loaded, spec)
        self.spec = spec
        self.planner = make_planner(config, loaded.model, loaded.device)
        self.history = ObservationHistory(spec, loaded.history)
        self.loaded = loaded
        self.latency.reset()
        self._planned_episode = _NEVER

    def validate(self, candidate: LoadedModel, values: dict, latest: Observation | None) -> None:
        """What a hot swap must pass: the running model's interface, a valid planner config and,
        given the newest observation, a finite plan on it with a throwaway planner.

        Args:
            candidate: the model to swap in.
            values: the node's parameter values.
            latest: the newest observation, or None (no trial plan).

        Returns:
            None; ValueError or PlannerError says why the candidate is refused.
        """
        if self.loaded is not None and candidate.interface() != self.loaded.interface():
            raise ValueError(
                f"its interface {candidate.interface()} differs from the running model's "
                f"{self.loaded.interface()}"
            )
        spec = checked_spec(candidate)
        config = self.planner_config(values, candidate, spec)
        if latest is not None:
            history = ObservationHistory(spec, candidate.history)
            history.reset(latest)
            make_planner(config, candidate.model, candidate.device).plan(
                observation_to_inputs(latest, spec), *history.tensors()
            )

    # -- one tick --------------------------------------------------------------------------------
    def should_fall_back(self, values: dict, period: float) -> bool:
        """Whether MPPI is predicted to overrun the deadline (real time only: in lockstep the
        simulator waits). While falling back, MPPI runs once every `reprobe_ticks` ticks (0: never)
        so the estimate can recover.

        Args:
            values: the node's parameter values (lockstep, fallback_to_policy, deadline_fraction,
                reprobe_ticks).
            period: the control period in seconds.

        Returns:
            True: plan with the base policy this tick.
        """
        if (
            values["lockstep"]
            or not values["fallback_to_policy"]
            or self.latency.predict() <= values["deadline_fraction"] * period
        ):
            self._since_probe = 0
            return False
        self._since_probe += 1
        if values["reprobe_ticks"] and self._since_probe >= values["reprobe_ticks"]:
            self._since_probe = 0
            return False
        return True

    def new_episode(self, episode) -> bool:
        """Whether this plan starts an episode. An episode id first learnt after planning started
        (the episode topic matched late) is adopted without a reset.

        Args:
            episode: the latest /simdist/episode's (id, seed), None before one arrived.

        Returns:
            True at the first plan after an install and when `episode` names a new episode.
        """
        planned = self._planned_episode
        if planned is _NEVER or (
            episode is not None and planned is not None and episode != planned
        ):
            self._planned_episode = episode
            return True
        if planned is None:
            self._planned_episode = episode
        return False

    def plan(
        self, obs: Observation, episode, use_policy: bool, loaded: LoadedModel
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The plan for an observation: MPPI's mean, or the base policy's chunk. At a new episode
        the planner and history start cold (seeded: a run is reproducible episode by episode).

        Args:
            obs: the observation planned on.
            episode: the latest /simdist/episode's (id, seed), or None.
            use_policy: plan with the base policy (`should_fall_back`).
            loaded: the installed model.

        Returns:
            (action chunk, predicted rewards, values); no rewards or values from the base policy.
            Raises PlannerError, ObservationError, RuntimeError or ValueError instead of returning a
            plan not to act on.
        """
        _, spec, planner, history = self._active()
        batch = observation_to_inputs(obs, spec)
        if self.new_episode(episode):
            planner.reset()
            history.reset(obs)
        proprio_hist, action_hist = history.tensors()
        if use_policy:
            return self.policy_chunk(batch, proprio_hist, action_hist, loaded), None, None
        result = planner.plan(batch, proprio_hist, action_hist)
        return result.mean, result.rewards, result.values

    def policy_chunk(self, batch, proprio_hist, action_hist, loaded: LoadedModel) -> np.ndarray:
        """The base policy's chunk a^_{t:t+T}, clamped to the action bounds.

        Args:
            batch: the observation's model inputs.
            proprio_hist: the proprio history tensor.
            action_hist: the action history tensor.
            loaded: the installed model.

        Returns:
            The (T, action_dim) chunk; PlannerError when it holds a non-finite value.
        """
        dev = torch.device(loaded.device)
        with torch.no_grad():
            batch = {k: v.to(dev) for k, v in batch.items()}
            z = loaded.model.encode(batch)
            history = loaded.model.encode_history(proprio_hist.to(dev), action_hist.to(dev))
            chunk = (
                loaded.model.policy(z, history, batch.get("command"), batch["proprio"])[0]
                .float()
                .cpu()
                .numpy()
            )
        if not np.all(np.isfinite(chunk)):
            raise PlannerError("non-finite values in the base-policy chunk; no action returned")
        spec = self._active()[1]
        return np.clip(chunk, spec.action_low, spec.action_high)


@dataclass
class Tick:
    """What one planning tick decided. The node publishes `chunk` (the action and the plan) when
    there is one, HOLD when `error` says why there is none, nothing when `skipped` says why the
    observation was not planned on; `level` and `status` are the planning diagnostic."""

    stamp: int  # ns: the stamp of the observation planned on, which the answer carries
    period: float = 0.0  # s: the plan's time step (one control period)
    obs: Observation | None = None
    chunk: np.ndarray | None = None  # (T, A) action chunk; its first row is the action
    rewards: np.ndarray | None = None  # predicted along the chunk (MPPI only)
    values: np.ndarray | None = None
    use_policy: bool = False  # the base policy planned (MPPI predicted to miss the deadline)
    error: str = ""  # no plan: HOLD is the answer
    skipped: str = ""  # not planned on: no answer
    level: int = OK
    status: str = ""


class TickBook:
    """Which observation the next tick plans on and what became of each one: answered,
    superseded by a newer one before a tick took it, or too old to plan on; the counters the
    planning diagnostic reports. Thread-safe: the node stores observations from its executor and
    ticks on its planning thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latest: tuple[int, Observation] | None = None  # (stamp ns, observation)
        self.answered_stamp = -1  # the stamp of the observation the last tick took
        self.sent_stamp = -1  # the stamp of the last answer the node sent
        self.episode: tuple | None = None  # (episode id, seed) of the latest /simdist/episode
        self.stats: collections.Counter[str] = collections.Counter()
        # per new observation, in arrival order: was it answered (True) or superseded / stale
        self.answered: collections.deque[bool] = collections.deque(maxlen=ANSWER_WINDOW)
        self.last_latency_s = 0.0
        self.last_age_s = 0.0  # observation stamp -> its answer sent

    def observe(self, stamp: int, obs: Observation, lockstep: bool) -> str:
        """Store the newest complete observation.

        Args:
            stamp: its stamp (ns).
            obs: the observation.
            lockstep: the simulator waits for each answer (a tick per observation).

        Returns:
            "republish": a lockstep tick re-sent after it was answered (the simulator may have
            missed the answer: send it again, plan nothing); "answered": re-sent, but no answer
            went out for it (nothing to do); "new": stored for the next tick.
        """
        if lockstep and stamp == self.answered_stamp:
            if stamp == self.sent_stamp:
                self.stats["republished"] += 1
                return "republish"
            return "answered"
        with self._lock:  # against the planning thread taking the previous one now
            previous = self.latest
            if previous is not None and stamp != previous[0] != self.answered_stamp:
                self.answered.append(False)  # superseded before a tick planned on it
            self.latest = (stamp, obs)
        return "new"

    def take(self) -> tuple[int, Observation] | None:
        """Take the newest observation no tick has taken yet.

        Returns:
            (stamp, observation), now taken; None when there is none.
        """
        with self._lock:
            latest = self.latest
            if latest is None or latest[0] == self.answered_stamp:
                self.stats["ticks_without_new_observation"] += 1
                return None
            self.answered_stamp = latest[0]
            return latest

    def episode_message(self, data: str) -> str | None:
        """Read a /simdist/episode message.

        Args:
            data: its JSON text (`episode` and `seed`).

        Returns:
            None once read, else the reason it is unreadable.
        """
        try:
            info = json.loads(data)
            self.episode = (info["episode"], info.get("seed"))
        except (ValueError, KeyError, TypeError) as exc:
            return f"unreadable /simdist/episode message {data!r}: {exc}"
        return None

    def answer_share(self) -> float | None:
        """The share of the last ANSWER_WINDOW new observations that got an answer.

        Returns:
            A share in [0, 1]; None before ANSWER_MIN_SEEN observations.
        """
        answered = list(self.answered)
        return sum(answered) / len(answered) if len(answered) >= ANSWER_MIN_SEEN else None


class PlanningTicks:
    """One tick of the planner node after another, on a PlannerCore: the observation it takes,
    whether it is planned on, the plan, the counters and the diagnostic (module docstring)."""

    def __init__(self, core: PlannerCore) -> None:
        self.core = core
        self.book = TickBook()

    def tick(self, values: dict, now_ns: int) -> Tick | None:
        """Plan on the newest observation no tick has taken.

        Args:
            values: the node's parameter values (lockstep, control_rate_hz,
                max_observation_age_s and those PlannerCore.should_fall_back reads).
            now_ns: the node clock now (sim time in lockstep).

        Returns:
            None when no new observation arrived since the last tick; else the Tick to publish
            and report (`PlanningTicks.sent` once its answer went out).
        """
        core, book = self.core, self.book
        taken = book.take()
        if taken is None:
            return None
        stamp, obs = taken
        loaded = core.loaded
        if loaded is None or core.spec is None:
            reason = "no model loaded: no action published (call ~/load_model)"
            return Tick(stamp, skipped=reason, level=ERROR, status=reason)
        lockstep = values["lockstep"]
        period = 1.0 / (core.spec.control_rate_hz if lockstep else values["control_rate_hz"])
        if not lockstep:
            age = now_ns * 1e-9 - stamp * 1e-9
            if age > values["max_observation_age_s"]:
                book.stats["stale_observations"] += 1
                book.answered.append(False)
                reason = (
                    f"observation is {age:.3f} s old (> {values['max_observation_age_s']} s): "
                    "not planned on"
                )
                return Tick(stamp, period, obs, skipped=reason, level=WARN, status=reason)
        start = time.perf_counter()
        use_policy = core.should_fall_back(values, period)
        try:
            chunk, rewards, plan_values = core.plan(obs, book.episode, use_policy, loaded)
        except (PlannerError, ObservationError, RuntimeError, ValueError) as exc:  # never act on it
            book.stats["failed_plans"] += 1
            return Tick(
                stamp,
                period,
                obs,
                error=str(exc),
                level=ERROR,
                status=f"no plan for stamp {stamp}, HOLD sent: {exc}",
            )
        latency = time.perf_counter() - start
        book.last_latency_s = latency
        if not use_policy:
            core.latency.update(latency)
        book.stats["ticks"] += 1
        book.stats["policy_fallbacks" if use_policy else "mppi_ticks"] += 1
        if latency > period:
            book.stats["deadline_misses"] += 1
        return Tick(stamp, period, obs, chunk, rewards, plan_values, use_policy)

    def sent(self, tick: Tick, now_ns: int, min_answer_share: float) -> None:
        """The node sent a tick's answer (its plan, or HOLD): a plan's first action joins the
        history, the observation counts as answered, and `tick.level` / `tick.status` become the
        planning diagnostic (WARN when the base policy planned or fewer than `min_answer_share` of
        the recent observations got an answer).

        Args:
            tick: the tick answered.
            now_ns: the node time it was sent at.
            min_answer_share: the parameter of that name.

        Returns:
            None.
        """
        book = self.book
        book.sent_stamp = tick.stamp
        if tick.chunk is None or tick.obs is None:
            return  # HOLD: the diagnostic says why already
        book.last_age_s = (now_ns - tick.stamp) * 1e-9  # observation -> action
        self.core._active()[3].push(tick.obs, tick.chunk[0])
        book.answered.append(True)
        what = "base policy (MPPI predicted to miss the deadline)" if tick.use_policy else "MPPI"
        tick.level = WARN if tick.use_policy else OK
        tick.status = f"planning with {what}"
        share = book.answer_share()
        if share is not None and share < min_answer_share:
            tick.level = WARN
            tick.status += (
                f"; answered {sum(book.answered)} of the last {len(book.answered)} "
                f"observations (< min_answer_share {min_answer_share})"
            )

    def report(self) -> dict:
        """The planning diagnostic's key-values.

        Returns:
            The counters, latencies, the answered share, the checkpoint and the planner's settings.
        """
        core, book = self.core, self.book
        cfg = dataclasses.asdict(core.planner.config) if core.loaded and core.planner else {}
        share = book.answer_share()
        return {
            **{k: book.stats[k] for k in REPORTED_COUNTS},
            "last_latency_ms": f"{1e3 * book.last_latency_s:.2f}",
            "observation_to_action_ms": f"{1e3 * book.last_age_s:.2f}",
            "latency_estimate_ms": f"{1e3 * core.latency.predict():.2f}",
            "last_stamp": book.answered_stamp,
            "answer_share": "n/a" if share is None else f"{share:.2f}",
            "checkpoint": core.current_path(),
            **{f: cfg.get(f) for f in PLANNER_FIELDS},
        }
