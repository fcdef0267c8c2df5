"""Command-line pieces shared by the project's commands: the planner's settings as flags."""

from __future__ import annotations

import argparse

from simdist_planner.planning.planner import EVALUATORS, PLANNER_PRESETS, PRECISIONS, WARM_STARTS

# CLI flag -> PlannerConfig field (and `preset`, the factory the others override); shared by
# simdist-eval and simdist-adapt-experiment.
PLANNER_FLAGS = {
    "planner_preset": "preset",
    "samples": "num_samples",
    "iterations": "iterations",
    "elites": "num_elites",
    "temperature": "temperature",
    "mixture_coef": "mixture_coef",
    "policy_noise": "policy_noise_std",
    "init_std": "init_std",
    "warm_start": "warm_start",
    "policy_prior": "policy_prior",
    "evaluator": "evaluator",
    "precision": "precision",
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
    p.add_argument(
        "--samples", type=int, default=None, help="planner Gaussian samples (default: official)"
    )
    p.add_argument(
        "--iterations", type=int, default=None, help="planner iterations (default: official)"
    )
    p.add_argument("--elites", type=int, default=None, help="planner elites (default: official)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="planner elite temperature (default: the robot's, docs/planner.md)",
    )
    p.add_argument(
        "--mixture-coef",
        type=float,
        default=None,
        help="planner base-policy candidates per Gaussian sample (default: official 0.05)",
    )
    p.add_argument(
        "--policy-noise",
        type=float,
        default=None,
        help="std of the noise on the base-policy candidates (default: the robot's)",
    )
    p.add_argument(
        "--init-std",
        type=float,
        default=None,
        help="std of the Gaussian candidates at the start of each step (default: the robot's)",
    )
    p.add_argument(
        "--warm-start",
        choices=WARM_STARTS,
        default=None,
        help="where each step's planner mean starts: the previous mean rolled (official) or "
        "shifted (TD-MPC), or pi's chunk",
    )
    p.add_argument(
        "--policy-prior",
        type=float,
        default=None,
        help="planner ranking cost of a candidate's squared distance from pi's chunk "
        "(default 0, official)",
    )
    p.add_argument(
        "--evaluator",
        choices=EVALUATORS,
        default=None,
        help="how the planner scores candidates: fast (default) or eager (the reference path)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="the fast evaluator's compute dtype: float32 (default) or bfloat16 (CPUs with bf16 "
        "instructions, GPUs; docs/planner.md)",
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
