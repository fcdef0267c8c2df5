"""Chunk-ranking probe (`simdist-probe`): does a model's planner objective order action chunks the
way the simulator does?

MPPI can only execute what its objective ranks first. When the planner fails, either no good
chunk was among its candidates (the search) or the objective ranked a bad one above it (the
model). The probe tells which. Along one driver's rollout (the privileged expert, or the first
model's base policy pi) it stops every `every` control steps and scores the same candidate chunks
three ways:

- truth: the chunk executed open loop in a copy of the task: discounted task rewards plus
  gamma^n V^e at the end, nothing after a failure (a fall);
- model: the planner's own objective (`Planner.score`: R and V over f's predicted latents);
- oracle f: the same R and V over the encoded latents of the observations the chunk really
  produced, i.e. what a perfect f would give with this model's E, R and V (which Algorithm 1
  keeps frozen).

Candidates: the expert's own next T actions (a look-ahead in a copy of the task), the first
model's pi chunk, the zero-action chunk (standing: the Go2 holds its default stance), and noised
pi chunks. Whether the objective ranks the expert's walk above standing, with f's latents and
with the oracle's, says whether the frozen R and V reward the motion the task needs.
Simulation tasks only. A look-ahead starts from a deep
copy of the task; a task that cannot be copied (the UR5e's holds an MjSpec) needs a `twin` built
the same way, which replays the episode's seed and actions (MuJoCo steps deterministically; a
replay that does not reproduce the driver's observation raises).

    simdist-probe --task slippery_slope --variant real --checkpoint pre=PRETRAINED \\
        --checkpoint adapted=ADAPTED --driver expert --seeds 0,1,2,3 --max-steps 400
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from robot_drivers.interface import Observation
from robot_drivers.registry import expert_ladder, expert_value
from robot_drivers.tasks.base import Task
from simdist_planner.evaluation.agents import policy_chunk
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning.config import default_preset, planner_config_for
from simdist_planner.planning.observation import ObservationHistory, observation_to_inputs
from simdist_planner.planning.planner import Planner, make_planner

DRIVERS = ("expert", "policy")
EXPERT, PI, STAND = 0, 1, 2  # candidate indices; noised pi chunks follow


@dataclass(frozen=True)
class ProbeConfig:
    driver: str = "expert"  # whose rollout visits the probe states
    every: int = 10  # control steps between probes
    start: int = 10  # first probe step (the history is filled with real steps by then)
    noise_stds: tuple[float, ...] = (
        0.1,
        0.3,
        0.6,
    )  # noised pi candidates, in the planner's std units
    per_noise: int = 5  # candidates per noise level
    seed: int = 0  # candidate noise

    def __post_init__(self):
        problems = []
        if self.driver not in DRIVERS:
            problems.append(f"driver must be one of {DRIVERS}, got {self.driver!r}")
        if self.every < 1 or self.start < 0 or self.per_noise < 0:
            problems.append(
                f"need every >= 1, start >= 0, per_noise >= 0; got {self.every}, "
                f"{self.start}, {self.per_noise}"
            )
        if any(not s > 0 for s in self.noise_stds):
            problems.append(f"noise_stds must be > 0, got {self.noise_stds}")
        if problems:
            raise ValueError("invalid ProbeConfig: " + "; ".join(problems))


@dataclass
class ProbePoint:
    """One probe state: the scores of every candidate (index EXPERT, PI, STAND, then noised pi)."""

    episode_seed: int
    step: int
    truth: list[float]
    failed: list[bool]  # the chunk ended the episode in failure
    model: dict[str, list[float]] = field(default_factory=dict)
    oracle: dict[str, list[float]] = field(default_factory=dict)


def rank_correlation(a, b) -> float:
    """Spearman's rho with average ranks for ties; nan when either side is constant."""
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    for value in np.unique(x):  # ties share their mean rank
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def open_loop(
    sim: Task, obs: Observation, chunk: np.ndarray, critic, discount: float
) -> tuple[float, bool, list[Observation]]:
    """Execute `chunk` in `sim`, a look-ahead task at `obs`: (true return, failed, o_t..o_t+n)."""
    observations, ret = [obs], 0.0
    for i, action in enumerate(chunk):
        result = sim.step(action)
        ret += discount**i * result.reward
        observations.append(result.obs)
        if result.terminated or result.truncated:
            break
    failed = result.terminated and not result.success
    if not failed:
        ret += discount ** len(chunk) * float(critic(result.obs))
    return ret, failed, observations


def expert_chunk(sim: Task, obs: Observation, expert, horizon: int) -> np.ndarray:
    """The expert's next `horizon` actions from `obs`, letting a copy of it drive `sim`, a
    look-ahead task now at `obs`."""
    policy = copy.deepcopy(expert)
    actions = []
    for _ in range(horizon):
        actions.append(np.asarray(policy.act(obs), np.float32))
        result = sim.step(actions[-1])
        obs = result.obs
        if result.terminated or result.truncated:
            break
    actions += [actions[-1]] * (horizon - len(actions))  # the episode ended: hold the last one
    return np.stack(actions)


def copyable(task: Task) -> bool:
    """Whether `copy.deepcopy(task)` works (else the probe needs a twin to replay in)."""
    try:
        copy.deepcopy(task)
    except Exception:  # noqa: BLE001 - any failure means no copy
        return False
    return True


def _same_state(a: Observation, b: Observation) -> bool:
    """Bit-equal proprioception and privileged simulator state."""
    pa, pb = a.privileged or {}, b.privileged or {}
    return (
        np.array_equal(a.proprio, b.proprio)
        and pa.keys() == pb.keys()
        and all(np.array_equal(pa[k], pb[k]) for k in pa)
    )


class ChunkProbe:
    """Scores candidate chunks with each model and with the simulator, along one rollout."""

    def __init__(
        self,
        task: Task,
        models: dict[str, WorldModel],
        config: ProbeConfig = ProbeConfig(),
        device="cpu",
        twin: Task | None = None,
        **planner_overrides,
    ):
        if not models:
            raise ValueError("the probe needs at least one model")
        shapes = {(m.config.history, m.config.horizon) for m in models.values()}
        if len(shapes) != 1:
            raise ValueError(
                f"the models must share history and horizon (one history buffer, one "
                f"candidate set); got (history, horizon) {sorted(shapes)}"
            )
        if twin is None and not copyable(task):
            raise ValueError(
                f"the probe copies the task to look ahead; {task.name} cannot be "
                f"copied: pass a twin task, built the same way, to replay the episode in"
            )
        self.task, self.twin, self.config, self.device = task, twin, config, torch.device(device)
        self._seed: int | None = None
        self._actions: list[np.ndarray] = []  # the driver's actions this episode (for the twin)
        self.reference = next(iter(models.values()))
        self.horizon = self.reference.config.horizon
        preset = planner_overrides.pop("preset", "")
        self.planners = {
            name: make_planner(
                planner_config_for(
                    task.spec,
                    preset or default_preset(task.spec.name, m.config),
                    horizon=self.horizon,
                    **planner_overrides,
                ),
                m,
                device,
            )
            for name, m in models.items()
        }
        first = next(iter(self.planners.values())).config
        self.discount = first.discount
        # noise in the planner's std units (PlannerConfig.std_scale): half the range for the UR5e
        self._noise_unit = np.asarray(first.std_scale or (1.0,) * first.action_dim, np.float32)
        self.expert, self.critic = expert_ladder(task)[0], expert_value(task)
        self._low, self._high = np.asarray(task.spec.action_low), np.asarray(task.spec.action_high)
        self._rng = np.random.default_rng(config.seed)

    def run(self, seed: int, max_steps: int | None = None) -> list[ProbePoint]:
        """One driver episode from `task.reset(seed)`, probing along the way."""
        cfg, spec = self.config, self.task.spec
        obs = self.task.reset(seed)
        self._seed, self._actions = seed, []
        self.expert.reset(seed)
        history = ObservationHistory(spec, self.reference.config.history)
        history.reset(obs)
        points = []
        for k in range(max_steps or self.task.max_steps):
            probing = k >= cfg.start and (k - cfg.start) % cfg.every == 0
            if probing or cfg.driver == "policy":
                inputs = observation_to_inputs(obs, spec, self.device)
                proprio, actions = history.tensors(self.device)
                pi = policy_chunk(self.reference, inputs, proprio, actions)
            if probing:
                points.append(self._probe(seed, k, obs, inputs, proprio, actions, pi))
            if cfg.driver == "expert":  # as simdist-eval runs it: unclipped
                action = np.asarray(self.expert.act(obs), np.float32)
            else:  # as the Agent runs pi: clipped into the action bounds
                action = np.clip(pi[0], self._low, self._high).astype(np.float32)
            history.push(obs, action)
            self._actions.append(action)
            result = self.task.step(action)
            obs = result.obs
            if result.terminated or result.truncated:
                break
        return points

    def _candidates(self, obs: Observation, pi: np.ndarray) -> np.ndarray:
        noised = [
            pi + self._rng.normal(0.0, std, pi.shape) * self._noise_unit
            for std in self.config.noise_stds
            for _ in range(self.config.per_noise)
        ]
        chunks = np.stack(
            [
                expert_chunk(self._fork(obs), obs, self.expert, self.horizon),
                pi,
                np.zeros_like(pi),
                *noised,
            ]
        )
        return np.clip(chunks, self._low, self._high).astype(np.float32)

    def _probe(self, seed, step, obs, inputs, proprio, actions, pi) -> ProbePoint:
        chunks = self._candidates(obs, pi)
        runs = [open_loop(self._fork(obs), obs, c, self.critic, self.discount) for c in chunks]
        point = ProbePoint(seed, step, [r[0] for r in runs], [bool(r[1]) for r in runs])
        chunk_t = torch.as_tensor(chunks, device=self.device)
        for name, planner in self.planners.items():
            point.model[name] = planner.score(inputs, proprio, actions, chunk_t).cpu().tolist()
            point.oracle[name] = self._oracle(
                planner, [r[2] for r in runs], chunk_t, inputs.get("command")
            )
        return point

    def _fork(self, obs: Observation) -> Task:
        """A task in the driver's current state `obs` to look ahead in."""
        if self.twin is None:
            return copy.deepcopy(self.task)
        replayed = self.twin.reset(self._seed)
        for action in self._actions:
            replayed = self.twin.step(action).obs
        if not _same_state(replayed, obs):
            raise RuntimeError(
                f"replaying seed {self._seed} for {len(self._actions)} steps in the twin "
                f"did not reproduce the driver's observation: {self.task.name} does not "
                f"step deterministically, so the twin cannot stand in for a copy"
            )
        return self.twin

    def _oracle(self, planner: Planner, observations, chunks, command) -> list[float]:
        """R and V over E(o_t..o_t+T) of what each chunk really produced (the last latent repeated
        when the episode ended early)."""
        model, spec, n = planner.model, self.task.spec, len(observations)
        with torch.no_grad():
            latents = []
            for seq in observations:
                batch = [observation_to_inputs(o, spec, self.device) for o in seq]
                z = model.encode({key: torch.cat([b[key] for b in batch]) for key in batch[0]})
                latents.append(torch.cat([z, z[-1:].expand(self.horizon + 1 - len(z), -1)]))
            returns, _, _ = planner.objective(
                torch.stack(latents), chunks, None if command is None else command.expand(n, -1)
            )
        return returns.cpu().tolist()


@dataclass
class ProbeSummary:
    model: str
    points: int
    rank_corr: float  # mean Spearman rho, model objective vs truth
    oracle_rank_corr: float  # the same with a perfect f
    prefers_expert: (
        float  # fraction of states where the objective ranks the expert's chunk above pi's
    )
    oracle_prefers_expert: float
    truth_prefers_expert: float
    # fraction of states where the expert's chunk ranks above standing (the zero chunk)
    walk_over_stand: float
    oracle_walk_over_stand: float
    truth_walk_over_stand: float
    pick_quantile: (
        float  # mean truth quantile of the objective's top candidate (1 = the truly best)
    )


def summarize(name: str, points: list[ProbePoint]) -> ProbeSummary:
    def quantile(p: ProbePoint) -> float:
        truth = np.asarray(p.truth)
        return float(np.mean(truth <= truth[int(np.argmax(p.model[name]))]))

    def mean(values) -> float:
        values = [v for v in values if np.isfinite(v)]
        return float(np.mean(values)) if values else float("nan")

    return ProbeSummary(
        model=name,
        points=len(points),
        rank_corr=mean(rank_correlation(p.model[name], p.truth) for p in points),
        oracle_rank_corr=mean(rank_correlation(p.oracle[name], p.truth) for p in points),
        prefers_expert=mean(p.model[name][EXPERT] > p.model[name][PI] for p in points),
        oracle_prefers_expert=mean(p.oracle[name][EXPERT] > p.oracle[name][PI] for p in points),
        truth_prefers_expert=mean(p.truth[EXPERT] > p.truth[PI] for p in points),
        walk_over_stand=mean(p.model[name][EXPERT] > p.model[name][STAND] for p in points),
        oracle_walk_over_stand=mean(p.oracle[name][EXPERT] > p.oracle[name][STAND] for p in points),
        truth_walk_over_stand=mean(p.truth[EXPERT] > p.truth[STAND] for p in points),
        pick_quantile=mean(quantile(p) for p in points),
    )


def format_table(summaries: list[ProbeSummary], title: str) -> str:
    head = (
        f"{'model':<16} {'states':>6} {'rank corr':>9} {'oracle f':>8} {'expert>pi':>9} "
        f"{'oracle f':>8} {'truth':>6} {'walk>stand':>10} {'oracle f':>8} {'truth':>6} "
        f"{'pick quantile':>13}"
    )
    lines = [title, head, "-" * len(head)]
    for s in summaries:
        lines.append(
            f"{s.model:<16} {s.points:>6d} {s.rank_corr:>9.3f} {s.oracle_rank_corr:>8.3f} "
            f"{s.prefers_expert:>9.2f} {s.oracle_prefers_expert:>8.2f} "
            f"{s.truth_prefers_expert:>6.2f} {s.walk_over_stand:>10.2f} "
            f"{s.oracle_walk_over_stand:>8.2f} {s.truth_walk_over_stand:>6.2f} "
            f"{s.pick_quantile:>13.2f}"
        )
    return "\n".join(lines)
