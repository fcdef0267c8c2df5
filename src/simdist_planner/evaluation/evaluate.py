"""Closed-loop evaluation in simulation: every agent on the same seeded episodes, a summary each."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from robot_drivers import registry
from robot_drivers.tasks.base import Policy, Task
from simdist_planner.planning.observation import (
    ObservationError,
)
from simdist_planner.planning.planner import (
    PlannerError,
)


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
    mean_speed: float  # the task's last reported `speed` (Go2), NaN where it reports none
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
        return EpisodeStats(
            False, total, distance, steps, time.perf_counter() - start, seed, end, str(err)
        )
    return EpisodeStats(
        bool(success), total, distance, steps, time.perf_counter() - start, seed, end
    )


def summarize(agent: str, stats: list[EpisodeStats]) -> AgentSummary:
    seconds = sum(s.seconds for s in stats)
    distances = [s.distance for s in stats if not math.isnan(s.distance)]
    speeds = [s.end["speed"] for s in stats if "speed" in s.end]
    return AgentSummary(
        agent=agent,
        episodes=len(stats),
        success_rate=float(np.mean([s.success for s in stats])),
        mean_return=float(np.mean([s.episode_return for s in stats])),
        mean_distance=float(np.mean(distances)) if distances else math.nan,
        mean_speed=float(np.mean(speeds)) if speeds else math.nan,
        mean_steps=float(np.mean([s.steps for s in stats])),
        episodes_per_minute=60.0 * len(stats) / seconds if seconds > 0 else math.inf,
        errors=sum(bool(s.error) for s in stats),
    )


def evaluate(
    task: Task,
    agents: dict[str, Policy],
    episodes: int,
    seed: int = 0,
    progress: bool = True,
    episodes_out=None,
) -> list[AgentSummary]:
    """Run every agent on the same `episodes` seeds; one summary per agent, in order.
    `episodes_out`: a JSON-lines file that gets each episode's stats as it ends."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
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
    header = (
        f"{'agent':10} {'success':>8} {'return':>9} {'distance':>9} {'speed':>6} {'steps':>7} "
        f"{'ep/min':>8} {'errors':>6}"
    )
    lines = [title, header, "-" * len(header)]
    for s in summaries:
        dist = "-" if math.isnan(s.mean_distance) else f"{s.mean_distance:.2f}"
        speed = "-" if math.isnan(s.mean_speed) else f"{s.mean_speed:.3f}"
        lines.append(
            f"{s.agent:10} {s.success_rate:8.2f} {s.mean_return:9.2f} {dist:>9} {speed:>6} "
            f"{s.mean_steps:7.1f} {s.episodes_per_minute:8.1f} {s.errors:6d}"
        )
    return "\n".join(lines)


def task_overrides(
    task_name: str,
    region: str | None = None,
    max_steps: int | None = None,
    model=None,
    speed: float | None = None,
    panel_friction: float | None = None,
) -> dict:
    """make_task overrides (registry.episode_overrides): UR5e region, images rendered at the
    model's size where the task renders images, episode length (so a shortened episode still ends
    the task's own way: truncation, survival success), and the Go2 task options `speed` and
    `panel_friction` (robot_drivers.tasks.go2_tasks). An option the task lacks is a ValueError."""
    image_size = None
    image = model.config.image if model is not None else None
    if image is not None and "image_size" in registry.task_options(task_name):
        image_size = (image.height, image.width)
    return registry.episode_overrides(
        task_name,
        region=region,
        image_size=image_size,
        max_steps=max_steps,
        speed=speed,
        panel_friction=panel_friction,
    )
