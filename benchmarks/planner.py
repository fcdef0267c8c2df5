"""Planner step latency on the current device: Go2 and UR5e, chunked vs autoregressive f.

    python benchmarks/planner.py [--device cuda] [--steps 200] [--robots go2,ur5e]
                                 [--dynamics chunked,autoregressive] [--threads N]
                                 [--samples N] [--iterations N] [--evaluators eager,fast]
                                 [--precisions float32,bfloat16]
                                 [--checkpoint DIR [--planner-preset NAME]]

Each row builds a randomly initialised WorldModel of the official size (Go2: latent 64,
H = T = 25, height map; UR5e: three 224x224 cameras through ResNet-18, H = T = 5), the official
MPPI setting (450 + 22 = 472 candidates, 8 iterations, 64 elites; `--samples` / `--iterations`
change it) and times `plan()` end to end, observation encoding and the host transfer of the action
included, once per evaluator (PlannerConfig.evaluator: the eager reference and the fast path)
and, for the fast path, once per `--precisions` value (PlannerConfig.precision), the variants'
steps interleaved so that all see the same machine load. Latency does not
depend on the weights, so no checkpoint is needed. Prints min / median / p95 / max wall time,
the median CPU time of the process per step (what a step costs when other processes share the
cores: their load lengthens the wall time, not the CPU time), the control
rate (1 / median) beside the rate each robot runs at, the fast path's speed-up, and one
`RESULT {json}` line per row for comparing runs. `--checkpoint` times one more row: that
checkpoint with the planner preset it plans with (config.default_preset: `official` for an
imported official model), e.g. the official model at the official controller's settings.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace

import numpy as np
import torch

from robot_drivers.specs import robot_spec
from simdist_planner.model.checkpoint import load_checkpoint
from simdist_planner.model.config import go2_config, ur5e_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning.config import (
    EVALUATORS,
    PLANNER_PRESETS,
    PRECISIONS,
    default_preset,
    go2_planner_config,
    planner_config_for,
    ur5e_planner_config,
)
from simdist_planner.planning.planner import make_planner

# Robot -> (model config factory, planner config factory, control rate the robot runs at in Hz).
ROBOTS = {
    "go2": (go2_config, go2_planner_config, 50.0),
    "ur5e": (ur5e_config, ur5e_planner_config, 5.0),
}
WARMUP_STEPS = 3


def random_inputs(cfg, device, generator):
    """One observation batch and its history, shaped as the model expects (values irrelevant)."""
    obs = {"proprio": torch.randn(1, cfg.proprio_dim, generator=generator)}
    if cfg.height_map is not None:
        obs["height_map"] = torch.randn(1, *cfg.height_map.shape, generator=generator)
    if cfg.command_dim:
        obs["command"] = torch.randn(1, cfg.command_dim, generator=generator)
    if cfg.image is not None:
        shape = (1, cfg.num_cameras, 3, cfg.image.height, cfg.image.width)
        obs["images"] = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    proprio = torch.randn(1, cfg.history, cfg.proprio_dim, generator=generator)
    actions = torch.randn(1, cfg.history, cfg.action_dim, generator=generator)
    return {k: v.to(device) for k, v in obs.items()}, proprio.to(device), actions.to(device)


def bench(robot: str, dynamics: str, device, steps: int, overrides: dict, variants) -> list:
    model_factory, planner_factory, rate_hz = ROBOTS[robot]
    cfg = model_factory(dynamics_kind=dynamics)
    torch.manual_seed(0)
    model = WorldModel(cfg).to(device).eval()
    planner_cfg = planner_factory([-1.0] * cfg.action_dim, [1.0] * cfg.action_dim, **overrides)
    return time_planner(model, planner_cfg, device, steps, robot, dynamics, rate_hz, variants)


def bench_checkpoint(path: str, preset: str, device, steps: int, overrides, variants) -> list:
    """The rows of a checkpoint with `preset` (default: the one it plans with)."""
    model = load_checkpoint(path, device=device).eval()
    spec = robot_spec(model.config.robot)
    preset = preset or default_preset(spec.name, model.config)
    planner_cfg = planner_config_for(spec, preset, horizon=model.config.horizon, **overrides)
    label = f"{model.config.dynamics_kind} ({preset})"
    return time_planner(
        model, planner_cfg, device, steps, spec.name, label, spec.control_rate_hz, variants
    )


def time_planner(model, planner_cfg, device, steps, robot, label, rate_hz, variants) -> list:
    """One row per (evaluator, precision) variant; their timed steps alternate."""
    cfg = model.config
    planners = {
        (evaluator, precision): make_planner(
            replace(planner_cfg, evaluator=evaluator, precision=precision), model, device
        )
        for evaluator, precision in variants
    }
    inputs = random_inputs(cfg, device, torch.Generator().manual_seed(0))
    for planner in planners.values():
        for _ in range(WARMUP_STEPS):
            planner.plan(*inputs)
    latencies = {name: [] for name in planners}
    cpu_times = {name: [] for name in planners}
    for _ in range(steps):
        for name, planner in planners.items():
            start, cpu = time.perf_counter(), time.process_time()
            planner.plan(*inputs)  # ends in a host transfer, so the device work is complete
            latencies[name].append(time.perf_counter() - start)
            cpu_times[name].append(time.process_time() - cpu)
    rows = []
    for name, planner in planners.items():
        ms = np.array(latencies[name]) * 1e3
        rows.append(
            {
                "robot": robot,
                "dynamics": label,
                "evaluator": planner.evaluator,
                "precision": planner.config.precision,
                "candidates": planner_cfg.num_candidates,
                "iterations": planner_cfg.iterations,
                "HT": f"{cfg.history}/{cfg.horizon}",
                "cameras": cfg.num_cameras,
                "min": float(ms.min()),
                "median": float(np.median(ms)),
                "p95": float(np.percentile(ms, 95)),
                "max": float(ms.max()),
                "rate": 1e3 / float(np.median(ms)),
                "target": rate_hz,
                # CPU seconds the process used per step (all its threads): on a shared machine
                # the figure that holds, since other processes' load lengthens wall time only
                "cpu": float(np.median(cpu_times[name])) * 1e3,
            }
        )
    if any(r["evaluator"] == "eager" for r in rows) and len(rows) > 1:
        eager = next(r["median"] for r in rows if r["evaluator"] == "eager")
        for row in rows:
            row["speedup"] = eager / row["median"]
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=200, help="timed planner steps per row")
    parser.add_argument("--robots", default="go2,ur5e")
    parser.add_argument("--dynamics", default="chunked,autoregressive")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch default)"
    )
    parser.add_argument("--samples", type=int, default=0, help="num_samples (0: the preset's)")
    parser.add_argument("--iterations", type=int, default=0, help="iterations (0: the preset's)")
    parser.add_argument(
        "--evaluators",
        default="eager,fast",
        help="PlannerConfig.evaluator values to time side by side",
    )
    parser.add_argument(
        "--precisions",
        default="float32",
        help="PlannerConfig.precision values of the fast evaluator to time side by side",
    )
    parser.add_argument("--checkpoint", default=None, help="also time this checkpoint")
    parser.add_argument(
        "--planner-preset",
        default="",
        choices=("", *sorted(PLANNER_PRESETS)),
        help="preset of the --checkpoint row (default: the one the model plans with)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    evaluators = [e for e in args.evaluators.split(",") if e]
    if not evaluators or not set(evaluators) <= set(EVALUATORS):
        parser.error(f"--evaluators: choose from {EVALUATORS}")
    precisions = [p for p in args.precisions.split(",") if p]
    if not precisions or not set(precisions) <= set(PRECISIONS):
        parser.error(f"--precisions: choose from {PRECISIONS}")
    variants = [("eager", "float32")] if "eager" in evaluators else []
    variants += [("fast", p) for p in precisions] if "fast" in evaluators else []
    overrides = {}
    if args.samples:
        overrides["num_samples"] = args.samples
        overrides["num_elites"] = min(64, args.samples)
    if args.iterations:
        overrides["iterations"] = args.iterations
    robots = [r for r in args.robots.split(",") if r]
    kinds = [k for k in args.dynamics.split(",") if k]
    for r in robots:
        if r not in ROBOTS:
            parser.error(f"unknown robot {r!r}; choose from {sorted(ROBOTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu"
    )
    threads = torch.get_num_threads()
    print(
        f"device {device} ({name}), torch {torch.__version__}, "
        f"{threads} CPU threads, "
        f"{args.steps} timed steps after {WARMUP_STEPS} warm-up"
    )
    header = (
        f"{'robot':6} {'dynamics':24} {'eval':5} {'prec':4} {'cand':>5} {'iter':>4} {'H/T':>6} "
        f"{'cams':>4} {'min ms':>9} {'median':>9} {'p95':>9} {'max':>9} {'cpu ms':>8} "
        f"{'rate Hz':>8} {'needs':>6} {'speed-up':>8}"
    )
    print(header)
    print("-" * len(header))
    groups = (
        bench(robot, kind, device, args.steps, overrides, variants)
        for robot in robots
        for kind in kinds
    )
    if args.checkpoint:
        checkpoint_rows = bench_checkpoint(
            args.checkpoint, args.planner_preset, device, args.steps, overrides, variants
        )
        groups = [*groups, checkpoint_rows]
    for rows in groups:
        for row in rows:
            ok = "ok" if row["rate"] >= row["target"] else "SLOW"
            speedup = f"{row['speedup']:7.2f}x" if "speedup" in row else ""
            print(
                f"{row['robot']:6} {row['dynamics']:24} {row['evaluator']:5} "
                f"{'bf16' if row['precision'] == 'bfloat16' else 'f32':4} "
                f"{row['candidates']:5d} {row['iterations']:4d} {row['HT']:>6} "
                f"{row['cameras']:4d} {row['min']:9.1f} {row['median']:9.1f} "
                f"{row['p95']:9.1f} {row['max']:9.1f} {row['cpu']:8.1f} {row['rate']:8.1f} "
                f"{row['target']:4.0f}Hz {ok:4} {speedup:>8}",
                flush=True,
            )
        for row in rows:
            print("RESULT " + json.dumps({"device": name, "threads": threads, **row}), flush=True)


if __name__ == "__main__":
    main()
