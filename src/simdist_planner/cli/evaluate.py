"""Closed-loop evaluation in simulation (`simdist-eval`): expert, base policy pi, SimDist planner.

    simdist-eval --task peg --region wide --checkpoint CKPT --episodes 50
    simdist-eval --task go2_flat --checkpoint CKPT --agents policy,planner --device cuda
    simdist-eval --task slippery_slope --variant real --speed 0.3 --friction 0.12 --checkpoint CKPT

Every agent runs the same seeded episodes (seed, seed + 1, ...; the seed resets both the task and
the agent). The table gives the success rate, the mean episode return (sum of the task's
privileged reward), the mean distance travelled (Go2), the mean episode length, episodes per
minute, and how many episodes the agent aborted on an error (counted as failures).
`--episodes-out FILE` also writes one JSON line per episode with the task's report of its last
step (the peg task: depth, xy error, tilt, whether it is held), to see where failures end.
"""

from __future__ import annotations

import argparse
import pathlib

import torch

from robot_drivers.registry import make_task, task_list, task_options
from simdist_planner.cli.common import (
    add_planner_arguments,
    add_task_option_arguments,
    checked_task_options,
    planner_overrides,
)
from simdist_planner.evaluation.agents import AGENTS, build_agents
from simdist_planner.evaluation.evaluate import evaluate, format_table, task_overrides
from simdist_planner.model.checkpoint import load_checkpoint


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="simdist-eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", default="peg", help=f"{task_list()} (default peg)")
    p.add_argument(
        "--variant",
        default="sim",
        choices=("sim", "real"),
        help="the task's simulation or its hardware stand-in (e.g. slippery_slope real)",
    )
    p.add_argument("--checkpoint", default=None, help="world-model checkpoint directory")
    p.add_argument(
        "--agents", default=None, help=f"comma list from {AGENTS} (default: all possible)"
    )
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="first episode seed")
    add_task_option_arguments(p)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_planner_arguments(p)
    p.add_argument(
        "--episodes-out",
        type=pathlib.Path,
        default=None,
        help="append one JSON line per episode (stats and the task's last-step report)",
    )
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    checked_task_options(p, args, args.task, args.variant)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    model = None
    if args.checkpoint is not None:
        model = load_checkpoint(args.checkpoint, device=args.device)
    names = (
        args.agents.split(",") if args.agents else (AGENTS if model is not None else ("expert",))
    )
    overrides = task_overrides(
        args.task, args.region, args.max_steps, model, args.speed, args.friction
    )
    task = make_task(args.task, args.variant, **overrides)
    try:
        agents = build_agents(names, task, model, args.device, **planner_overrides(args))
        summaries = evaluate(
            task, agents, args.episodes, args.seed, not args.no_progress, args.episodes_out
        )
    finally:
        task.close()
    region = f" ({args.region or 'wide'})" if "region" in task_options(args.task) else ""
    print(
        format_table(
            summaries,
            f"{args.task}{region} {args.variant}: {args.episodes} episodes per agent, "
            f"seeds {args.seed}..{args.seed + args.episodes - 1}",
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
