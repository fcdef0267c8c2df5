"""MPPI over the chunked world model, as in TD-MPC / the official SimDist controller.

Per control step the observation and history are encoded ONCE, and so are f's cross-attention
keys / values of that context (`dynamics_context`, batch 1, broadcast to every candidate); each
of the `iterations` then scores every candidate action chunk in one batched call of f, R and V
(`expand`ed latents, no Python loop over candidates or horizon). Candidates are Gaussian samples
around the running mean plus base-policy chunks noised once per step. The elites'
exp(temperature * (R - R_max)) weights give the next mean and std; the mean's first action is
executed and the mean warm-starts the next step (`warm_start`). With a positive
`policy_prior` (not official) a candidate is ranked by its return less a quadratic cost of its
distance from pi's chunk: the objective then moves the plan off pi only where it gains more than
the cost, which bounds how far an objective that is flat or wrong off the data can pull it.

Return of a chunk: sum_{s=0}^{T-1} gamma^s r^_{t+s} + gamma^(T+o) v^_{t+T}. The `official` preset
is the released JAX controller as it is: o = 1, its warm start rolls the previous mean forward
(mean = [prev[-d:], 0, ...]) and nothing is clamped; the imported official model walks with it
(docs/official_model.md). The presets of the self-pretrained models follow METHOD_NOTES and
TD-MPC2 (o = 0, mean[:-d] = prev[d:] with a zero tail, candidates clamped into the bounds), the
settings they were measured with.

Non-finite model outputs never become an action: every check is accumulated on the device and
resolved with one host transfer per step, which raises `PlannerError` naming what went wrong.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch

from simdist_planner.model.official import is_official
from simdist_planner.planning.cpu_memory import retain_freed_memory
from simdist_planner.planning.fast_objective import FastObjective


class PlannerError(RuntimeError):
    """The planner cannot produce a trustworthy action (non-finite model output, bad input)."""


class WorldModelLike(Protocol):
    """The slice of the world-model API (docs/architecture.md) the planner uses; raw units."""

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor: ...  # (B, D)

    def encode_history(self, proprio: torch.Tensor, actions: torch.Tensor) -> torch.Tensor: ...

    def dynamics_context(
        self, z: torch.Tensor, history: torch.Tensor
    ) -> Any: ...  # reused by dynamics

    def dynamics(
        self, z: torch.Tensor, actions: torch.Tensor, history: torch.Tensor, context: Any = None
    ) -> torch.Tensor: ...  # (B, T, D): z^_{t+1..t+T}

    def reward(
        self, latents: torch.Tensor, actions: torch.Tensor, command: torch.Tensor | None
    ) -> torch.Tensor: ...  # (B, T): r^_t..r^_{t+T-1}

    def value(self, latents: torch.Tensor, command: torch.Tensor | None) -> torch.Tensor: ...

    def policy(
        self,
        z: torch.Tensor,
        history: torch.Tensor,
        command: torch.Tensor | None,
        proprio: torch.Tensor,
    ) -> torch.Tensor: ...  # (B, T, A); proprio: o^p_t (B, P)


WARM_STARTS = ("roll", "shift", "policy")
EVALUATORS = ("fast", "eager")
PRECISIONS = ("float32", "bfloat16")


@dataclass(frozen=True)
class PlannerConfig:
    """MPPI settings. Field defaults are the official controller's (simdist
    config/control/mppi.yaml and control/mppi.py), the `official` preset; the other presets
    (PLANNER_PRESETS) set what differs."""

    horizon: int  # T: must equal the model's prediction length
    action_low: tuple[float, ...]  # per action dimension, raw units (RobotSpec.action_low)
    action_high: tuple[float, ...]
    num_samples: int = 450  # Gaussian candidates per iteration
    mixture_coef: float = 0.05  # base-policy candidates = int(num_samples * mixture_coef)
    policy_noise_std: float = 0.05  # noise on the policy chunks, drawn once per step
    iterations: int = 8
    num_elites: int = 64
    temperature: float = 0.25
    init_std: float = 2.0  # std at the start of every step
    min_std: float = 0.05
    momentum: float = 0.0  # weight of the previous mean in the per-iteration update
    discount: float = 0.99
    delay: int = 1  # warm start: shift of the previous mean, in control steps
    # Where each step's Gaussian mean starts. "roll" (official MppiController): the previous mean
    # rolled forward by `delay` (its last `delay` rows come first) and zero after them. "shift"
    # (TD-MPC): the previous mean advanced by `delay`, zero tail. "policy": pi's chunk, so that a
    # drift the objective prefers cannot build up over steps (it did on the peg,
    # docs/notebook/peg_wide.md).
    warm_start: str = "roll"
    # The value of the last predicted latent is weighted discount^(horizon + value_discount_offset)
    # in the return; the official controller uses 1 (gamma^(T+1)).
    value_discount_offset: int = 1
    # Clamp candidates and the mean into [action_low, action_high]; the official controller
    # does not (its actions are raw policy units with no bounds).
    clamp_actions: bool = False
    # Ranking cost of a candidate's distance from pi's chunk: policy_prior x the squared
    # deviation in std_scale units, summed over action dimensions, averaged over the horizon.
    # 0 = official. Ours: on the peg the objective scored chunks that drifted off pi's path
    # above pi's own and the plan followed them (docs/notebook/peg_wide.md).
    policy_prior: float = 0.0
    seed: int = 42
    max_nonfinite_candidates: int = 0  # per step; more raises PlannerError (0 = any NaN raises)
    # Per action dimension, the unit of init_std, min_std and policy_noise_std; () = raw action
    # units (Go2: mppi.yaml is in raw policy-action units). UR5e: half the action range, so its
    # settings act on actions normalised to [-1, 1] (ur5e_planner_config).
    std_scale: tuple[float, ...] = ()
    # How candidates are scored. "fast": planning.fast_objective (the same f, R and V arranged for
    # throughput; used when the model is a WorldModel, otherwise the eager path runs). "eager":
    # the model's own dynamics / reward / value calls, the reference the fast path is tested
    # against (docs/planner.md).
    evaluator: str = "fast"
    # The fast evaluator's compute dtype. "float32": the eager reference's precision (its returns
    # agree with it to float rounding). "bfloat16": f, R and V with bfloat16 weights and
    # activations (returns in float32), for CPUs with bf16 instructions (AVX512-BF16, AMX) and
    # GPUs; its bound against the reference and its closed-loop check are in docs/planner.md.
    precision: str = "float32"

    def __post_init__(self) -> None:
        problems = []
        if self.horizon < 1:
            problems.append(f"horizon must be >= 1, got {self.horizon}")
        if len(self.action_low) != len(self.action_high) or not self.action_low:
            problems.append(
                f"action_low/high must be non-empty and equally long, got "
                f"{len(self.action_low)} and {len(self.action_high)}"
            )
        elif not all(lo < hi for lo, hi in zip(self.action_low, self.action_high)):
            problems.append(
                f"need action_low < action_high, got {self.action_low} / {self.action_high}"
            )
        if self.num_samples < 1:
            problems.append(f"num_samples must be >= 1, got {self.num_samples}")
        if not 0.0 <= self.mixture_coef <= 1.0:
            problems.append(f"mixture_coef must be in [0, 1], got {self.mixture_coef}")
        if self.iterations < 1:
            problems.append(f"iterations must be >= 1, got {self.iterations}")
        if not 1 <= self.num_elites <= self.num_candidates:
            problems.append(
                f"num_elites must be in [1, {self.num_candidates}] (candidates), "
                f"got {self.num_elites}"
            )
        for name in ("temperature", "init_std", "min_std"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("policy_noise_std", "policy_prior"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.momentum < 1.0:
            problems.append(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0.0 < self.discount <= 1.0:
            problems.append(f"discount must be in (0, 1], got {self.discount}")
        if not 1 <= self.delay <= self.horizon:
            problems.append(f"delay must be in [1, horizon={self.horizon}], got {self.delay}")
        if not 0 <= self.value_discount_offset <= 1:
            problems.append(
                f"value_discount_offset must be 0 or 1, got {self.value_discount_offset}"
            )
        if self.evaluator not in EVALUATORS:
            problems.append(f"evaluator must be one of {EVALUATORS}, got {self.evaluator!r}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        elif self.precision != "float32" and self.evaluator != "fast":
            problems.append(f"precision {self.precision} needs evaluator 'fast'")
        if self.warm_start not in WARM_STARTS:
            problems.append(f"warm_start must be one of {WARM_STARTS}, got {self.warm_start!r}")
        if self.std_scale and (
            len(self.std_scale) != len(self.action_low) or not all(u > 0 for u in self.std_scale)
        ):
            problems.append(
                f"std_scale must be empty or {len(self.action_low)} positive values, "
                f"got {self.std_scale}"
            )
        if self.max_nonfinite_candidates < 0:
            problems.append(
                f"max_nonfinite_candidates must be >= 0, got {self.max_nonfinite_candidates}"
            )
        if problems:
            raise ValueError("invalid PlannerConfig: " + "; ".join(problems))

    @property
    def action_dim(self) -> int:
        return len(self.action_low)

    @property
    def num_policy_samples(self) -> int:
        return int(self.num_samples * self.mixture_coef)

    @property
    def num_candidates(self) -> int:
        return self.num_samples + self.num_policy_samples


# Go2 rewards are IsaacLab-scaled (x 0.02 s per step) and V^e is in the same units (~3.4), so the
# returns of one step's candidates differ by ~1. At the official temperature 0.25 the elite
# weights are then nearly uniform (e^(0.25 * 1) = 1.3): the mean averaged 6 base-policy chunks
# with 26 random ones and the robot fell within 2 s on the sim slope. Measured on go2_slope sim
# (docs/planner.md): 0.25 / 2 / 5 / 10 / 30 / 100 / 300 -> 30 and 100 best (4 of 5 crossings).
GO2_TEMPERATURE = 30.0


# What the presets of the self-pretrained models change from the official controller: the
# TD-MPC warm start, gamma^T on the value and candidates clamped into the action bounds. They are
# the settings those models were measured with (docs/planner.md).
PROJECT_RETURN = dict(warm_start="shift", value_discount_offset=0, clamp_actions=True)


def official_planner_config(action_low, action_high, **overrides) -> PlannerConfig:
    """The official SimDist controller on the Go2 (mppi.yaml and MppiController as released):
    450 + 22 candidates, 8 iterations, 64 elites, temperature 0.25, H = T = 25, the "roll" warm
    start, gamma^(T+1) on the value, no clamping. For imported official models (model.official)."""
    return replace(
        PlannerConfig(horizon=25, action_low=tuple(action_low), action_high=tuple(action_high)),
        **overrides,
    )


def go2_planner_config(action_low, action_high, **overrides) -> PlannerConfig:
    """Go2 MPPI for self-pretrained models: the official sample, elite and iteration counts with
    the project's return (PROJECT_RETURN) and a temperature that fits their reward units
    (GO2_TEMPERATURE)."""
    return replace(
        PlannerConfig(
            horizon=25,
            action_low=tuple(action_low),
            action_high=tuple(action_high),
            temperature=GO2_TEMPERATURE,
            **PROJECT_RETURN,
        ),
        **overrides,
    )


def ur5e_planner_config(action_low, action_high, **overrides) -> PlannerConfig:
    """UR5e MPPI: init std 1.0, policy noise 0.1, temperature 0.4, T = 5 (METHOD_NOTES).

    The stds are in units of half the action range (`std_scale`): on the raw bounds (+-5 cm,
    +-0.5 rad per step) a std of 1.0 would put nearly every sample on a bound and the policy
    noise of 0.1 would drown pi's 1-2 cm steps. The official release ships one MPPI file (Go2);
    the sample, elite and iteration counts not fixed by the notes are taken from it unchanged
    (450 + 22 candidates, 64 elites, 8 iterations), with the project's return (PROJECT_RETURN).
    """
    half = tuple((hi - lo) / 2.0 for lo, hi in zip(action_low, action_high))
    return replace(
        PlannerConfig(
            horizon=5,
            action_low=tuple(action_low),
            action_high=tuple(action_high),
            init_std=1.0,
            policy_noise_std=0.1,
            temperature=0.4,
            std_scale=half,
            **PROJECT_RETURN,
        ),
        **overrides,
    )


# The one source of the planner's defaults: a preset per robot (its self-pretrained models) and
# the official controller's (Go2). The planner node's parameter defaults and the `planner:`
# sections of config/*.yaml are these factories' values (tested value by value).
PLANNER_CONFIGS = {"go2": go2_planner_config, "ur5e": ur5e_planner_config}
OFFICIAL_PRESET = "official"
PLANNER_PRESETS = {**PLANNER_CONFIGS, OFFICIAL_PRESET: official_planner_config}
PRESET_ROBOT = {"go2": "go2", "ur5e": "ur5e", OFFICIAL_PRESET: "go2"}  # the robot of each preset


def default_preset(robot: str, model_config=None) -> str:
    """The preset a model plans with unless one is named: the official controller's for an
    imported official model (model.official.is_official), else its robot's."""
    if model_config is not None and is_official(model_config):
        return OFFICIAL_PRESET
    return robot


def planner_config_for(spec, preset: str = "", **overrides) -> PlannerConfig:
    """A preset's PlannerConfig (default: the robot's own) with the action bounds of the robot's
    RobotSpec; `overrides` replace fields by name."""
    preset = preset or spec.name
    if preset not in PLANNER_PRESETS:
        raise ValueError(f"unknown planner preset {preset!r}; known: {sorted(PLANNER_PRESETS)}")
    if PRESET_ROBOT[preset] != spec.name:
        raise ValueError(
            f"planner preset {preset!r} is for the {PRESET_ROBOT[preset]}, not the {spec.name}"
        )
    return PLANNER_PRESETS[preset](spec.action_low, spec.action_high, **overrides)


@dataclass(frozen=True)
class PlanTimings:
    encode_s: float  # encoder, history encoder, f's context K / V, base policy, candidate noise
    optimise_s: float  # the MPPI iterations
    total_s: float  # whole step including the final host transfer


@dataclass(frozen=True)
class PlanResult:
    action: np.ndarray  # (A,) the mean's first action, to execute now
    mean: np.ndarray  # (T, A) planned mean chunk
    rewards: np.ndarray  # (T,) predicted r^_t..r^_{t+T-1} along the mean
    values: np.ndarray  # (T,) predicted v^_{t+1}..v^_{t+T} along the mean
    expected_return: float  # discounted return of the mean chunk
    policy_chunk: np.ndarray  # (T, A) the base policy's (un-noised) chunk
    nonfinite_candidates: int  # candidate evaluations discarded this step
    timings: PlanTimings


# Order of the device-side health flags resolved once per step.
_FLAG_NAMES = (
    "observation input",
    "encoder latent z",
    "history tokens",
    "base-policy chunk",
    "mean-trajectory prediction",
)


class MPPIPlanner:
    """Stateful MPPI: call `reset()` at episode start, `plan()` once per control step."""

    def __init__(
        self, model: WorldModelLike, config: PlannerConfig, device: str | torch.device = "cpu"
    ):
        self.model = model
        self.config = config
        self.device = torch.device(device)
        if self.device.type == "cpu":
            retain_freed_memory()  # planning reuses its memory instead of page-faulting per step
        c, dev = config, self.device
        T, A, S, P = c.horizon, c.action_dim, c.num_samples, c.num_policy_samples
        self._low = torch.tensor(c.action_low, dtype=torch.float32, device=dev)
        self._high = torch.tensor(c.action_high, dtype=torch.float32, device=dev)
        self._discounts = c.discount ** torch.arange(T, dtype=torch.float32, device=dev)
        self._tail_discount = c.discount ** (T + c.value_discount_offset)
        self._discounts_np = self._discounts.cpu().numpy()
        unit = torch.tensor(c.std_scale or (1.0,) * A, dtype=torch.float32, device=dev)
        self._init_std, self._min_std = c.init_std * unit, c.min_std * unit
        self._prior_scale = 1.0 / unit
        self._policy_noise_scale = c.policy_noise_std * unit
        self._generator = torch.Generator(device=dev)
        # Buffers reused every step: the candidate chunks and their noise, mean/std state.
        self._actions = torch.empty(S + P, T, A, device=dev)
        self._noise = torch.empty(S, T, A, device=dev)
        self._policy_noise = torch.empty(P, T, A, device=dev)
        self._mean = torch.empty(T, A, device=dev)
        self._prev_mean = torch.empty(T, A, device=dev)
        self._std = torch.empty(T, A, device=dev)
        self._latents: torch.Tensor | None = None  # (S + P, T + 1, D), sized on first plan()
        check_precision(config, model, self.device)
        self._fast = (
            FastObjective(model, self._discounts, self._tail_discount, getattr(torch, c.precision))
            if c.evaluator == "fast" and FastObjective.supports(model)
            else None
        )
        self.reset()

    @property
    def evaluator(self) -> str:
        """The evaluator that scores candidates: "fast" or "eager" (config.evaluator "fast" on a
        model the fast path does not support runs "eager")."""
        return "eager" if self._fast is None else "fast"

    def reset(self, seed: int | None = None) -> None:
        """Forget the warm start and reseed; the next plan starts from a zero mean."""
        self._generator.manual_seed(self.config.seed if seed is None else seed)
        with torch.no_grad():
            self._mean.zero_()
            self._clamp(self._mean)

    def plan(
        self,
        obs: dict[str, torch.Tensor],
        proprio_history: torch.Tensor,
        action_history: torch.Tensor,
    ) -> PlanResult:
        """One control step. obs: model-input dict with batch 1; histories (1, H, P) / (1, H, A)."""
        if getattr(self.model, "training", False):
            raise PlannerError(
                "the world model is in training mode (dropout on); call model.eval() first"
            )
        with torch.no_grad():
            try:
                return self._plan(obs, proprio_history, action_history)
            except PlannerError:
                self._mean.zero_()  # a poisoned warm start must not carry into the next step
                self._clamp(self._mean)
                raise

    # -- internals ---------------------------------------------------------------------------

    def _plan(self, obs, proprio_history, action_history) -> PlanResult:
        c, model = self.config, self.model
        T, A, S, N = c.horizon, c.action_dim, c.num_samples, c.num_candidates
        start = time.perf_counter()
        obs, proprio_history, action_history = self._to_device(obs, proprio_history, action_history)
        command = obs.get("command")

        z = model.encode(obs)
        if z.ndim != 2 or z.shape[0] != 1:
            raise PlannerError(f"model.encode returned shape {tuple(z.shape)}, expected (1, D)")
        history = model.encode_history(proprio_history, action_history)
        policy_chunk = model.policy(z, history, command, obs["proprio"])
        if tuple(policy_chunk.shape) != (1, T, A):
            raise PlannerError(
                f"model.policy returned shape {tuple(policy_chunk.shape)}, expected (1, {T}, {A}): "
                f"the planner horizon/action_dim must match the model's"
            )
        flags = [
            _any_nonfinite(*obs.values(), proprio_history, action_history),
            _any_nonfinite(z),
            _any_nonfinite(history),
            _any_nonfinite(policy_chunk),
        ]
        context = model.dynamics_context(z, history)  # f's K / V: once per step, for all candidates
        score = self._scorer(z, history, context, command, N)

        # Warm start (see PlannerConfig.warm_start); the std restarts wide.
        d = c.delay
        if c.warm_start == "roll":
            self._prev_mean.copy_(self._mean)
            self._mean[:d].copy_(self._prev_mean[T - d :])
            self._mean[d:].zero_()
        elif c.warm_start == "shift":
            self._prev_mean.copy_(self._mean)
            self._mean[: T - d].copy_(self._prev_mean[d:])
            self._mean[T - d :].zero_()
        else:
            self._mean.copy_(policy_chunk[0])
        self._clamp(self._mean)
        self._std.copy_(self._init_std.expand(T, A))
        # Base-policy candidates: noised once per step, reused by every iteration.
        policy_part = self._actions[S:]
        torch.randn(
            self._policy_noise.shape,
            generator=self._generator,
            device=self.device,
            out=self._policy_noise,
        )
        torch.addcmul(
            policy_chunk[0], self._policy_noise, self._policy_noise_scale, out=policy_part
        )
        self._clamp(policy_part)
        self._sync()
        encoded = time.perf_counter()

        nonfinite = torch.zeros((), dtype=torch.int64, device=self.device)
        gaussian_part = self._actions[:S]
        policy_scores = None  # the base-policy candidates' (returns, bad): fixed for the step
        for _ in range(c.iterations):
            torch.randn(
                self._noise.shape, generator=self._generator, device=self.device, out=self._noise
            )
            torch.addcmul(self._mean, self._std, self._noise, out=gaussian_part)
            self._clamp(gaussian_part)
            if policy_scores is None:
                returns, bad = score(self._actions)
                policy_scores = returns[S:], bad[S:]
            else:  # only the Gaussian candidates are new
                returns, bad = (
                    torch.cat(pair) for pair in zip(score(gaussian_part), policy_scores)
                )
            nonfinite += bad.sum()
            if c.policy_prior:
                returns = returns - c.policy_prior * self.policy_distance(
                    self._actions, policy_chunk[0]
                )
            self._update(torch.where(bad, -math.inf, returns))
        optimised = time.perf_counter()

        # Predicted rewards / values along the final mean, for the plan topic and diagnostics.
        mean_actions = self._mean.unsqueeze(0)
        mean_latents = torch.cat(
            [z.unsqueeze(1), model.dynamics(z, mean_actions, history, context)], dim=1
        )
        rewards = model.reward(mean_latents, mean_actions, command)
        values = model.value(mean_latents, command)
        flags.append(_any_nonfinite(mean_latents, rewards, values, self._mean))

        # One host transfer resolves every check and brings back the plan.
        packed = (
            torch.cat(
                [
                    torch.stack(flags).float(),
                    nonfinite.float().view(1),
                    self._mean.flatten(),
                    rewards[0].float(),
                    values[0].float(),
                    policy_chunk[0].flatten().float(),
                ]
            )
            .cpu()
            .numpy()
        )
        nf = len(_FLAG_NAMES)
        bad_parts = [name for name, flag in zip(_FLAG_NAMES, packed[:nf]) if flag]
        n_bad = int(packed[nf])
        if bad_parts or n_bad > c.max_nonfinite_candidates:
            what = ", ".join(bad_parts) if bad_parts else "candidate predictions"
            raise PlannerError(
                f"non-finite values in {what}; {n_bad} of {N * c.iterations} candidate evaluations "
                f"non-finite (allowed {c.max_nonfinite_candidates}); no action returned"
            )
        o = nf + 1
        mean = packed[o : o + T * A].reshape(T, A)
        rewards_np = packed[o + T * A : o + T * A + T]
        values_np = packed[o + T * A + T : o + T * A + 2 * T]
        policy_np = packed[o + T * A + 2 * T :].reshape(T, A)
        expected = float(rewards_np @ self._discounts_np + self._tail_discount * values_np[-1])
        end = time.perf_counter()
        return PlanResult(
            action=mean[0].copy(),
            mean=mean,
            rewards=rewards_np,
            values=values_np,
            expected_return=expected,
            policy_chunk=policy_np,
            nonfinite_candidates=n_bad,
            timings=PlanTimings(encoded - start, optimised - encoded, end - start),
        )

    def score(self, obs, proprio_history, action_history, chunks: torch.Tensor) -> torch.Tensor:
        """The objective MPPI ranks candidates by, for given chunks (N, T, A) -> returns (N,).

        For diagnostics (`simdist_planner.probe`); the planner's state is not touched. Raises
        PlannerError on a non-finite prediction.
        """
        if getattr(self.model, "training", False):
            raise PlannerError(
                "the world model is in training mode (dropout on); call model.eval() first"
            )
        with torch.no_grad():
            obs, proprio_history, action_history = self._to_device(
                obs, proprio_history, action_history
            )
            chunks = chunks.to(self.device, torch.float32)
            n, command = chunks.shape[0], obs.get("command")
            z = self.model.encode(obs)
            history = self.model.encode_history(proprio_history, action_history)
            context = self.model.dynamics_context(z, history)
            returns, bad = self._scorer(z, history, context, command, n)(chunks)
        if bool(bad.any()):
            raise PlannerError(f"non-finite objective for {int(bad.sum())} of {n} chunks")
        return returns

    def policy_distance(self, chunks: torch.Tensor, policy_chunk: torch.Tensor) -> torch.Tensor:
        """Chunks (N, T, A) -> their squared deviation from pi's chunk (T, A), in std_scale
        units, summed over A and averaged over T (N,): what `policy_prior` weighs."""
        return ((chunks - policy_chunk) * self._prior_scale).square().sum(-1).mean(-1)

    def objective(
        self, latents: torch.Tensor, actions: torch.Tensor, command=None
    ) -> tuple[torch.Tensor, ...]:
        """Discounted returns (N,) of latent trajectories (N, T+1, D) under `actions` (N, T, A),
        with the rewards (N, T) and values (N, T) they came from: the planner's objective."""
        rewards = self.model.reward(latents, actions, command)
        values = self.model.value(latents, command)
        return rewards @ self._discounts + self._tail_discount * values[:, -1], rewards, values

    def _scorer(self, z, history, context, command, n: int):
        """The step's candidate scorer: chunks (m <= n, T, A) -> (returns (m,), non-finite mask
        (m,)), on the fast path or the eager one (`evaluator`)."""
        if self._fast is not None:
            return self._fast.prepare(z, history, context, command)
        latents = self._latent_buffer(z, n)
        latents[:, 0].copy_(z.expand(n, -1))

        def evaluate(actions):  # up to n chunks
            m = actions.shape[0]
            command_m = None if command is None else command.expand(m, -1)
            return self._evaluate(
                z.expand(m, -1), history.expand(m, -1, -1), context, command_m, actions, latents[:m]
            )

        return evaluate

    def _evaluate(self, z, history, context, command, actions, latents):
        """Discounted returns (N,) of all candidates in one batched pass, and a non-finite mask."""
        predicted = self.model.dynamics(z, actions, history, context)
        latents[:, 1:].copy_(predicted)
        returns, rewards, values = self.objective(latents, actions, command)
        bad = ~(
            torch.isfinite(predicted).flatten(1).all(1)
            & torch.isfinite(rewards).all(1)
            & torch.isfinite(values).all(1)
        )
        return returns, bad

    def _update(self, returns: torch.Tensor) -> None:
        """Refit mean/std to the elites, weighted by exp(temperature * (R - R_max))."""
        c = self.config
        elite_returns, elite_idx = torch.topk(returns, c.num_elites)
        elites = self._actions[elite_idx]
        weights = torch.softmax(c.temperature * elite_returns, dim=0).view(-1, 1, 1)
        new_mean = (weights * elites).sum(0)
        new_std = (weights * (elites - new_mean).square()).sum(0).sqrt()
        self._mean.mul_(c.momentum).add_(new_mean, alpha=1.0 - c.momentum)
        self._clamp(self._mean)  # a weighted mean of bounded elites can round past a bound
        torch.maximum(new_std, self._min_std, out=self._std)

    def _clamp(self, actions: torch.Tensor) -> None:
        if not self.config.clamp_actions:
            return
        torch.maximum(actions, self._low, out=actions)
        torch.minimum(actions, self._high, out=actions)

    def _latent_buffer(self, z: torch.Tensor, n: int) -> torch.Tensor:
        shape = (n, self.config.horizon + 1, z.shape[1])
        if self._latents is None or self._latents.shape != shape or self._latents.dtype != z.dtype:
            self._latents = torch.empty(shape, dtype=z.dtype, device=self.device)
        return self._latents

    def _to_device(self, obs, proprio_history, action_history):
        for name, t in [
            *obs.items(),
            ("proprio_history", proprio_history),
            ("action_history", action_history),
        ]:
            if not isinstance(t, torch.Tensor) or t.ndim == 0 or t.shape[0] != 1:
                raise PlannerError(
                    f"{name}: expected a tensor with batch dimension 1, got {_describe(t)}"
                )
        if action_history.shape[-1] != self.config.action_dim:
            raise PlannerError(
                f"action_history has action dim {action_history.shape[-1]}, "
                f"expected {self.config.action_dim}"
            )
        move = lambda t: t.to(self.device, non_blocking=True)  # noqa: E731
        return {k: move(v) for k, v in obs.items()}, move(proprio_history), move(action_history)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def bf16_supported(device: torch.device) -> bool:
    """Does `device` do bf16 arithmetic natively (CUDA: Ampere and later; CPU: oneDNN's check
    for AVX512-BF16 / AMX)?"""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def check_precision(config: PlannerConfig, model, device: str | torch.device) -> None:
    """ValueError when `config.precision` cannot run for `model` on `device`: bfloat16 needs the
    fast evaluator's model layout and bf16 arithmetic on the device (on a CPU without bf16
    instructions oneDNN emulates it, slower than float32)."""
    if config.precision == "float32":
        return
    if not FastObjective.supports(model):
        raise ValueError(
            f"precision {config.precision} runs on the fast evaluator, which does not support "
            f"a {type(model).__name__}; use precision float32"
        )
    device = torch.device(device)
    if not bf16_supported(device):
        raise ValueError(
            f"precision {config.precision}: {device} has no bf16 arithmetic (a CPU needs "
            f"AVX512-BF16 or AMX); use precision float32"
        )


def _any_nonfinite(*tensors: torch.Tensor) -> torch.Tensor:
    """A device-side bool scalar: does any floating tensor hold NaN/Inf? (no host sync)."""
    flag = torch.zeros((), dtype=torch.bool, device=tensors[0].device)
    for t in tensors:
        if t.is_floating_point():
            flag = flag | ~torch.isfinite(t).all()
    return flag


def _describe(t) -> str:
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
