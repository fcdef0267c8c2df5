"""Command-line pieces shared by the project's commands: the planner's settings as flags."""

from __future__ import annotations

import argparse

from simdist_planner.planning.config import PLANNER_PARAMS, PLANNER_PRESETS

# CLI flag -> PlannerConfig field (and `preset`, the factory the others override); shared by
# simdist-eval and simdist-adapt-experiment. Built from PLANNER_PARAMS: a parameter with a flag.
PLANNER_FLAGS = {
    "planner_preset": "preset",
    **{q.flag: q.name for q in PLANNER_PARAMS if q.flag},
}


def add_planner_arguments(p: argparse.ArgumentParser) -> None:
    """The planner's settings as flags (each defaults to the preset's PlannerConfig)."""
    p.add_argument(
        "--planner-preset",
        choices=sorted(PLANNER_PRESETS),
        default=None,
        help="planner settings the other planner flags override (default: official for an "
        "imported official model, else the robot's; docs/planner.md)",
    )
    for q in PLANNER_PARAMS:
        if not q.flag:
            continue
        kind = {"choices": q.choices} if q.choices else {"type": q.type}
        p.add_argument(
            f"--{q.flag.replace('_', '-')}",
            **kind,
            default=None,
            help=f"planner: {q.doc} (default: the planner preset's; official {q.default})",
        )


def add_course_arguments(p: argparse.ArgumentParser) -> None:
    """The Go2 task options the paper varies: commanded speed and the stand-in's panel friction."""
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        help="Go2: commanded forward speed vx in m/s (default: the task's, 0.5); a course's "
        "episode limit follows it (2.5 x its length / speed)",
    )
    p.add_argument(
        "--friction",
        type=float,
        default=None,
        help="slippery_slope --variant real: the PTFE panels' friction (default 0.15)",
    )


def course_overrides(args) -> dict:
    """`task_overrides` keywords of the course flags the user set."""
    out = {}
    if args.speed is not None:
        out["speed"] = args.speed
    if args.friction is not None:
        out["panel_friction"] = args.friction
    return out


def planner_overrides(args) -> dict:
    """The PlannerConfig overrides the user set (flags left at None keep the preset's value);
    `preset` names the preset itself."""
    return {
        field: getattr(args, arg)
        for arg, field in PLANNER_FLAGS.items()
        if getattr(args, arg) is not None
    }
