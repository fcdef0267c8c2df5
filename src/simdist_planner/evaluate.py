"""Closed-loop evaluation in simulation (`simdist-eval`): expert, base policy pi, SimDist planner.

    simdist-eval --task peg --region wide --checkpoint CKPT --episodes 50
    simdist-eval --task go2_flat --checkpoint CKPT --agents policy,planner --device cuda
    simdist-eval --ablation [--small]          # Table I rows, see simdist_planner.ablation

Every agent runs the same seeded episodes (seed, seed + 1, ...; the seed resets both the task and
the agent). The table gives the success rate, the mean episode return (sum of the task's
privileged reward), the mean distance travelled (Go2), the mean episode length, episodes per
minute, and how many episodes the agent aborted on an error (counted as failures).
`--episodes-out FILE` also writes one JSON line per episode with the task's report of its last
step (the peg task: depth, xy error, tilt, whether it is held), to see where failures end.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from robot_drivers.interface import Observation, RobotSpec
from robot_drivers.tasks import Policy, Task, expert_ladder, make_task
from simdist_planner.observation import ObservationError, ObservationHistory, observation_to_inputs
from simdist_planner.planner import WARM_STARTS, MPPIPlanner, PlannerError, planner_config_for

AGENTS = ("expert", "policy", "planner")
UR5E_TASKS = ("peg", "table_leg")


class Agent:
    """A world model as a `Policy` over Observations: MPPI (`planner`) or its base policy pi alone.

    Keeps the proprio/action history the model conditions on; the first observation of an
    episode fills it (o_0 repeated, zero actions), as the dataset windows do.
    """

    def __init__(self, model, spec: RobotSpec, planner: MPPIPlanner | None = None, device="cpu"):
        check_model_fits(model, spec)
        cfg = model.config
        self.model, self.spec, self.planner = model, spec, planner
        self.device = torch.device(device)
        self.history = ObservationHistory(spec, cfg.history)
        self._low, self._high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        self._fresh = True
        self.last_plan = None  # the planner's PlanResult of the latest step (diagnostics)

    def reset(self, seed: int | None = None) -> None:
        if self.planner is not None:
            self.planner.reset(seed)
        self._fresh = True
        self.last_plan = None

    def act(self, obs: Observation) -> np.ndarray:
        if self._fresh:
            self.history.reset(obs)
            self._fresh = False
        inputs = observation_to_inputs(obs, self.spec, self.device)
        proprio, actions = self.history.tensors(self.device)
        if self.planner is not None:
            self.last_plan = self.planner.plan(inputs, proprio, actions)
            action = self.last_plan.action
        else:
            action = self._policy_action(inputs, proprio, actions)
        action = np.clip(action, self._low, self._high).astype(np.float32)
        self.history.push(obs, action)
        return action

    def _policy_action(self, inputs, proprio, actions) -> np.ndarray:
        return policy_chunk(self.model, inputs, proprio, actions)[0]


def check_model_fits(model, spec: RobotSpec) -> None:
    """Raise ValueError unless the world model's inputs and outputs are this robot's."""
    cfg = model.config
    mismatch = [
        f"{name} {mine} != robot {theirs}"
        for name, mine, theirs in (
            ("proprio_dim", cfg.proprio_dim, spec.proprio_dim),
            ("action_dim", cfg.action_dim, spec.action_dim),
            ("command_dim", cfg.command_dim, spec.command_dim),
            ("cameras", tuple(cfg.image.cameras) if cfg.image else (), tuple(spec.cameras)),
        )
        if mine != theirs
    ]
    if mismatch:
        raise ValueError(f"model ({cfg.robot}) does not fit robot {spec.name}: " + "; ".join(mismatch))


def policy_chunk(model, inputs, proprio, actions) -> np.ndarray:
    """pi's action chunk (T, A) for model inputs and history tensors (batch 1); never non-finite."""
    with torch.no_grad():
        z = model.encode(inputs)
        history = model.encode_history(proprio, actions)
        chunk = model.policy(z, history, inputs.get("command"), inputs["proprio"])[0].float().cpu().numpy()
    if not np.all(np.isfinite(chunk)):
        raise PlannerError(f"base policy produced a non-finite action chunk (first action {chunk[0].tolist()})")
    return chunk


@dataclass(frozen=True)
class EpisodeStats:
    success: bool
    episode_return: float
    distance: float  # NaN where the task reports none
    steps: int
    seconds: float
    seed: int
    end: dict  # the task's info of the last step taken
    error: str = ""  # why the agent aborted the episode, if it did


@dataclass(frozen=True)
class AgentSummary:
    agent: str
    episodes: int
    success_rate: float
    mean_return: float
    mean_distance: float
    mean_steps: float
    episodes_per_minute: float
    errors: int


def run_episode(task: Task, policy: Policy, seed: int) -> EpisodeStats:
    """One seeded episode of at most task.max_steps; a PlannerError / ObservationError ends it
    as a failure (the task is never stepped with that agent's garbage)."""
    start = time.perf_counter()
    obs = task.reset(seed)
    policy.reset(seed)
    total, distance, steps, success, end = 0.0, math.nan, 0, False, {}
    try:
        while steps < task.max_steps:
            result = task.step(policy.act(obs))
            obs, steps, end = result.obs, steps + 1, result.info
            total += result.reward
            distance = float(result.info.get("distance", math.nan))
            success = result.success
            if result.terminated or result.truncated:
                break
    except (PlannerError, ObservationError) as err:
        return EpisodeStats(False, total, distance, steps, time.perf_counter() - start, seed, end, str(err))
    return EpisodeStats(bool(success), total, distance, steps, time.perf_counter() - start, seed, end)


def summarize(agent: str, stats: list[EpisodeStats]) -> AgentSummary:
    seconds = sum(s.seconds for s in stats)
    distances = [s.distance for s in stats if not math.isnan(s.distance)]
    return AgentSummary(
        agent=agent,
        episodes=len(stats),
        success_rate=float(np.mean([s.success for s in stats])),
        mean_return=float(np.mean([s.episode_return for s in stats])),
        mean_distance=float(np.mean(distances)) if distances else math.nan,
        mean_steps=float(np.mean([s.steps for s in stats])),
        episodes_per_minute=60.0 * len(stats) / seconds if seconds > 0 else math.inf,
        errors=sum(bool(s.error) for s in stats),
    )


def evaluate(task: Task, agents: dict[str, Policy], episodes: int, seed: int = 0,
             progress: bool = True, episodes_out=None) -> list[AgentSummary]:
    """Run every agent on the same `episodes` seeds; one summary per agent, in order.
    `episodes_out`: a JSON-lines file that gets each episode's stats as it ends."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    from tqdm import tqdm

    summaries = []
    for name, policy in agents.items():
        stats = []
        for i in tqdm(range(episodes), desc=f"{task.name} {name}", unit="ep", disable=not progress):
            stats.append(run_episode(task, policy, seed + i))
            if episodes_out is not None:
                with open(episodes_out, "a") as f:
                    f.write(json.dumps({"agent": name, **asdict(stats[-1])}, default=float) + "\n")
        summaries.append(summarize(name, stats))
    return summaries


def format_table(summaries: list[AgentSummary], title: str) -> str:
    header = f"{'agent':10} {'success':>8} {'return':>9} {'distance':>9} {'steps':>7} {'ep/min':>8} {'errors':>6}"
    lines = [title, header, "-" * len(header)]
    for s in summaries:
        dist = "-" if math.isnan(s.mean_distance) else f"{s.mean_distance:.2f}"
        lines.append(
            f"{s.agent:10} {s.success_rate:8.2f} {s.mean_return:9.2f} {dist:>9} {s.mean_steps:7.1f} "
            f"{s.episodes_per_minute:8.1f} {s.errors:6d}"
        )
    return "\n".join(lines)


def task_overrides(task_name: str, region: str | None = None, max_steps: int | None = None,
                   model=None) -> dict:
    """make_task overrides: UR5e region, images rendered at the model's size, episode length
    (so a shortened episode still ends the task's own way: truncation, survival success)."""
    overrides = {}
    if task_name in UR5E_TASKS:
        overrides["region"] = region or "wide"
        if model is not None and model.config.image is not None:
            overrides["image_size"] = (model.config.image.height, model.config.image.width)
        if max_steps is not None:
            overrides["max_steps"] = max_steps
    else:
        if region is not None:
            raise ValueError(f"--region applies to the UR5e tasks {UR5E_TASKS}, not {task_name!r}")
        if max_steps is not None:
            from robot_drivers.go2.config import Go2Config

            overrides["episode_s"] = max_steps * Go2Config().control_dt
    return overrides


def build_agents(names, task: Task, model=None, device="cpu", **planner_overrides) -> dict[str, Policy]:
    """Agents by name; `policy` and `planner` need a world model."""
    agents: dict[str, Policy] = {}
    for name in names:
        if name not in AGENTS:
            raise ValueError(f"unknown agent {name!r}; choose from {AGENTS}")
        if name == "expert":
            agents[name] = expert_ladder(task)[0]
            continue
        if model is None:
            raise ValueError(f"agent {name!r} needs a world model: pass --checkpoint")
        planner = None
        if name == "planner":
            config = planner_config_for(task.spec, horizon=model.config.horizon, **planner_overrides)
            planner = MPPIPlanner(model, config, device)
        agents[name] = Agent(model, task.spec, planner, device)
    return agents


# CLI flag -> PlannerConfig field; shared by simdist-eval and simdist-adapt-experiment.
PLANNER_FLAGS = {"samples": "num_samples", "iterations": "iterations", "elites": "num_elites",
                 "temperature": "temperature", "mixture_coef": "mixture_coef", "policy_noise": "policy_noise_std",
                 "init_std": "init_std", "warm_start": "warm_start", "policy_prior": "policy_prior"}


def add_planner_arguments(p: argparse.ArgumentParser) -> None:
    """The planner's settings as flags (each defaults to the robot's PlannerConfig)."""
    p.add_argument("--samples", type=int, default=None, help="planner Gaussian samples (default: official)")
    p.add_argument("--iterations", type=int, default=None, help="planner iterations (default: official)")
    p.add_argument("--elites", type=int, default=None, help="planner elites (default: official)")
    p.add_argument("--temperature", type=float, default=None,
                   help="planner elite temperature (default: the robot's, docs/planner.md)")
    p.add_argument("--mixture-coef", type=float, default=None,
                   help="planner base-policy candidates per Gaussian sample (default: official 0.05)")
    p.add_argument("--policy-noise", type=float, default=None,
                   help="std of the noise on the base-policy candidates (default: the robot's)")
    p.add_argument("--init-std", type=float, default=None,
                   help="std of the Gaussian candidates at the start of each step (default: the robot's)")
    p.add_argument("--warm-start", choices=WARM_STARTS, default=None,
                   help="where each step's planner mean starts: the shifted previous mean or pi's chunk")
    p.add_argument("--policy-prior", type=float, default=None,
                   help="planner ranking cost of a candidate's squared distance from pi's chunk (default 0, official)")


def planner_overrides(args) -> dict:
    """The PlannerConfig overrides the user set (flags left at None keep the robot's value)."""
    return {field: getattr(args, arg) for arg, field in PLANNER_FLAGS.items() if getattr(args, arg) is not None}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="simdist-eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="peg", help="peg | table_leg | go2_flat | go2_slope (default peg)")
    p.add_argument("--variant", default="sim", choices=("sim", "real"),
                   help="the task's simulation or its hardware stand-in (e.g. slippery_slope real)")
    p.add_argument("--region", default=None, choices=("narrow", "wide"), help="UR5e start region (default wide)")
    p.add_argument("--checkpoint", default=None, help="world-model checkpoint directory")
    p.add_argument("--agents", default=None, help=f"comma list from {AGENTS} (default: all possible)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="first episode seed")
    p.add_argument("--max-steps", type=int, default=None, help="episode length in steps (default: the task's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_planner_arguments(p)
    p.add_argument("--episodes-out", type=pathlib.Path, default=None,
                   help="append one JSON line per episode (stats and the task's last-step report)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--ablation", action="store_true", help="run the Table I ablation harness instead")
    p.add_argument("--small", action="store_true", help="with --ablation: the ~15-minute small setting")
    p.add_argument("--workdir", default=None, help="with --ablation: where datasets and checkpoints go")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.ablation:
        from simdist_planner.ablation import run_ablation

        return run_ablation(args)
    model = None
    if args.checkpoint is not None:
        from simdist_planner.checkpoint import load_checkpoint

        model = load_checkpoint(args.checkpoint, device=args.device)
    names = args.agents.split(",") if args.agents else (AGENTS if model is not None else ("expert",))
    if args.max_steps is not None and args.max_steps < 1:
        raise SystemExit(f"simdist-eval: --max-steps must be >= 1, got {args.max_steps}")
    task = make_task(args.task, args.variant, **task_overrides(args.task, args.region, args.max_steps, model))
    try:
        agents = build_agents(names, task, model, args.device, **planner_overrides(args))
        summaries = evaluate(task, agents, args.episodes, args.seed, not args.no_progress, args.episodes_out)
    finally:
        task.close()
    region = f" ({args.region or 'wide'})" if args.task in UR5E_TASKS else ""
    print(format_table(summaries, f"{args.task}{region} {args.variant}: {args.episodes} episodes per agent, "
                                  f"seeds {args.seed}..{args.seed + args.episodes - 1}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
