"""Closed-loop checkpoint selection (`simdist-select-checkpoint`): of a run's kept checkpoints,
the one whose base policy pi does best on seeded simulation episodes becomes the run's model.

    simdist-select-checkpoint --run RUN --task peg --region wide --episodes 20 --workers 2

Why: on Peg Wide pi's success swings between checkpoints 250 steps apart while every training
loss agrees to three digits, so the last step's weights are a draw (measurements:
docs/notebook/peg_wide.md). pi alone is scored, not the planner: the planner starts from pi's
chunks and stays close to them, and pi's episodes run faster (on the peg about 17 against 10 a
minute per process).

Checkpoints are ranked by success rate, then mean return, then the later step. The scores of
every checkpoint go to RUN/selection.json; RUN/model is rewritten with the chosen weights (the
last step's stay in RUN/checkpoints and RUN/train_state). A checkpoint that does not load is
reported and skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing as mp
import pathlib
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor

import torch

from robot_drivers.registry import make_task
from simdist_planner.evaluation.agents import build_agents, check_model_fits
from simdist_planner.evaluation.evaluate import evaluate, task_overrides
from simdist_planner.model.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_metrics,
    save_checkpoint,
)
from simdist_planner.training.config import CheckpointSelection

SELECTION_FILE = "selection.json"


class SelectionError(RuntimeError):
    """No checkpoint of the run could be scored."""


def task_for(selection: CheckpointSelection, model=None):
    """The selection's task, rendering at the model's image size."""

    return make_task(
        selection.task,
        selection.variant,
        **task_overrides(
            selection.task, selection.region or None, selection.max_steps or None, model
        ),
    )


def check_fits(selection: CheckpointSelection, model) -> None:
    """Raise ValueError unless the selection's task exists and `model` can drive its robot
    (called before pretraining, so a wrong task fails in seconds, not after the run)."""

    task = task_for(selection, model)
    try:
        check_model_fits(model, task.spec)
    finally:
        task.close()


def _step_of(path: pathlib.Path) -> int:
    return int(path.name.split("-")[-1])


def score_checkpoint(path, selection: CheckpointSelection, device: str = "cpu") -> dict:
    """pi of one checkpoint on the selection's episodes: a JSON-ready dict ("error" set when the
    checkpoint does not load)."""

    path = pathlib.Path(path)
    row = {"checkpoint": str(path), "step": _step_of(path)}
    try:
        model = load_checkpoint(path, device=device)
    except CheckpointError as err:
        return {**row, "error": str(err)}
    start = time.perf_counter()
    task = task_for(selection, model)
    try:
        agents = build_agents(["policy"], task, model, device)
        (summary,) = evaluate(task, agents, selection.episodes, selection.seed, progress=False)
    finally:
        task.close()
    return {
        **row,
        "error": None,
        "success_rate": summary.success_rate,
        "mean_return": summary.mean_return,
        "mean_distance": summary.mean_distance,
        "episodes": summary.episodes,
        "errors": summary.errors,
        "seconds": time.perf_counter() - start,
    }


def _score_in_worker(job: tuple) -> dict:
    torch.set_num_threads(1)  # one core per worker process
    return score_checkpoint(*job)


def best_of(rows: list[dict]) -> dict:
    """The best scored row: success rate, then mean return, then the later step."""
    scored = [r for r in rows if r["error"] is None]
    if not scored:
        raise SelectionError(
            "no checkpoint could be scored: "
            + "; ".join(f"{r['checkpoint']}: {r['error']}" for r in rows)
        )
    return max(scored, key=lambda r: (r["success_rate"], r["mean_return"], r["step"]))


def select_checkpoint(run, selection: CheckpointSelection, device: str = "cpu", log=print) -> dict:
    """Score every checkpoint in RUN/checkpoints, write RUN/selection.json and make the best
    RUN/model; returns the report written."""
    run = pathlib.Path(run)
    paths = sorted((p for p in (run / "checkpoints").glob("step-*") if p.is_dir()), key=_step_of)
    if not paths:
        raise SelectionError(f"{run / 'checkpoints'} holds no step-* checkpoints to select from")
    jobs = [(p, selection, device) for p in paths]
    log(
        f"checkpoint selection: pi of {len(paths)} checkpoints on {selection.task} "
        f"({selection.variant}), "
        f"seeds {selection.seed}..{selection.seed + selection.episodes - 1}, "
        f"{selection.workers} worker(s)"
    )
    rows = []
    with contextlib.ExitStack() as stack:
        if selection.workers == 1:
            scores: Iterable[dict] = (score_checkpoint(*job) for job in jobs)
        else:
            pool = stack.enter_context(
                ProcessPoolExecutor(
                    min(selection.workers, len(jobs)), mp_context=mp.get_context("spawn")
                )
            )
            scores = pool.map(_score_in_worker, jobs)
        for row in scores:
            rows.append(row)
            log(_describe(row))
    best = best_of(rows)
    model = load_checkpoint(best["checkpoint"], device="cpu")
    previous = read_metrics(run / "model") if (run / "model").is_dir() else {}
    report = {
        "selection": dataclasses.asdict(selection),
        "checkpoints": rows,
        "selected_step": best["step"],
        "selected": best["checkpoint"],
    }
    save_checkpoint(
        model,
        run / "model",
        metrics={
            **previous,
            **read_metrics(best["checkpoint"]),
            "selected_step": best["step"],
            "selection": SELECTION_FILE,
        },
    )
    tmp = run / f".{SELECTION_FILE}.tmp"
    tmp.write_text(json.dumps(report, indent=1, default=float))
    tmp.replace(run / SELECTION_FILE)
    log(
        f"checkpoint selection: step {best['step']} is {run / 'model'} "
        f"(success {best['success_rate']:.2f}, return {best['mean_return']:.2f})"
    )
    return report


def _describe(row: dict) -> str:
    if row["error"] is not None:
        return f"  step {row['step']}: skipped, {row['error']}"
    return (
        f"  step {row['step']}: success {row['success_rate']:.2f}, return {row['mean_return']:.2f} "
        f"({row['episodes']} episodes, {row['seconds']:.0f} s)"
    )
