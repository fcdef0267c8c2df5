"""`simforcing-eval`: held-out PSNR / SSIM (+ LPIPS / FID / FVD from local weights), the ablation
table, the guidance sweep, the (N_s, N_r, w) latency grid, a qualitative PNG grid and the latent
motion gap (how far the sim stream's latent motion, the distillation target, is from the real's).

    simforcing-eval --run runs/sf --heldout heldout.h5 --out runs/sf/eval
    simforcing-eval --small --threads 1 --out runs/small   # data + training + evaluation on a CPU
    simforcing-eval --protocol scarce --workers 2 --out runs/scarce   # the scarce-real protocol

Predictions start from the real first frame and the window's actions. Baselines (copy the first
frame, copy the last context frame, extrapolate the last two context frames linearly) see the
first `context_frames` real frames; every row is scored on the frames after those, which no row
was given.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import logging
import math
import multiprocessing
import os
import time
from typing import Any, NoReturn

import torch

from sim_video_world_model import metrics
from sim_video_world_model.backbones.base import VideoAutoencoder
from sim_video_world_model.checkpoint import ModelBundle, load_bundle
from sim_video_world_model.config import (
    LADDER,
    BackboneConfig,
    TinyBackboneConfig,
    TrainConfig,
    Variant,
)
from sim_video_world_model.objective import latent_motion
from sim_video_world_model.paired_data import (
    MujocoPairsConfig,
    PairedVideoDataset,
    PairedWindows,
    check_disjoint,
    mujoco_pairs,
    synthetic_pairs,
    to_pixels,
)
from sim_video_world_model.pipeline import SimForcingPipeline
from sim_video_world_model.scheduler import FlowMatchScheduler
from sim_video_world_model.train import (
    RunConfig,
    run,
    stage_done,
    student_dir,
    train_episodes,
)

log = logging.getLogger("simforcing.eval")

ROW_NAMES = {
    Variant.SFT: "real-only SFT",
    Variant.JOINT_FM: "+ joint FM",
    Variant.MOTION: "+ motion distillation",
    Variant.FULL: "+ sim conditioning (full)",
    Variant.NO_MOTION: "full without motion distillation",
}


@dataclasses.dataclass
class EvalConfig:
    """`context_frames`: real frames the baselines see (the models see frame 0 only); every row is
    scored on frames context_frames..T-1. `sweep`: the guidance weights w at which the
    sim-conditioned students are evaluated, one row each, on the same windows with the same noise;
    `guidance`: the headline w (the qualitative PNG, the full-vs-SFT verdict), taken as the sweep's
    entry nearest to it (`headline`)."""

    context_frames: int = 2
    sim_steps: int = 5
    real_steps: int = 10
    guidance: float = 0.6
    sweep: tuple[float, ...] = (0.0, 0.3, 0.6, 1.0)
    latency_sim_steps: tuple[int, ...] = (1, 5, 10)
    latency_real_steps: tuple[int, ...] = (1, 5, 10)
    latency_guidance: tuple[float, ...] = (0.0, 0.6, 1.0)
    latency_reps: int = 3
    batch_size: int = 8
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.context_frames < 1:
            raise ValueError(f"context_frames must be >= 1, got {self.context_frames}")
        self.sweep = tuple(float(w) for w in self.sweep)
        if not self.sweep or any(not (math.isfinite(w) and w >= 0.0) for w in self.sweep):
            raise ValueError(f"the guidance sweep needs finite weights >= 0, got {self.sweep}")

    @property
    def headline(self) -> float:
        return min(self.sweep, key=lambda w: (abs(w - self.guidance), w))


def parse_weights(text: str) -> tuple[float, ...]:
    """'0,0.5,1' -> (0.0, 0.5, 1.0), for --guidance."""
    try:
        weights = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from err
    if not weights:
        raise argparse.ArgumentTypeError("no guidance weight given")
    return weights


def baseline_predictions(gt: torch.Tensor, context: int) -> dict[str, torch.Tensor]:
    """Predictions from the first `context` real frames of (N, 3, T, H, W) videos, by name; frames
    0..context-1 are the given ones. Copy the first frame; with two or more context frames also
    copy the last one and extrapolate the last two linearly (x_{c-1} + k (x_{c-1} - x_{c-2}) for
    the k-th frame after them, clamped to [-1, 1])."""
    t = gt.shape[2]
    if not 1 <= context < t:
        raise ValueError(f"{context} context frames leave nothing to predict in {t} frames")
    given, future = gt[:, :, :context], t - context
    rows = {"baseline: copy first frame": gt[:, :, :1].expand(-1, -1, future, -1, -1)}
    if context >= 2:
        last, prev = gt[:, :, context - 1 : context], gt[:, :, context - 2 : context - 1]
        k = torch.arange(1, future + 1, dtype=gt.dtype).view(1, 1, -1, 1, 1)
        rows[f"baseline: copy last context frame (frame {context - 1})"] = last.expand_as(
            gt[:, :, context:]
        )
        rows[f"baseline: linear extrapolation of frames {context - 2}, {context - 1}"] = (
            last + k * (last - prev)
        ).clamp(-1, 1)
    return {name: torch.cat([given, v], dim=2) for name, v in rows.items()}


def predict(
    bundle: ModelBundle,
    data: PairedVideoDataset,
    sim_steps: int,
    real_steps: int,
    w: float,
    cfg: EvalConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted, ground-truth) real videos of every held-out window, (N, 3, T, H, W) on CPU."""
    pipe = SimForcingPipeline(bundle.autoencoder, bundle.denoiser, FlowMatchScheduler(5.0))
    preds, gts = [], []
    for start in range(0, len(data), cfg.batch_size):
        items = [data[i] for i in range(start, min(len(data), start + cfg.batch_size))]
        real = torch.stack([it["real"] for it in items]).to(cfg.device)
        actions = torch.stack([it["actions"] for it in items]).to(cfg.device)
        mask = torch.stack([it["mask"] for it in items]).to(cfg.device)
        out = pipe(
            real[:, :, 0],
            actions,
            real.shape[2],
            robot_mask=mask,
            sim_steps=sim_steps,
            real_steps=real_steps,
            guidance=w,
            seed=cfg.seed + start,
        )
        preds.append(out.video.float().cpu())
        gts.append(real.cpu())
    return torch.cat(preds), torch.cat(gts)


class Scorer:
    """Whole-frame PSNR / SSIM, the same on the moving pixels, the static-area scores and the robot
    centroid error always; LPIPS (whole-frame and moving pixels) / FID / FVD when their local
    weight files are configured.

    Moving pixels: `metrics.motion_mask` of the REAL video (the colour change from the first
    frame, the frame's camera gain taken out, above `motion_threshold` in some channel, pixels in
    [0, 1]); the threshold is given or measured by `calibrate` (NOISE_SIGMAS robust standard
    deviations of the real videos' camera noise). Static pixels: the rest; `psnr_static` is the PSNR
    over them, `static_changed` the share of them the prediction changes by more than the
    threshold. Centroid error and robot-found share: `metrics.robot_tracking` with the first-frame
    colour segmenter, in pixels. A score with nothing to average is None.
    """

    def __init__(
        self,
        lpips_backbone: str | None = None,
        lpips_heads: str | None = None,
        fid_weights: str | None = None,
        fvd_weights: str | None = None,
        motion_threshold: float | None = None,
    ):
        self.m = metrics
        if motion_threshold is not None and not (
            math.isfinite(motion_threshold) and motion_threshold > 0
        ):
            raise ValueError(f"the motion threshold must be > 0, got {motion_threshold}")
        self.motion_threshold = motion_threshold
        self.lpips = (
            metrics.LPIPS(lpips_backbone, lpips_heads) if lpips_backbone and lpips_heads else None
        )
        self.extra: dict[str, torch.nn.Module] = {}
        if fid_weights:
            self.extra["fid"] = metrics.FrechetInceptionDistance(fid_weights)
        if fvd_weights:
            self.extra["fvd"] = metrics.FrechetVideoDistance(fvd_weights)

    def calibrate(self, gt: torch.Tensor, start: int = 1) -> dict[str, float]:
        """Measure the camera noise of real videos (`metrics.measure_noise`) and, where no threshold
        was given, take its threshold as the motion threshold. Returns the measurement."""
        noise = self.m.measure_noise(gt, start)
        if self.motion_threshold is None:
            self.motion_threshold = noise["threshold"]
        return noise

    @property
    def threshold(self) -> float:
        if self.motion_threshold is None:
            raise RuntimeError("no motion threshold: give one or calibrate the scorer first")
        return self.motion_threshold

    def __call__(
        self, pred: torch.Tensor, gt: torch.Tensor, first_mask: torch.Tensor, start: int = 1
    ) -> dict[str, float | None]:
        """Scores of frames start..T-1 of (N, 3, T, H, W) videos; `first_mask` (N, H, W) is the
        robot mask of the real first frame."""
        p, g = pred[:, :, start:], gt[:, :, start:]
        all_moving = self.m.motion_mask(gt, self.threshold)
        moving = all_moving[:, start:]
        scores = {"psnr": self.m.psnr(p, g), "ssim": self.m.ssim(p, g)}
        if self.lpips is not None:
            scores["lpips"] = self.lpips(p, g)
        scores["psnr_moving"] = self.m.masked_psnr(p, g, moving)
        scores["ssim_moving"] = self.m.masked_ssim(p, g, moving)
        if self.lpips is not None:
            scores["lpips_moving"] = self.lpips(p, g, mask=moving)
        scores["psnr_static"] = self.m.masked_psnr(p, g, ~moving)
        scores["static_changed"] = self.m.static_changed(
            pred, gt, all_moving, self.threshold, start
        )
        scores["centroid_px"], scores["robot_found"] = self.m.robot_tracking(
            pred, gt, first_mask, start, self.m.FirstFrameColourSegmenter(self.threshold)
        )
        for name, metric in self.extra.items():
            scores[name] = metric(p, g)
        return {k: (None if math.isnan(v) else v) for k, v in scores.items()}

    def moving_fraction(self, gt: torch.Tensor, start: int = 1) -> float:
        """Fraction of the scored pixels that the motion mask marks as moving."""
        return float(self.m.motion_mask(gt, self.threshold)[:, start:].float().mean())


def latency_grid(bundle: ModelBundle, item: dict, cfg: EvalConfig) -> list[dict]:
    """Seconds per sample (sim generation + real generation + decoding), warm-up excluded."""
    pipe = SimForcingPipeline(bundle.autoencoder, bundle.denoiser, FlowMatchScheduler(5.0))
    real = item["real"][None].to(cfg.device)
    actions, mask = item["actions"][None].to(cfg.device), item["mask"][None].to(cfg.device)
    rows = []
    for ns in cfg.latency_sim_steps:
        for nr in cfg.latency_real_steps:
            for w in cfg.latency_guidance:

                def run():
                    return pipe(
                        real[:, :, 0],
                        actions,
                        real.shape[2],
                        robot_mask=mask,
                        sim_steps=ns,
                        real_steps=nr,
                        guidance=w,
                        seed=cfg.seed,
                    )

                run()
                if cfg.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(cfg.latency_reps):
                    run()
                if cfg.device.startswith("cuda"):
                    torch.cuda.synchronize()
                rows.append(
                    {
                        "sim_steps": ns,
                        "real_steps": nr,
                        "w": w,
                        "seconds": (time.perf_counter() - t0) / cfg.latency_reps,
                    }
                )
    return rows


def qualitative_grid(
    gt: torch.Tensor, rows: dict[str, torch.Tensor], path: str, samples: int = 2
) -> None:
    """PNG: per sample, ground truth then each method, one row of frames each."""
    import matplotlib  # noqa: PLC0415 - plots only; matplotlib is heavy to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - plots only; matplotlib is heavy to import

    def strip(video):  # (3, T, H, W) -> (H, T*W, 3) uint8
        v = ((video.clamp(-1, 1) + 1) * 127.5).round().byte().permute(2, 1, 3, 0)
        return v.reshape(v.shape[0], -1, 3).numpy()

    names = ["ground truth", *rows]
    n = min(samples, gt.shape[0])
    fig, axes = plt.subplots(
        n * len(names), 1, figsize=(gt.shape[2] * 1.2, 1.3 * n * len(names)), squeeze=False
    )
    for s in range(n):
        for r, name in enumerate(names):
            ax = axes[s * len(names) + r, 0]
            ax.imshow(strip(gt[s] if name == "ground truth" else rows[name][s]))
            ax.set_axis_off()
            ax.set_title(f"sample {s}: {name}", fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def students(run_dir: str) -> list[tuple[str, Variant]]:
    """The run's trained students as (directory name, variant), in ablation order; the real-only
    baseline from the base backbone (`student_sft`) before the one from the sim teacher."""
    names = [(student_dir(Variant.SFT, "base"), Variant.SFT)]
    names.append((student_dir(Variant.SFT, "teacher"), Variant.SFT))
    names += [(student_dir(v), v) for v in Variant if v is not Variant.SFT]
    return [(n, v) for n, v in names if os.path.isfile(os.path.join(run_dir, n, "config.json"))]


def verdict(table: list[dict], headline: float) -> dict:
    """The issue-53 criteria on the full student at the headline w, on one split's table: it beats
    every baseline on the moving-pixel PSNR, and every real-only SFT row (the same real-data
    updates) on both the whole-frame and the moving-pixel PSNR. Reports, chooses nothing."""
    full = next((r for r in table if r["variant"] == "full" and r["w"] == headline), None)
    if full is None or full["psnr_moving"] is None:
        return {}
    baselines = [r for r in table if r["variant"] == "baseline" and r["psnr_moving"] is not None]
    sfts = [r for r in table if r["variant"] == "sft"]
    return {
        "full_beats_baselines_moving": bool(
            baselines and all(full["psnr_moving"] > b["psnr_moving"] for b in baselines)
        ),
        "full_beats_sft": {
            r["method"]: bool(
                r["psnr_moving"] is not None
                and full["psnr"] > r["psnr"]
                and full["psnr_moving"] > r["psnr_moving"]
            )
            for r in sfts
        },
    }


SELECTION_RULE = (
    "the model row (any student, any w) with the highest validation selection score "
    "(psnr_moving + psnr_static) / 2"
)


def selection_score(row: dict) -> float | None:
    """(moving-pixel PSNR + static-pixel PSNR) / 2: equal weight to predicting the pixels that
    move and to keeping still the ones that do not, whatever their share of the frame."""
    if row.get("psnr_moving") is None or row.get("psnr_static") is None:
        return None
    return (row["psnr_moving"] + row["psnr_static"]) / 2


def choose(table: list[dict]) -> dict | None:
    """The served row by SELECTION_RULE among the model rows of a VALIDATION table; None when no
    row has both scores."""
    models = [r for r in table if r["variant"] != "baseline" and selection_score(r) is not None]
    if not models:
        return None
    best = max(models, key=lambda r: selection_score(r))  # type: ignore[arg-type, return-value]
    return {
        "method": best["method"],
        "student": best["student"],
        "variant": best["variant"],
        "w": best["w"],
        "selection_score": selection_score(best),
    }


@torch.no_grad()
def motion_gap(
    autoencoder: VideoAutoencoder,
    sim: torch.Tensor,
    real: torch.Tensor,
    threshold: float = metrics.MOTION_THRESHOLD,
    margin: int = 3,
) -> list[dict]:
    """The sim-vs-real disagreement of the encoded videos' latent motion (adjacent latent
    differences, what motion distillation transfers), per latent step, on the latent cells within
    `margin` cells of a pixel that moves in either stream (`moving`; 3 = the reach of the tiny
    autoencoder's convolutions, 22 pixels) and on the rest (`static`).

    sim, real: (N, 3, T, H, W) in [-1, 1], paired. Each row: step k (z_k - z_(k-1)), cells, their
    fraction, mean squared real and sim motion, and `gap` = mean (real - sim)^2. A latent space
    that suits the method has a static gap near 0: a scene that does not move has no latent
    motion, whatever it looks like in either domain.
    """
    z_real, z_sim = autoencoder.encode(real), autoencoder.encode(sim)
    m_real, m_sim = latent_motion(z_real, z_real), latent_motion(z_sim, z_sim)
    pixels = metrics.motion_mask(real, threshold) | metrics.motion_mask(
        sim, threshold, compensate_gain=False
    )
    pixels = pixels.any(1)
    factor = pixels.shape[-1] // z_real.shape[-1]
    moving = torch.nn.functional.max_pool2d(pixels[:, None].float(), factor)
    moving = torch.nn.functional.max_pool2d(moving, 2 * margin + 1, 1, margin)[:, 0] > 0
    rows = []
    for k in range(m_real.shape[2]):
        for cells, where in (("moving", moving), ("static", ~moving)):
            sel = where[:, None].expand_as(m_real[:, :, k])
            if not bool(sel.any()):
                continue
            r, s_ = m_real[:, :, k][sel], m_sim[:, :, k][sel]
            rows.append(
                {
                    "step": k + 1,
                    "cells": cells,
                    "fraction": float(where.float().mean()),
                    "real": float(r.pow(2).mean()),
                    "sim": float(s_.pow(2).mean()),
                    "gap": float((r - s_).pow(2).mean()),
                }
            )
    return rows


def score_split(
    run_dir: str,
    windows: PairedWindows,
    split: str,
    cfg: EvalConfig,
    scorer: Scorer,
    available: list[tuple[str, Variant]],
    out_dir: str,
    latency: bool = False,
) -> dict:
    """Every row (the baselines, then each of `available`'s students at each w) on one split's
    windows; writes `out_dir`/qualitative.png. The file must share no episode with the run's
    training file. Chooses nothing: the caller decides what the scores are for."""
    check_disjoint({"the run's training file": train_episodes(run_dir), split: windows})
    os.makedirs(out_dir, exist_ok=True)
    data = PairedVideoDataset(windows)
    first_mask = torch.stack([data[i]["mask"] for i in range(len(data))])
    gt = torch.stack([data[i]["real"] for i in range(len(data))])
    start = cfg.context_frames
    noise = metrics.measure_noise(gt, start)
    table, preds = [], {}
    for name, pred in baseline_predictions(gt, start).items():
        row: dict[str, Any] = {"method": name, "variant": "baseline", "student": None, "w": None}
        table.append(dict(row, **scorer(pred, gt, first_mask, start)))
        log.info("%s %s", split, table[-1])
    torch.manual_seed(cfg.seed)
    autoencoder = None  # the run's (every student shares it): the latent motion gap
    for dirname, variant in available:
        bundle = load_bundle(os.path.join(run_dir, dirname), cfg.device)
        if autoencoder is None:
            autoencoder = bundle.autoencoder
        # the split's actions in the model's own normalisation (its training file's statistics)
        scaled = PairedVideoDataset(
            windows, (bundle.info["action_low"], bundle.info["action_high"])
        )
        weights = cfg.sweep if variant.sim_conditioning else (0.0,)
        for w in weights:
            pred, _ = predict(bundle, scaled, cfg.sim_steps, cfg.real_steps, w, cfg)
            name = ROW_NAMES[variant] + (f" w={w:g}" if variant.sim_conditioning else "")
            if variant is Variant.SFT:
                name += (
                    " from the sim teacher"
                    if bundle.info.get("init", "teacher") == "teacher"
                    else " from the base backbone"
                )
            row = {
                "method": name,
                "variant": variant.value,
                "student": dirname,
                "w": w,
                **scorer(pred, gt, first_mask, start),
            }
            row["selection_score"] = selection_score(row)
            log.info("%s %s", split, row)
            table.append(row)
            if variant is Variant.SFT or (variant.sim_conditioning and w == cfg.headline):
                preds[name] = pred
    timing = []
    if latency and any(v is Variant.FULL for _, v in available):
        timing = latency_grid(
            load_bundle(os.path.join(run_dir, student_dir(Variant.FULL)), cfg.device),
            data[0],
            cfg,
        )
    qualitative_grid(gt, preds, os.path.join(out_dir, "qualitative.png"))
    sim_videos = torch.stack([data[i]["sim"] for i in range(len(data))])
    assert autoencoder is not None  # `available` is not empty (the callers check)
    gap = motion_gap(autoencoder, sim_videos.to(cfg.device), gt.to(cfg.device), scorer.threshold)
    return {
        "split": split,
        "windows": len(data),
        "episodes": len(set(windows.episodes.tolist())),
        "sim_steps": cfg.sim_steps,
        "real_steps": cfg.real_steps,
        "device": cfg.device,
        "context_frames": start,
        "guidance_sweep": list(cfg.sweep),
        "headline_guidance": cfg.headline,
        "scored_frames": [start, gt.shape[2] - 1],
        "motion_threshold": scorer.threshold,
        "noise": noise,
        "moving_pixel_fraction": scorer.moving_fraction(gt, start),
        "table": table,
        "latency": timing,
        "motion_gap": gap,
        **verdict(table, cfg.headline),
    }


WINNER = "winner"  # <run>/winner: a link to the student directory the video node serves
CHOICE = "choice.json"  # <run>/: every choice, frozen on the validation split
VALIDATION_DIR, TEST_DIR = "validation", "test"  # <run>/<split>/: results.json, results.md, PNG
RESULTS = "results.md"  # <run>/: the validation and test columns side by side


def link_winner(run_dir: str, student: str) -> None:
    """Point `<run_dir>/winner` at `student` (a relative link, replaced atomically)."""
    tmp = os.path.join(run_dir, f".{WINNER}.tmp")
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(student, tmp)
    os.replace(tmp, os.path.join(run_dir, WINNER))


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_digests(run_dir: str, dirname: str) -> dict:
    """A student's step (its train_state.json) and the SHA-256 of its weight files."""
    path = os.path.join(run_dir, dirname)
    with open(os.path.join(path, "train_state.json")) as f:
        state = json.load(f)
    weights = sorted(
        f for f in os.listdir(path) if f.endswith(".safetensors") and not f.startswith("optimizer")
    )
    return {
        "step": int(state["step"]),
        "complete": bool(state.get("complete")),
        "sha256": {f: sha256(os.path.join(path, f)) for f in weights},
    }


def _file_record(run_dir: str, path: str) -> dict:
    """A data file as the choice records it: its path (relative to the run when inside it) and
    SHA-256."""
    absolute, run_abs = os.path.abspath(path), os.path.abspath(run_dir)
    inside = os.path.commonpath([absolute, run_abs]) == run_abs
    return {
        "file": os.path.relpath(absolute, run_abs) if inside else absolute,
        "sha256": sha256(path),
    }


def _resolve(run_dir: str, record: dict) -> str:
    return os.path.join(run_dir, record["file"])  # an absolute path stays absolute


def _write_json(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=2)
    os.replace(path + ".tmp", path)


def _write_text(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def validate(
    run_dir: str, validation: str, test: str | None, cfg: EvalConfig, scorer: Scorer
) -> dict:
    """Score every row on the validation split and make every choice there: the motion threshold
    (measured on its real videos unless the scorer has one), the served row (`choose`, linked as
    `<run>/winner`). The choices, the evaluation settings, the test file's and every student
    checkpoint's SHA-256 are frozen in `<run>/choice.json` for `score_test`. Refused once the test
    split has been scored: choosing again after seeing it is what the split exists to prevent."""
    test_dir = os.path.join(run_dir, TEST_DIR)
    if os.path.lexists(test_dir):
        raise RuntimeError(
            f"{run_dir}: the test split has been scored ({test_dir}); choosing again after seeing "
            "it would choose on the test split: a new choice needs a new run"
        )
    available = students(run_dir)
    if not available:
        raise FileNotFoundError(f"no student_<variant>/ checkpoint under {run_dir}")
    val_windows = PairedWindows.load(validation)
    splits: dict[str, Any] = {"the run's training file": train_episodes(run_dir)}
    splits["validation"] = val_windows
    if test is not None:
        splits["test"] = PairedWindows.load_episodes(test)
    check_disjoint(splits)
    gt = to_pixels(val_windows.real)
    scorer.calibrate(gt, cfg.context_frames)
    out_dir = os.path.join(run_dir, VALIDATION_DIR)
    result = score_split(
        run_dir, val_windows, "validation", cfg, scorer, available, out_dir, latency=True
    )
    winner = choose(result["table"])
    if winner is None:
        raise ValueError(f"{validation}: no model row has a moving and a static score")
    result["served"] = winner
    choice = {
        "frozen_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "selection_rule": SELECTION_RULE,
        "served": winner,
        "motion_threshold": scorer.threshold,
        "noise": result["noise"],
        "eval": {
            k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("device", "guidance")
        }
        | {"guidance": cfg.headline},
        "validation": _file_record(run_dir, validation),
        "test": None if test is None else _file_record(run_dir, test),
        "students": {name: checkpoint_digests(run_dir, name) for name, _ in available},
    }
    _write_json(os.path.join(out_dir, "results.json"), result)
    _write_text(os.path.join(out_dir, "results.md"), format_markdown(result))
    _write_json(os.path.join(run_dir, CHOICE), choice)
    link_winner(run_dir, winner["student"])
    return result


def read_choice(run_dir: str) -> dict:
    path = os.path.join(run_dir, CHOICE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: no frozen choice; score the validation split first "
            f"(simforcing-eval --run {run_dir} --validation FILE --test FILE)"
        )
    with open(path) as f:
        return json.load(f)


def score_test(run_dir: str, scorer: Scorer, device: str = "cpu") -> dict:
    """Score the test split ONCE with everything `<run>/choice.json` froze: its rows, settings and
    motion threshold; the served row stays the validation's. Refused without a frozen choice or a
    test file in it, when the test file or a student checkpoint differs from the frozen one, and
    when a test scoring has started before (finished or not: its scores may have been seen).
    Writes `<run>/test/` and `<run>/results.md` (validation and test side by side)."""
    choice = read_choice(run_dir)
    if choice.get("test") is None:
        raise ValueError(f"{run_dir}: the frozen choice names no test file")
    if scorer.motion_threshold is not None:
        raise ValueError("the test split is scored with the frozen motion threshold, not a new one")
    test_dir = os.path.join(run_dir, TEST_DIR)
    if os.path.lexists(test_dir):
        _refuse_scored(run_dir, test_dir)
    test = _resolve(run_dir, choice["test"])
    if sha256(test) != choice["test"]["sha256"]:
        raise ValueError(f"{test} is not the test file the choice froze (its SHA-256 differs)")
    for name, frozen in choice["students"].items():
        now = checkpoint_digests(run_dir, name)
        if now != frozen:
            raise ValueError(
                f"{run_dir}/{name} changed since the choice was frozen (step {frozen['step']} -> "
                f"{now['step']} or other weights): the test scores the frozen checkpoints only"
            )
    try:
        os.makedirs(test_dir)
    except FileExistsError:
        _refuse_scored(run_dir, test_dir)
    _write_json(
        os.path.join(test_dir, "started.json"),
        {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
    )
    scorer.motion_threshold = float(choice["motion_threshold"])
    cfg = EvalConfig(device=device, **choice["eval"])
    available = [(name, Variant(load_info_variant(run_dir, name))) for name in choice["students"]]
    result = score_split(
        run_dir, PairedWindows.load(test), "test", cfg, scorer, available, test_dir
    )
    result["served"] = choice["served"]
    _write_json(os.path.join(test_dir, "results.json"), result)
    _write_text(os.path.join(test_dir, "results.md"), format_markdown(result))
    with open(os.path.join(run_dir, VALIDATION_DIR, "results.json")) as f:
        validation = json.load(f)
    _write_text(os.path.join(run_dir, RESULTS), format_splits(validation, result, choice))
    return result


def _refuse_scored(run_dir: str, test_dir: str) -> NoReturn:
    done = os.path.isfile(os.path.join(test_dir, "results.json"))
    raise RuntimeError(
        f"{run_dir}: the test split was scored already ({test_dir}"
        + ("" if done else ", started and not finished: its scores may have been seen")
        + "); it is scored once"
    )


def load_info_variant(run_dir: str, dirname: str) -> str:
    """The variant a student checkpoint was trained as (its config.json)."""
    with open(os.path.join(run_dir, dirname, "config.json")) as f:
        return json.load(f)["info"]["variant"]


COLUMNS = {
    "psnr": "PSNR",
    "ssim": "SSIM",
    "lpips": "LPIPS",
    "psnr_moving": "moving PSNR",
    "ssim_moving": "moving SSIM",
    "lpips_moving": "moving LPIPS",
    "psnr_static": "static PSNR",
    "static_changed": "static changed",
    "centroid_px": "centroid err (px)",
    "robot_found": "robot found",
    "fid": "FID",
    "fvd": "FVD",
}


def format_markdown(result: dict) -> str:
    keys = [k for k in COLUMNS if k in result["table"][0]]
    noise = result["noise"]
    lines = [
        f"Split: {result['split']}, {result['windows']} windows of {result['episodes']} episodes, "
        f"N_s={result['sim_steps']}, N_r={result['real_steps']}, device {result['device']}",
        f"Scored frames {result['scored_frames'][0]}..{result['scored_frames'][1]}: the models "
        f"see frame 0, the baselines frames 0..{result['context_frames'] - 1}",
        "Guidance sweep (sim-conditioned students): w = "
        + ", ".join(f"{w:g}" for w in result["guidance_sweep"]),
        f"Camera noise of this split's real videos: sigma {noise['sigma']:.4f} (gain-compensated "
        f"frame differences), gain jitter {noise['gain_jitter']:.4f}",
        f"Moving pixels (gain-compensated change > {result['motion_threshold']:.4f}): "
        f"{100 * result['moving_pixel_fraction']:.1f}% of the scored pixels",
        "",
        "| method | " + " | ".join(COLUMNS[k] for k in keys) + " | selection |",
        "|---|" + "---|" * (len(keys) + 1),
    ]
    lines += [
        f"| {r['method']} | "
        + " | ".join(_fmt(r[k]) for k in keys)
        + f" | {_fmt(r.get('selection_score'))} |"
        for r in result["table"]
    ]
    if result["latency"]:
        lines += ["", "| N_s | N_r | w | seconds / sample |", "|---|---|---|---|"]
        lines += [
            f"| {r['sim_steps']} | {r['real_steps']} | {r['w']:g} | {r['seconds']:.3f} |"
            for r in result["latency"]
        ]
    if result.get("motion_gap"):
        lines += [
            "",
            "Latent motion, sim vs real (the encoded pairs; what motion distillation transfers):",
            "",
            "| latent step | cells | fraction | real motion^2 | sim motion^2 | (real - sim)^2 |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['step']} | {r['cells']} | {r['fraction']:.2f} | {r['real']:.4f} "
            f"| {r['sim']:.4f} | {r['gap']:.4f} |"
            for r in result["motion_gap"]
        ]
    lines += _verdict_lines(result)
    if "served" in result:
        lines += [
            "",
            f"Served (chosen on the validation split, {SELECTION_RULE}): "
            f"{result['served']['method']}",
        ]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _verdict_lines(result: dict) -> list[str]:
    if "full_beats_sft" not in result:
        return []
    w = f"w={result['headline_guidance']:g}"
    lines = [
        "",
        f"Full student ({w}) beats every baseline on moving-pixel PSNR "
        f"({result['split']}): {result['full_beats_baselines_moving']}",
    ]
    lines += [
        f"Full student ({w}) beats {name} on whole-frame and moving-pixel PSNR "
        f"({result['split']}): {won}"
        for name, won in result["full_beats_sft"].items()
    ]
    return lines


SPLIT_COLUMNS = ("psnr", "psnr_moving", "psnr_static", "static_changed", "centroid_px")


def format_splits(validation: dict, test: dict, choice: dict) -> str:
    """One table: every row's validation and test scores side by side, the served row marked."""
    served = choice["served"]
    heads = [COLUMNS[k] for k in SPLIT_COLUMNS]
    lines = [
        f"Validation: {validation['windows']} windows of {validation['episodes']} episodes; "
        f"test: {test['windows']} windows of {test['episodes']} episodes (scored once, after "
        f"the choice of {choice['frozen_at']}).",
        f"Frames {test['scored_frames'][0]}..{test['scored_frames'][1]}, N_s={test['sim_steps']}, "
        f"N_r={test['real_steps']}; moving pixels: gain-compensated change > "
        f"{choice['motion_threshold']:.4f} (measured on validation); moving share "
        f"{100 * validation['moving_pixel_fraction']:.1f}% (validation) / "
        f"{100 * test['moving_pixel_fraction']:.1f}% (test).",
        f"Served (chosen on validation: {SELECTION_RULE}): {served['method']}.",
        "",
        "| method | "
        + " | ".join(f"val {h}" for h in heads)
        + " | "
        + " | ".join(f"test {h}" for h in heads)
        + " |",
        "|---|" + "---|" * (2 * len(heads)),
    ]
    test_rows = {(r["method"], r["student"]): r for r in test["table"]}
    for r in validation["table"]:
        t = test_rows.get((r["method"], r["student"]), {})
        mark = " (served)" if (r["student"], r["w"]) == (served["student"], served["w"]) else ""
        lines.append(
            f"| {r['method']}{mark} | "
            + " | ".join(_fmt(r.get(k)) for k in SPLIT_COLUMNS)
            + " | "
            + " | ".join(_fmt(t.get(k)) for k in SPLIT_COLUMNS)
            + " |"
        )
    lines += _verdict_lines(validation) + _verdict_lines(test)
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A CPU-scale recipe: paired data (generated once, in parts that run in parallel) in three
    splits disjoint by episode seed, the training budgets of every stage, the real-data budget,
    the students, then the validation table and the frozen choice (the test split is scored by
    `score_test`, once).

    `train_parts`: (episodes, seed) per generation part, concatenated in order; `validation`,
    `test`: (episodes, seed); `real_windows`: the first N training windows keep their real stream
    (None: all, sim and real equally many); `variants` (and `sft_inits`): the students of the
    first student seed; `replica_variants` (`replica_sft_inits`): the students another student
    seed trains on the same autoencoder and teacher (`<out>/seed<N>`)."""

    name: str
    train_parts: tuple[tuple[int, int], ...]
    validation: tuple[int, int] = (6, 2)
    test: tuple[int, int] = (6, 4)
    episode_steps: int = 20
    real_windows: int | None = None
    autoencoder_steps: int = 1000
    teacher_steps: int = 800
    student_steps: int = 300
    sft_inits: tuple[str, ...] = ("base",)
    variants: tuple[Variant, ...] = LADDER
    replica_variants: tuple[Variant, ...] = (Variant.SFT, Variant.FULL)
    replica_sft_inits: tuple[str, ...] = ("teacher",)

    def run_config(self, device: str) -> RunConfig:
        tiny = TinyBackboneConfig(
            spatial_factor=4,
            latent_channels=8,
            ae_channels=32,
            hidden=96,
            heads=4,
            layers=4,
            ffn=256,
        )
        common: dict[str, Any] = dict(device=device, batch_size=8, log_every=10, save_every=100)
        return RunConfig(
            backbone=BackboneConfig(tiny=tiny),
            autoencoder_train=TrainConfig(
                steps=self.autoencoder_steps, lr=2e-3, **dict(common, batch_size=4)
            ),
            teacher_train=TrainConfig(steps=self.teacher_steps, lr=5e-4, **common),
            student_train=TrainConfig(steps=self.student_steps, lr=3e-4, **common),
            real_windows=self.real_windows,
        )


PROTOCOLS = {
    # every window paired: 96 training windows, 24 validation, 24 test (the quick look's size)
    "small": Protocol("small", train_parts=((24, 1),)),
    # the scarce-real protocol (revision 2: validation and test splits): 480 sim windows train the
    # teacher, the first 48 (12 episodes) keep their real stream; the students and both real-only
    # baselines get the same 600 real-data updates (100 epochs of the real windows), so a sim
    # motion prior has room to matter
    "scarce": Protocol(
        "scarce",
        train_parts=((60, 1), (60, 3)),
        validation=(12, 2),
        test=(24, 4),
        real_windows=48,
        teacher_steps=2000,
        student_steps=600,
        sft_inits=("base", "teacher"),
        variants=(*LADDER, Variant.NO_MOTION),
        replica_variants=(Variant.SFT, Variant.FULL, Variant.NO_MOTION),
    ),
}
SPLIT_FILES = {"train": "train.h5", "validation": "validation.h5", "test": "test.h5"}


def _generate_part(task: str, episodes: int, seed: int, steps: int, path: str) -> str:
    """One part of a protocol's data (9-frame windows, stride 4); written whole or not at all."""
    windows = mujoco_pairs(episodes, 9, 4, MujocoPairsConfig(task=task, steps=steps), seed=seed)
    windows.save(path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def check_protocol_splits(out: str) -> None:
    """The protocol's train / validation / test files share no episode seed (a ValueError
    naming the splits and seeds otherwise)."""
    check_disjoint(
        {name: PairedWindows.load_episodes(os.path.join(out, f)) for name, f in SPLIT_FILES.items()}
    )


def protocol_data(protocol: Protocol, out: str, source: str = "peg", workers: int = 1) -> None:
    """`out`/train.h5, validation.h5 and test.h5 for `protocol` (kept when they exist): MuJoCo
    episodes of the sim task replayed in its "real" variant, in the protocol's parts, checked
    disjoint by episode seed; `source="synthetic"` writes one fixed small synthetic-arm set
    whatever the protocol (machines without the UR5e models)."""
    os.makedirs(out, exist_ok=True)
    paths = {name: os.path.join(out, f) for name, f in SPLIT_FILES.items()}
    if all(os.path.isfile(p) for p in paths.values()):
        return
    if source == "synthetic":
        made = {
            "train": synthetic_pairs(48, num_frames=9, steps=24, stride=4, seed=1),
            "validation": synthetic_pairs(8, num_frames=9, steps=24, stride=8, seed=2),
            "test": synthetic_pairs(8, num_frames=9, steps=24, stride=8, seed=4),
        }
        check_disjoint(made)
        for name, windows in made.items():
            windows.save(paths[name])
        return
    jobs = [
        (source, n, seed, protocol.episode_steps, os.path.join(out, f"train_part{i}.h5"))
        for i, (n, seed) in enumerate(protocol.train_parts)
    ]
    jobs.append((source, *protocol.validation, protocol.episode_steps, paths["validation"]))
    jobs.append((source, *protocol.test, protocol.episode_steps, paths["test"]))
    todo = [job for job in jobs if not os.path.isfile(job[-1])]
    if workers > 1 and len(todo) > 1:
        spawn = multiprocessing.get_context("spawn")  # no EGL context or torch threads forked
        with concurrent.futures.ProcessPoolExecutor(min(workers, len(todo)), spawn) as pool:
            for future in [pool.submit(_generate_part, *job) for job in todo]:
                future.result()
    else:
        for job in todo:
            _generate_part(*job)
    parts = [PairedWindows.load(job[-1]) for job in jobs[:-2]]
    check_disjoint(
        {
            **{f"training part {i}": p for i, p in enumerate(parts)},
            "validation": PairedWindows.load_episodes(paths["validation"]),
            "test": PairedWindows.load_episodes(paths["test"]),
        }
    )
    PairedWindows.concat(parts).save(paths["train"] + ".tmp")
    os.replace(paths["train"] + ".tmp", paths["train"])


def protocol_train(
    protocol: Protocol,
    out: str,
    device: str,
    source: str | None = None,
    workers: int = 1,
    student_seed: int | None = None,
) -> str:
    """Data (the MuJoCo peg, or `source`: a task or "synthetic"), the split check, then training,
    each resumed from `out` where it stopped. Returns the run directory: `out` for the protocol's
    student seed (every stage, `protocol.variants`), `out/seed<N>` for another (the replica
    students on `out`'s autoencoder and teacher, which must be trained)."""
    os.makedirs(out, exist_ok=True)
    protocol_data(protocol, out, source or "peg", workers)
    check_protocol_splits(out)
    cfg = protocol.run_config(device)
    data = os.path.join(out, SPLIT_FILES["train"])
    if student_seed is None or student_seed == cfg.student_train.seed:
        stages = ["autoencoder", "teacher", "student"]
        run(cfg, data, out, stages, list(protocol.variants), True, protocol.sft_inits)
        return out
    if not stage_done(os.path.join(out, "teacher")):
        raise FileNotFoundError(
            f"{out}/teacher is not trained: run the protocol's first student seed "
            f"({cfg.student_train.seed}) first; another seed shares its autoencoder and teacher"
        )
    replica = os.path.join(out, f"seed{student_seed}")
    os.makedirs(replica, exist_ok=True)
    for stage in ("autoencoder", "teacher"):
        link = os.path.join(replica, stage)
        if not os.path.lexists(link):
            os.symlink(os.path.join("..", stage), link)
    cfg.student_train = dataclasses.replace(cfg.student_train, seed=student_seed)
    run(
        cfg,
        data,
        replica,
        ["student"],
        list(protocol.replica_variants),
        True,
        protocol.replica_sft_inits,
    )
    return replica


def protocol_run(
    protocol: Protocol,
    out: str,
    device: str,
    source: str | None = None,
    scorer: Scorer | None = None,
    workers: int = 1,
    student_seed: int | None = None,
    **eval_options,
) -> dict:
    """`protocol_train`, then the validation table and the frozen choice (`validate`) of its run
    directory; the test split is left for `score_test`. `eval_options` are EvalConfig fields."""
    run_dir = protocol_train(protocol, out, device, source, workers, student_seed)
    return validate(
        run_dir,
        os.path.join(out, SPLIT_FILES["validation"]),
        os.path.join(out, SPLIT_FILES["test"]),
        EvalConfig(device=device, sim_steps=1, real_steps=10, latency_reps=2, **eval_options),
        scorer or Scorer(),
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--run", help="training run directory with student_<variant>/ checkpoints")
    p.add_argument("--validation", help="validation paired-window HDF5 file (every choice)")
    p.add_argument("--test", help="test paired-window HDF5 file, frozen into the choice")
    p.add_argument(
        "--score-test",
        action="store_true",
        help="score the test split of --run once, with its frozen choice (chooses nothing)",
    )
    p.add_argument("--out", help="--protocol: the protocol's directory")
    p.add_argument(
        "--small",
        action="store_true",
        help="--protocol small: generate data, train every variant and evaluate (about 30 min)",
    )
    p.add_argument(
        "--protocol",
        choices=sorted(PROTOCOLS),
        help="generate a protocol's data, train every row, score validation and freeze the "
        "choice (resumes from --out)",
    )
    p.add_argument(
        "--student-seed",
        type=int,
        help="--protocol: train the protocol's replica students with this seed in <out>/seed<N>",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="parallel data-generation processes (--protocol)"
    )
    p.add_argument(
        "--source", help="--protocol data source: 'peg', 'table_leg' or 'synthetic' (default: peg)"
    )
    p.add_argument("--device", default="cpu")
    # the evaluation settings are choices: --score-test refuses them (None = not given)
    p.add_argument("--sim-steps", type=int, help="N_s (default 5; the protocols: 1)")
    p.add_argument("--real-steps", type=int, help="N_r (default 10)")
    p.add_argument(
        "--guidance",
        type=parse_weights,
        metavar="W[,W...]",
        help="guidance weights for the sim-conditioned students, one row each (default: "
        + ",".join(f"{w:g}" for w in EvalConfig.sweep)
        + ")",
    )
    p.add_argument(
        "--headline-guidance",
        type=float,
        help="w of the PNG and the full-vs-SFT verdict (the listed weight nearest to it; "
        f"default {EvalConfig.guidance:g})",
    )
    p.add_argument(
        "--context-frames",
        type=int,
        help="real frames the baselines see; every row is scored on the frames after them "
        f"(default {EvalConfig.context_frames})",
    )
    p.add_argument(
        "--motion-threshold",
        type=float,
        help="colour change (pixels in [0, 1], gain taken out) that marks a real pixel as moving "
        "(default: measured on the validation split's camera noise)",
    )
    p.add_argument("--lpips-backbone", help="local AlexNet weights (safetensors or state dict)")
    p.add_argument("--lpips-heads", help="local LPIPS linear-head weights")
    p.add_argument("--fid-weights", help="local Inception-v3 weights")
    p.add_argument("--fvd-weights", help="local R3D-18 weights")
    p.add_argument(
        "--threads", type=int, help="torch CPU threads (1 is fastest on a busy shared CPU)"
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = {
        "sim_steps": args.sim_steps,
        "real_steps": args.real_steps,
        "sweep": args.guidance,
        "guidance": args.headline_guidance,
        "context_frames": args.context_frames,
    }
    given = {k: v for k, v in settings.items() if v is not None}
    scorer = Scorer(
        args.lpips_backbone,
        args.lpips_heads,
        args.fid_weights,
        args.fvd_weights,
        args.motion_threshold,
    )
    protocol = "small" if args.small else args.protocol
    if args.score_test:
        chosen = [k for k in ("validation", "test", "protocol", "student_seed") if getattr(args, k)]
        if args.motion_threshold is not None:
            chosen.append("motion_threshold")
        chosen += list(given)
        if chosen or args.small:
            p.error(
                "--score-test chooses nothing: it takes the frozen choice's settings, not "
                + ", ".join("--" + k.replace("_", "-") for k in chosen or ["small"])
            )
        if not args.run:
            p.error("--score-test needs --run")
        result = score_test(args.run, scorer, args.device)
        print(format_markdown(result))
        print(f"validation and test side by side: {os.path.join(args.run, RESULTS)}")
        return
    if protocol:
        if not args.out:
            p.error("--protocol needs --out")
        given.pop("sim_steps", None), given.pop("real_steps", None)  # the protocols' own N_s, N_r
        result = protocol_run(
            PROTOCOLS[protocol],
            args.out,
            args.device,
            args.source,
            scorer,
            args.workers,
            args.student_seed,
            **given,
        )
        run_dir = args.out if args.student_seed is None else f"{args.out}/seed{args.student_seed}"
    else:
        if not (args.run and args.validation):
            p.error("--run and --validation are needed unless --protocol, --small or --score-test")
        cfg = EvalConfig(device=args.device, **given)
        result = validate(args.run, args.validation, args.test, cfg, scorer)
        run_dir = args.run
    print(format_markdown(result))
    print(
        f"choice frozen in {os.path.join(run_dir, CHOICE)}; commit it, then score the test split "
        f"once: simforcing-eval --score-test --run {run_dir}"
    )


if __name__ == "__main__":
    main()
