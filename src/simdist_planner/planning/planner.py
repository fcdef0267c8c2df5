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

from simdist_planner.planning.config import PlannerConfig
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


@dataclass
class _Step:
    """What one plan() computes once and every later unit reads."""

    z: torch.Tensor  # (1, D)
    history: torch.Tensor  # (1, 2H, D) history tokens
    policy_chunk: torch.Tensor  # (1, T, A) pi's chunk
    command: torch.Tensor | None
    context: Any  # f's cross-attention keys / values (dynamics_context)
    flags: list[torch.Tensor]  # device-side health flags, in _FLAG_NAMES order


class Planner(Protocol):
    """A planner over a world model, as the planner node, the evaluation agents and the probe
    use it; `make_planner` builds one. Stateful: `reset()` at each episode start, `plan()` once
    per control step."""

    model: WorldModelLike
    config: PlannerConfig

    @property
    def evaluator(self) -> str:
        """How it scores candidates: "fast" or "eager"."""
        ...

    def reset(self, seed: int | None = None) -> None:
        """Start an episode: no warm start, the RNG re-seeded.

        Args:
            seed: the RNG seed; None: the config's.

        Returns:
            None.
        """
        ...

    def plan(
        self,
        obs: dict[str, torch.Tensor],
        proprio_history: torch.Tensor,
        action_history: torch.Tensor,
    ) -> PlanResult:
        """Plan one control step.

        Args:
            obs: the observation batch (batch 1; docs/architecture.md, "Model inputs").
            proprio_history: (1, H, P) the last H proprio vectors.
            action_history: (1, H, A) the last H actions.

        Returns:
            The PlanResult: the mean chunk (its first row is the action), predicted rewards and
            values, timings. Raises PlannerError instead of returning a non-finite plan.
        """
        ...

    def score(self, obs, proprio_history, action_history, chunks: torch.Tensor) -> torch.Tensor:
        """The objective's returns of given chunks from one observation.

        Args:
            obs: the observation batch (batch 1).
            proprio_history: (1, H, P).
            action_history: (1, H, A).
            chunks: (N, T, A) candidate action chunks.

        Returns:
            (N,) returns.
        """
        ...

    def objective(
        self, latents: torch.Tensor, actions: torch.Tensor, command=None
    ) -> tuple[torch.Tensor, ...]:
        """The return of latent trajectories.

        Args:
            latents: (N, T + 1, D) predicted latents, the current one first.
            actions: (N, T, A) the chunks that lead along them.
            command: the Go2's velocity command (batch 1 or N); None for the UR5e.

        Returns:
            (returns (N,), rewards (N, T), values (N, T)).
        """
        ...


def make_planner(
    config: PlannerConfig, model: WorldModelLike, device: str | torch.device = "cpu"
) -> Planner:
    """The one place the stack builds a planner (MPPI is the only algorithm; a variant with
    another algorithm branches here).

    Args:
        config: the planner's settings.
        model: the world model it plans with (raw units in and out).
        device: where it plans.

    Returns:
        A Planner (reset it at each episode start).
    """
    return MPPIPlanner(model, config, device)


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
        # replan_period > 1: the latest plan and how many of its actions were executed
        self._last_plan: PlanResult | None = None
        self._executed = 0
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
        self._last_plan, self._executed = None, 0
        with torch.no_grad():
            self._mean.zero_()
            self._clamp(self._mean)

    def plan(
        self,
        obs: dict[str, torch.Tensor],
        proprio_history: torch.Tensor,
        action_history: torch.Tensor,
    ) -> PlanResult:
        """One control step. obs: model-input dict with batch 1; histories (1, H, P) / (1, H, A).

        With `replan_period` k > 1, a new plan is made every k-th call; the calls between return
        the latest plan's next action (its `mean`, `rewards` and `values` are that plan's, its
        timings zero)."""
        if getattr(self.model, "training", False):
            raise PlannerError(
                "the world model is in training mode (dropout on); call model.eval() first"
            )
        last = self._last_plan
        if last is not None and self._executed < self.config.replan_period:
            self._executed += 1
            return replace(
                last, action=last.mean[self._executed - 1].copy(), timings=PlanTimings(0, 0, 0)
            )
        with torch.no_grad():
            try:
                result = self._plan(obs, proprio_history, action_history)
            except PlannerError:
                self._mean.zero_()  # a poisoned warm start must not carry into the next step
                self._clamp(self._mean)
                self._last_plan = None
                raise
        if self.config.replan_period > 1:
            self._last_plan, self._executed = result, 1
        return result

    # -- internals ---------------------------------------------------------------------------

    def _plan(self, obs, proprio_history, action_history) -> PlanResult:
        """One step: encode, warm start, optimise, predict along the mean, resolve the checks."""
        start = time.perf_counter()
        step = self._encode(*self._to_device(obs, proprio_history, action_history))
        score = self._scorer(
            step.z, step.history, step.context, step.command, self.config.num_candidates
        )
        self._warm_start(step.policy_chunk)
        self._sample_policy_candidates(step.policy_chunk)
        self._sync()
        encoded = time.perf_counter()
        nonfinite = self._optimise(score, step.policy_chunk)
        optimised = time.perf_counter()
        rewards, values = self._predict_along_mean(step)
        result = self._resolve(step, nonfinite, rewards, values)
        end = time.perf_counter()
        return replace(
            result, timings=PlanTimings(encoded - start, optimised - encoded, end - start)
        )

    def _encode(self, obs, proprio_history, action_history) -> _Step:
        """The step's encodings (z, history tokens, pi's chunk, f's context K / V, computed once
        for every candidate) and the device-side health flags of what it read and made."""
        c, model = self.config, self.model
        T, A = c.horizon, c.action_dim
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
        context = model.dynamics_context(z, history)
        return _Step(z, history, policy_chunk, command, context, flags)

    def _warm_start(self, policy_chunk: torch.Tensor) -> None:
        """Where this step's mean starts (PlannerConfig.warm_start); the std restarts wide."""
        c = self.config
        T, A, d = c.horizon, c.action_dim, c.warm_start_shift
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

    def _sample_policy_candidates(self, policy_chunk: torch.Tensor) -> None:
        """The base-policy candidates: pi's chunk noised once per step, reused by every
        iteration."""
        policy_part = self._actions[self.config.num_samples :]
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

    def _optimise(self, score, policy_chunk: torch.Tensor) -> torch.Tensor:
        """The MPPI iterations: sample Gaussian candidates around the mean, score them (the
        base-policy candidates once), refit the mean and std on the elites. Returns the count of
        non-finite candidate evaluations (on the device)."""
        c = self.config
        S = c.num_samples
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
        return nonfinite

    def _predict_along_mean(self, step: _Step) -> tuple[torch.Tensor, torch.Tensor]:
        """Predicted rewards and values along the final mean (for the plan topic and
        diagnostics); adds their health flag."""
        model, z = self.model, step.z
        mean_actions = self._mean.unsqueeze(0)
        mean_latents = torch.cat(
            [z.unsqueeze(1), model.dynamics(z, mean_actions, step.history, step.context)], dim=1
        )
        rewards = model.reward(mean_latents, mean_actions, step.command)
        values = model.value(mean_latents, step.command)
        step.flags.append(_any_nonfinite(mean_latents, rewards, values, self._mean))
        return rewards, values

    def _resolve(self, step: _Step, nonfinite, rewards, values) -> PlanResult:
        """One host transfer resolves every check and brings back the plan; PlannerError names
        what was non-finite instead of returning it (timings left zero for the caller)."""
        c = self.config
        T, A, N = c.horizon, c.action_dim, c.num_candidates
        packed = (
            torch.cat(
                [
                    torch.stack(step.flags).float(),
                    nonfinite.float().view(1),
                    self._mean.flatten(),
                    rewards[0].float(),
                    values[0].float(),
                    step.policy_chunk[0].flatten().float(),
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
        return PlanResult(
            action=mean[0].copy(),
            mean=mean,
            rewards=rewards_np,
            values=values_np,
            expected_return=expected,
            policy_chunk=policy_np,
            nonfinite_candidates=n_bad,
            timings=PlanTimings(0.0, 0.0, 0.0),
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
    """Whether a device does bf16 arithmetic natively (CUDA: Ampere and later; CPU: oneDNN's check
    for AVX512-BF16 / AMX).

    Args:
        device: the torch device.

    Returns:
        True when it does.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def check_precision(config: PlannerConfig, model, device: str | torch.device) -> None:
    """Whether `config.precision` can run for a model on a device: bfloat16 needs the fast
    evaluator's model layout and bf16 arithmetic on the device (on a CPU without bf16 instructions
    oneDNN emulates it, slower than float32).

    Args:
        config: the planner's settings.
        model: the world model.
        device: where it plans.

    Returns:
        None; ValueError says why the precision cannot run.
    """
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
