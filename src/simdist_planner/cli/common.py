"""Command-line pieces shared by the project's commands: the planner's settings and the task
options as flags."""

from __future__ import annotations

import argparse

from robot_drivers import registry
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


def add_task_option_arguments(
    p: argparse.ArgumentParser, names: tuple[str, ...] | None = None
) -> None:
    """The task options that have a flag (robot_drivers.tasks.options: `--region`,
    `--max-steps`, `--speed`, `--friction`, ...), each from its one description; unset by
    default (the task's own). `checked_task_options` checks the values given.

    Args:
        p: the command's parser.
        names: the options the command takes (None: every option with a flag).

    Returns:
        None.
    """
    for o in registry.all_options():
        if not o.flag or (names is not None and o.name not in names):
            continue
        span = f"; {o.span()}" if o.span() else ""
        p.add_argument(
            f"--{o.flag.replace('_', '-')}",
            dest=o.flag,
            type=o.kind,
            default=None,
            help=f"{o.doc} (default: {o.unset}{span})",
        )


def checked_task_options(
    p: argparse.ArgumentParser, args: argparse.Namespace, task: str, variant: str
) -> dict:
    """The task options the user set, checked by the options' one validator
    (robot_drivers.tasks.options) for `task` and `variant`: a bad value or an option the task
    lacks ends the command with the validator's message (`p.error`, exit status 2).

    Args:
        p: the command's parser (add_task_option_arguments added the flags).
        args: its parsed arguments (`args.task` need not exist: `task` names it).
        task: the task the options are for.
        variant: its variant ("sim" or "real").

    Returns:
        Option name -> value, for the flags given.
    """
    given = {
        o.name: getattr(args, o.flag)
        for o in registry.all_options()
        if o.flag and getattr(args, o.flag, None) is not None
    }
    try:
        registry.entry(task).options.of(task, variant, **given)
    except ValueError as e:
        p.error(str(e))
    return given


def planner_overrides(args) -> dict:
    """The PlannerConfig overrides the user set (flags left at None keep the preset's value);
    `preset` names the preset itself."""
    return {
        field: getattr(args, arg)
        for arg, field in PLANNER_FLAGS.items()
        if getattr(args, arg) is not None
    }
