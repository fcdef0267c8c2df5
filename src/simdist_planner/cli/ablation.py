"""simdist-ablation: the Table I ablation rows at this project's scale, one table at the end.

    simdist-ablation --small [--workdir DIR] [--device cpu]

Every stage (data, pretraining, evaluation) writes under --workdir and is skipped when its output
exists, so an interrupted run resumes where it stopped (simdist_planner.evaluation.ablation).
"""

from __future__ import annotations

import argparse

import torch

from simdist_planner.evaluation.ablation import run_ablation


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="simdist-ablation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--small", action="store_true", help="the ~15-minute small setting")
    p.add_argument(
        "--workdir", default=None, help="where datasets, checkpoints and results.json go"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_ablation(args.small, args.workdir, args.device, progress=not args.no_progress)


if __name__ == "__main__":
    raise SystemExit(main())
