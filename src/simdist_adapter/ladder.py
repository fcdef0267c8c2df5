"""`simdist-ladder`: zero-shot success on the rungs of a stand-in, and the pre-registered choice.

Runs the base policy pi and the planner zero-shot on the Slippery Slope stand-in for every panel
friction x commanded speed, on the selection seeds (never evaluation or collection seeds), and
picks the adaptation stand-in by the rule fixed before any adaptation run (docs/adaptation.md):
at the selection speed (0.3 m/s), the highest friction at which zero-shot planner success on 5
selection seeds is at most 40 %.

    simdist-ladder --checkpoint CK --out artifacts/ladder --agents policy --workers 2
    simdist-ladder --checkpoint CK --out artifacts/ladder --agents planner --speeds 0.3 \\
        --precision bfloat16 --workers 2

Every run adds its cells to `<out>/ladder.json`, keeps each finished episode under
`<out>/episodes/` (a killed run resumes where it stopped, also from a fresh clone of a repository
that holds `<out>`) and prints the table of every cell measured so far, with the selection. A
cell holds the setting it was measured with (the digest of everything its episodes depend on but
the seed: checkpoint, resolved planner, task options, threads, episode protocol): a run that
would add episodes of another setting to a cell is refused; `--label` names a planner setting
other than the default (e.g. a cheaper one measured beside it); the rule reads the `planner`
rows, or `--rule-label`'s. Foam has no friction rungs: `--task foam --frictions ''` runs its
speeds alone.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time

import numpy as np
import torch

from robot_drivers.tasks.go2_tasks import PAPER_SPEEDS
from simdist_adapter.episodes import (
    SELECTION_SEED,
    Episode,
    EpisodeJob,
    EpisodePool,
    EpisodeStore,
    check_seeds,
    course,
)
from simdist_planner.cli.common import add_planner_arguments, planner_overrides
from simdist_planner.model.checkpoint import load_checkpoint

LADDER_FRICTIONS = (0.15, 0.14, 0.13, 0.12, 0.11)
SELECTION_SPEED = 0.3  # m/s: the paper's middle Slippery Slope speed, where its zero-shot fails
MAX_ZERO_SHOT_SUCCESS = 0.4
SELECTION_EPISODES = 5  # selection seeds per rung


def cell_key(label: str, friction: float | None, speed: float) -> str:
    return f"{label}|{'-' if friction is None else f'{friction:g}'}|{speed:g}"


def select_friction(
    cells: dict,
    frictions=LADDER_FRICTIONS,
    label: str = "planner",
    speed: float = SELECTION_SPEED,
    max_success: float = MAX_ZERO_SHOT_SUCCESS,
    episodes: int = SELECTION_EPISODES,
) -> tuple[float | None, str]:
    """The pre-registered rule: the highest friction whose `label` success at `speed` over the
    first `episodes` selection seeds is <= `max_success`. (None, why) until it is decided: a
    higher rung not yet measured on enough seeds, or no rung that qualifies."""
    rungs = sorted(
        set(frictions)
        | {c["friction"] for c in cells.values() if c["agent"] == label and c["friction"]},
        reverse=True,
    )
    for f in rungs:
        cell = cells.get(cell_key(label, f, speed))
        done = [] if cell is None else cell["success"][:episodes]
        if len(done) < episodes:
            return None, f"friction {f:g} at {speed:g} m/s has {len(done)} of {episodes} episodes"
        rate = float(np.mean(done))
        if rate <= max_success:
            return f, (
                f"friction {f:g}: {label} crosses {int(sum(done))} / {episodes} at {speed:g} m/s "
                f"(<= {max_success:.0%}); every higher rung crosses more"
            )
    return None, f"no rung of {rungs} has {label} success <= {max_success:.0%} at {speed:g} m/s"


def format_table(cells: dict) -> str:
    """Markdown: a row per friction, a column per speed, each `label k / n (mean distance)`."""
    speeds = sorted({c["speed"] for c in cells.values()})
    frictions = sorted({c["friction"] for c in cells.values()}, key=lambda f: -(f or 0))
    labels = sorted({c["agent"] for c in cells.values()}, key=lambda a: (a != "policy", a))
    lines = [
        "| panel friction | " + " | ".join(f"{s:g} m/s" for s in speeds) + " |",
        "|---|" + "---|" * len(speeds),
    ]
    for f in frictions:
        row = []
        for s in speeds:
            parts = []
            for label in labels:
                c = cells.get(cell_key(label, f, s))
                if c is None or not c["success"]:
                    continue
                name = "pi" if label == "policy" else label
                dist = np.nanmean(c["distance"]) if any(map(math.isfinite, c["distance"])) else 0
                parts.append(f"{name} {int(sum(c['success']))}/{len(c['success'])} ({dist:.2f} m)")
            row.append(", ".join(parts) or "-")
        lines.append(f"| {'-' if f is None else f'{f:g}'} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def setting(pool: EpisodePool, job: EpisodeJob) -> str:
    """The digest of everything `job`'s episode depends on but its seed (EpisodePool.identity):
    the cells of one setting share it."""
    identity = pool.identity(job)
    return EpisodeStore.key({k: v for k, v in identity.items() if k != "seed"})


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="simdist-ladder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="the pretrained world model")
    p.add_argument("--task", default="slippery_slope", choices=sorted(PAPER_SPEEDS))
    p.add_argument("--out", default="artifacts/ladder")
    p.add_argument(
        "--frictions",
        default=",".join(f"{f:g}" for f in LADDER_FRICTIONS),
        help="comma list of panel frictions (slippery_slope); '' for none",
    )
    p.add_argument("--speeds", default=None, help="comma list of m/s (default: the paper's)")
    p.add_argument("--agents", default="policy,planner", help="policy and/or planner")
    p.add_argument("--label", default="planner", help="the planner rows' name in the table")
    p.add_argument("--episodes", type=int, default=SELECTION_EPISODES, help="seeds per cell")
    p.add_argument(
        "--rule-label", default="planner", help="the rows the selection rule reads (a --label)"
    )
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_planner_arguments(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frictions: list[float | None] = [float(f) for f in args.frictions.split(",") if f] or [None]
    speeds = [float(s) for s in args.speeds.split(",")] if args.speeds else PAPER_SPEEDS[args.task]
    agents = args.agents.split(",")
    if set(agents) - {"policy", "planner"}:
        raise SystemExit(f"simdist-ladder: --agents takes policy and planner, got {args.agents}")
    load_checkpoint(args.checkpoint)  # a bad checkpoint fails here, before any worker starts
    check_seeds("selection", args.episodes, "--episodes")
    (out / ".gitignore").write_text(".*\n!.gitignore\n")  # temporary files of atomic writes
    ladder_file = out / "ladder.json"
    cells = json.loads(ladder_file.read_text()) if ladder_file.is_file() else {}
    planner = planner_overrides(args)
    pool = EpisodePool(
        args.task, {}, args.device, planner, args.workers, EpisodeStore(out / "episodes")
    )
    jobs, where = [], []
    for agent in agents:  # the planner's cells first: the rule reads them
        label = "policy" if agent == "policy" else args.label
        for f in frictions:
            for s in speeds:
                for seed in range(SELECTION_SEED, SELECTION_SEED + args.episodes):
                    jobs.append(
                        EpisodeJob(
                            args.checkpoint,
                            agent == "planner",
                            seed,
                            course=course(panel_friction=f, speed=s),
                        )
                    )
                    where.append((label, f, s))
    # the planner's rungs first, highest friction first: the rule reads them in that order
    order = sorted(range(len(jobs)), key=lambda i: (not jobs[i].planner, -(where[i][1] or 0)))
    jobs, where = [jobs[i] for i in order], [where[i] for i in order]
    settings = [setting(pool, job) for job in jobs]
    for (label, f, s), digest in zip(where, settings):
        cell = cells.get(cell_key(label, f, s))
        if cell is not None and cell.get("setting") != digest:
            pool.close()
            raise SystemExit(
                f"simdist-ladder: cell {cell_key(label, f, s)} in {ladder_file} was measured "
                "with another setting (checkpoint, planner, task options, threads or episode "
                "protocol); name this one with --label, or use another --out"
            )
    start, finished = time.perf_counter(), [0]

    def done(i: int, ep: Episode, stored: bool) -> None:
        finished[0] += 1
        label, f, s = where[i]
        if not stored:
            print(
                f"[{time.perf_counter() - start:7.0f} s] {label} friction {f} speed {s} seed "
                f"{jobs[i].seed}: {'crossed' if ep.success else 'failed'} {ep.distance:.2f} m "
                f"in {ep.steps} steps ({finished[0]} / {len(jobs)})",
                flush=True,
            )

    try:
        episodes = pool.run(jobs, done)
    finally:
        pool.close()
    for i, ep in enumerate(episodes):
        label, f, s = where[i]
        key = cell_key(label, f, s)
        cell = cells.setdefault(
            key,
            {
                "agent": label,
                "friction": f,
                "speed": s,
                "seeds": [],
                "success": [],
                "distance": [],
                "steps": [],
                "errors": 0,
                "planner": planner if label != "policy" else {},
                "setting": settings[i],
            },
        )
        if jobs[i].seed in cell["seeds"]:
            continue
        cell["seeds"].append(jobs[i].seed)
        cell["success"].append(bool(ep.success))
        cell["distance"].append(ep.distance)
        cell["steps"].append(ep.steps)
        cell["errors"] += bool(ep.error)
    ladder_file.write_text(json.dumps(cells, indent=1, default=float))
    print(format_table(cells))
    if args.task == "slippery_slope":
        friction, why = select_friction(cells, label=args.rule_label)
        print(f"selected stand-in: {'undecided' if friction is None else friction} ({why})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
