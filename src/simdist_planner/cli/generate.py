"""simdist-generate: the simulation dataset (Algorithm 2 of SimDist) as HDF5 shards.

    simdist-generate --task peg --episodes 400 --workers 2 --out DIR
    torchrun --nproc_per_node 4 -m simdist_planner.cli.generate --task go2_slope --out DIR

The method (experts, checkpoint ladder, noise bursts, learner take-overs) and the shard layout:
`simdist_planner.evaluation.datagen`, docs/dataset.md.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

from robot_drivers import registry
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.evaluation.datagen import (
    GenerateConfig,
    LearnerConfig,
    generate,
    robot_data_config,
)


def build_config(args: argparse.Namespace) -> GenerateConfig:
    task = registry.make_task(args.task, args.variant)
    try:
        robot = robot_data_config(task.spec)
    finally:
        task.close()
    return GenerateConfig(
        task=args.task,
        robot=robot,
        episodes=args.episodes or robot.default_episodes,
        seed=args.seed,
        variant=args.variant,
        expert_prob=args.expert_prob,
        expert_only=args.expert_only,
        max_steps=args.max_steps,
        learner=None
        if not args.learner
        else LearnerConfig(
            checkpoint=str(pathlib.Path(args.learner).resolve()),
            learner_steps=tuple(args.learner_steps),
            expert_steps=tuple(args.expert_steps),
            device=args.device,
        ),
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="simdist-generate",
        description="Generate a SimDist simulation dataset (HDF5 shards, see docs/dataset.md).",
    )
    p.add_argument("--task", default="peg", help="task name in robot_drivers.tasks (default peg)")
    p.add_argument("--episodes", type=int, default=None, help="episodes in all (default per robot)")
    p.add_argument("--workers", type=int, default=1, help="processes, one shard each")
    p.add_argument("--out", required=True, help="output directory for shard-*.h5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="sim", choices=("sim", "real"))
    p.add_argument("--resume", action="store_true", help="continue the shards in --out")
    p.add_argument("--expert-prob", type=float, default=0.5)
    p.add_argument("--expert-only", action="store_true", help="clean expert episodes only")
    p.add_argument("--max-steps", type=int, default=None, help="cap on steps per episode")
    p.add_argument(
        "--learner",
        default="",
        metavar="CKPT",
        help="world-model checkpoint whose pi drives, the expert taking over in "
        "stretches (DAgger-style data for pi's own mistakes)",
    )
    p.add_argument("--learner-steps", type=int, nargs=2, default=(3, 12), metavar=("LO", "HI"))
    p.add_argument("--expert-steps", type=int, nargs=2, default=(5, 10), metavar=("LO", "HI"))
    p.add_argument("--device", default="cpu", help="torch device of the learner")
    p.add_argument("--rank", type=int, default=int(os.environ.get("RANK", 0)))
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = build_config(args)
    start = time.perf_counter()
    paths = generate(
        cfg, args.out, args.workers, args.resume, args.rank, args.world_size, not args.no_progress
    )

    ds = ShardedDataset(paths)
    secs = time.perf_counter() - start
    expert = sum(int(ds.read(i, 0, int(n) - 1)["expert"].sum()) for i, n in enumerate(ds.lengths))
    actions = ds.num_steps - ds.num_episodes
    print(
        f"{cfg.task}: {ds.num_episodes} episodes, {actions} transitions in {len(paths)} shard(s) "
        f"under {args.out}; {secs:.1f} s this run; clean expert actions {expert / actions:.3f}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
