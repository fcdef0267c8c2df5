"""simdist-select-checkpoint: of a run's kept checkpoints, the one whose base policy pi does
best on seeded simulation episodes becomes the run's model.

    simdist-select-checkpoint --run RUN --task peg --region wide --episodes 20 --workers 2

The method and its outputs: `simdist_planner.evaluation.checkpoint_selection`.
"""

from __future__ import annotations

import argparse

from simdist_planner.cli.common import add_task_option_arguments, checked_task_options
from simdist_planner.evaluation.checkpoint_selection import (
    select_checkpoint,
)
from simdist_planner.training.config import CheckpointSelection


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="simdist-select-checkpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", required=True, help="a pretraining run directory (with checkpoints/)")
    p.add_argument("--task", required=True, help="simulation task, e.g. peg, go2_slope")
    p.add_argument("--variant", default="sim", choices=("sim", "real"))
    p.add_argument("--episodes", type=int, default=20, help="per checkpoint")
    p.add_argument(
        "--seed",
        type=int,
        default=1000,
        help="first episode seed (keep apart from evaluation seeds)",
    )
    add_task_option_arguments(p, ("region", "max_steps"))
    p.add_argument("--workers", type=int, default=1, help="processes, one checkpoint each")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    checked_task_options(p, args, args.task, args.variant)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        selection = CheckpointSelection(
            task=args.task,
            region=args.region or "",
            variant=args.variant,
            episodes=args.episodes,
            seed=args.seed,
            max_steps=args.max_steps or 0,
            workers=args.workers,
        )
    except ValueError as err:
        raise SystemExit(f"simdist-select-checkpoint: {err}")
    select_checkpoint(args.run, selection, args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
