"""simdist-probe: does a model's planner objective order action chunks the way the simulator does?

    simdist-probe --task slippery_slope --variant real --checkpoint pre=PRETRAINED \\
        --checkpoint adapted=ADAPTED --driver expert --seeds 0,1,2,3 --max-steps 400

The method and its outputs: `simdist_planner.evaluation.probe`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import torch

from robot_drivers.registry import make_task
from simdist_planner.cli.common import add_task_option_arguments, checked_task_options
from simdist_planner.evaluation.evaluate import task_overrides
from simdist_planner.evaluation.probe import (
    DRIVERS,
    ChunkProbe,
    ProbeConfig,
    copyable,
    format_table,
    summarize,
)
from simdist_planner.model.checkpoint import load_checkpoint


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="simdist-probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", required=True, help="a simulation task, e.g. slippery_slope")
    p.add_argument("--variant", default="sim", choices=("sim", "real"))
    p.add_argument(
        "--checkpoint",
        action="append",
        required=True,
        help="[NAME=]PATH, repeatable; the first one's pi drives 'policy' and seeds the candidates",
    )
    p.add_argument("--driver", default="expert", choices=DRIVERS)
    p.add_argument("--seeds", default="0", help="comma list of episode seeds")
    add_task_option_arguments(p)
    p.add_argument("--every", type=int, default=ProbeConfig.every)
    p.add_argument("--start", type=int, default=ProbeConfig.start)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="write every probe state's scores here (JSON)")
    args = p.parse_args(argv)
    checked_task_options(p, args, args.task, args.variant)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    models = {}
    for spec in args.checkpoint:
        name, _, path = spec.rpartition("=")
        models[name or path] = load_checkpoint(path, device=args.device)
    seeds = [int(s) for s in args.seeds.split(",")]
    first = next(iter(models.values()))
    overrides = task_overrides(
        args.task, args.region, args.max_steps, first, args.speed, args.friction
    )
    task = make_task(args.task, args.variant, **overrides)
    twin = None if copyable(task) else make_task(args.task, args.variant, **overrides)
    try:
        probe = ChunkProbe(
            task, models, ProbeConfig(args.driver, args.every, args.start), args.device, twin
        )
        points = [p for seed in seeds for p in probe.run(seed, args.max_steps)]
    finally:
        task.close()
        if twin is not None:
            twin.close()
    summaries = [summarize(name, points) for name in models]
    print(
        format_table(
            summaries,
            f"{args.task} {args.variant}: {len(points)} states along the {args.driver}'s "
            f"rollouts, seeds {args.seeds}; {len(points[0].truth) if points else 0} "
            f"candidates each (expert, pi, stand, noised pi)",
        )
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "summaries": [asdict(s) for s in summaries],
                    "points": [asdict(p) for p in points],
                },
                f,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
