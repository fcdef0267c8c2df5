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
import json
import logging
import math
import multiprocessing
import os
import time
from typing import Any

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
    mujoco_pairs,
    synthetic_pairs,
)
from sim_video_world_model.pipeline import SimForcingPipeline
from sim_video_world_model.scheduler import FlowMatchScheduler
from sim_video_world_model.train import RunConfig, run, student_dir

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
    """Whole-frame PSNR / SSIM, the same on the moving pixels, and the robot centroid error always;
    LPIPS (whole-frame and moving pixels) / FID / FVD when their local weight files are configured.

    Moving pixels: `metrics.motion_mask` of the REAL video (|real_t - real_0| > `motion_threshold`
    in some channel, pixels in [0, 1]). Centroid error and robot-found share:
    `metrics.robot_tracking` with the first-frame colour segmenter, in pixels. A score with nothing
    to average (no moving pixel, no robot in the first mask) is None.
    """

    def __init__(
        self,
        lpips_backbone: str | None = None,
        lpips_heads: str | None = None,
        fid_weights: str | None = None,
        fvd_weights: str | None = None,
        motion_threshold: float = metrics.MOTION_THRESHOLD,
    ):
        self.m = metrics
        self.motion_threshold = motion_threshold
        self.segmenter = metrics.FirstFrameColourSegmenter(motion_threshold)
        self.lpips = (
            metrics.LPIPS(lpips_backbone, lpips_heads) if lpips_backbone and lpips_heads else None
        )
        self.extra: dict[str, torch.nn.Module] = {}
        if fid_weights:
            self.extra["fid"] = metrics.FrechetInceptionDistance(fid_weights)
        if fvd_weights:
            self.extra["fvd"] = metrics.FrechetVideoDistance(fvd_weights)

    def __call__(
        self, pred: torch.Tensor, gt: torch.Tensor, first_mask: torch.Tensor, start: int = 1
    ) -> dict[str, float | None]:
        """Scores of frames start..T-1 of (N, 3, T, H, W) videos; `first_mask` (N, H, W) is the
        robot mask of the real first frame."""
        p, g = pred[:, :, start:], gt[:, :, start:]
        moving = self.m.motion_mask(gt, self.motion_threshold)[:, start:]
        scores = {"psnr": self.m.psnr(p, g), "ssim": self.m.ssim(p, g)}
        if self.lpips is not None:
            scores["lpips"] = self.lpips(p, g)
        scores["psnr_moving"] = self.m.masked_psnr(p, g, moving)
        scores["ssim_moving"] = self.m.masked_ssim(p, g, moving)
        if self.lpips is not None:
            scores["lpips_moving"] = self.lpips(p, g, mask=moving)
        scores["centroid_px"], scores["robot_found"] = self.m.robot_tracking(
            pred, gt, first_mask, start, self.segmenter
        )
        for name, metric in self.extra.items():
            scores[name] = metric(p, g)
        return {k: (None if math.isnan(v) else v) for k, v in scores.items()}

    def moving_fraction(self, gt: torch.Tensor, start: int = 1) -> float:
        """Fraction of the scored pixels that the motion mask marks as moving."""
        return float(self.m.motion_mask(gt, self.motion_threshold)[:, start:].float().mean())


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
    """The issue's criteria on the full student at the headline w: it beats every baseline on
    the moving-pixel PSNR, and every real-only SFT row (the same real-data updates) on both the
    whole-frame and the moving-pixel PSNR. `winner` is the model row with the highest moving-pixel
    PSNR (the one the video node serves)."""
    out: dict = {}
    models = [r for r in table if r["variant"] != "baseline" and r["psnr_moving"] is not None]
    if models:
        best = max(models, key=lambda r: r["psnr_moving"])
        out["winner"] = {k: best[k] for k in ("method", "student", "w")}
    full = next((r for r in table if r["variant"] == "full" and r["w"] == headline), None)
    if full is None or full["psnr_moving"] is None:
        return out
    baselines = [r for r in table if r["variant"] == "baseline" and r["psnr_moving"] is not None]
    sfts = [r for r in table if r["variant"] == "sft"]
    out["full_beats_baselines_moving"] = bool(
        baselines and all(full["psnr_moving"] > b["psnr_moving"] for b in baselines)
    )
    out["full_beats_sft"] = {
        r["method"]: bool(
            r["psnr_moving"] is not None
            and full["psnr"] > r["psnr"]
            and full["psnr_moving"] > r["psnr_moving"]
        )
        for r in sfts
    }
    return out


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
    pixels = (metrics.motion_mask(real, threshold) | metrics.motion_mask(sim, threshold)).any(1)
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


def evaluate_run(run_dir: str, heldout: str, out_dir: str, cfg: EvalConfig, scorer: Scorer) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    windows = PairedWindows.load(heldout)
    data = PairedVideoDataset(windows)
    first_mask = torch.stack([data[i]["mask"] for i in range(len(data))])
    gt = torch.stack([data[i]["real"] for i in range(len(data))])
    start = cfg.context_frames
    table, preds = [], {}
    available = students(run_dir)
    if not available:
        raise FileNotFoundError(f"no student_<variant>/ checkpoint under {run_dir}")
    for name, pred in baseline_predictions(gt, start).items():
        row: dict[str, Any] = {"method": name, "variant": "baseline", "student": None, "w": None}
        table.append(dict(row, **scorer(pred, gt, first_mask, start)))
        log.info("%s", table[-1])
    torch.manual_seed(cfg.seed)
    autoencoder = None  # the run's (every student shares it): the latent motion gap
    for dirname, variant in available:
        bundle = load_bundle(os.path.join(run_dir, dirname), cfg.device)
        if autoencoder is None:
            autoencoder = bundle.autoencoder
        # the held-out actions in the model's own normalisation (its training file's statistics)
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
            log.info("%s", row)
            table.append(row)
            if variant is Variant.SFT or (variant.sim_conditioning and w == cfg.headline):
                preds[name] = pred
    latency = []
    if any(v is Variant.FULL for _, v in available):
        latency = latency_grid(
            load_bundle(os.path.join(run_dir, student_dir(Variant.FULL)), cfg.device),
            data[0],
            cfg,
        )
    qualitative_grid(gt, preds, os.path.join(out_dir, "qualitative.png"))
    sim_videos = torch.stack([data[i]["sim"] for i in range(len(data))])
    assert autoencoder is not None  # `available` is not empty (checked above)
    gap = motion_gap(autoencoder, sim_videos.to(cfg.device), gt.to(cfg.device))
    result = {
        "heldout_windows": len(data),
        "sim_steps": cfg.sim_steps,
        "real_steps": cfg.real_steps,
        "device": cfg.device,
        "context_frames": start,
        "guidance_sweep": list(cfg.sweep),
        "headline_guidance": cfg.headline,
        "scored_frames": [start, gt.shape[2] - 1],
        "motion_threshold": scorer.motion_threshold,
        "moving_pixel_fraction": scorer.moving_fraction(gt, start),
        "table": table,
        "latency": latency,
        "motion_gap": gap,
        **verdict(table, cfg.headline),
    }
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(format_markdown(result))
    if "winner" in result:
        link_winner(run_dir, result["winner"]["student"])
    return result


WINNER = "winner"  # <run>/winner: a link to the student directory the video node serves


def link_winner(run_dir: str, student: str) -> None:
    """Point `<run_dir>/winner` at `student` (a relative link, replaced atomically)."""
    tmp = os.path.join(run_dir, f".{WINNER}.tmp")
    if os.path.lexists(tmp):
        os.remove(tmp)
    os.symlink(student, tmp)
    os.replace(tmp, os.path.join(run_dir, WINNER))


COLUMNS = {
    "psnr": "PSNR",
    "ssim": "SSIM",
    "lpips": "LPIPS",
    "psnr_moving": "moving PSNR",
    "ssim_moving": "moving SSIM",
    "lpips_moving": "moving LPIPS",
    "centroid_px": "centroid err (px)",
    "robot_found": "robot found",
    "fid": "FID",
    "fvd": "FVD",
}


def format_markdown(result: dict) -> str:
    keys = [k for k in COLUMNS if k in result["table"][0]]
    lines = [
        f"Held-out windows: {result['heldout_windows']}, N_s={result['sim_steps']}, "
        f"N_r={result['real_steps']}, device {result['device']}",
        f"Scored frames {result['scored_frames'][0]}..{result['scored_frames'][1]}: the models "
        f"see frame 0, the baselines frames 0..{result['context_frames'] - 1}",
        "Guidance sweep (sim-conditioned students): w = "
        + ", ".join(f"{w:g}" for w in result["guidance_sweep"]),
        f"Moving pixels (|real_t - real_0| > {result['motion_threshold']:g}): "
        f"{100 * result['moving_pixel_fraction']:.1f}% of the scored pixels",
        "",
        "| method | " + " | ".join(COLUMNS[k] for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    lines += [
        f"| {r['method']} | "
        + " | ".join("n/a" if r[k] is None else f"{r[k]:.4f}" for k in keys)
        + " |"
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
            "Latent motion, sim vs real (the encoded held-out pairs; what motion distillation "
            "transfers):",
            "",
            "| latent step | cells | fraction | real motion^2 | sim motion^2 | (real - sim)^2 |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['step']} | {r['cells']} | {r['fraction']:.2f} | {r['real']:.4f} "
            f"| {r['sim']:.4f} | {r['gap']:.4f} |"
            for r in result["motion_gap"]
        ]
    if "full_beats_sft" in result:
        w = f"w={result['headline_guidance']:g}"
        lines += [
            "",
            f"Full student ({w}) beats every baseline on moving-pixel PSNR: "
            f"{result['full_beats_baselines_moving']}",
        ]
        lines += [
            f"Full student ({w}) beats {name} on whole-frame and moving-pixel PSNR: {won}"
            for name, won in result["full_beats_sft"].items()
        ]
    if "winner" in result:
        lines += ["", f"Best moving-pixel PSNR (the model to serve): {result['winner']['method']}"]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A CPU-scale recipe: paired data (generated once, in parts that run in parallel), the
    training budgets of every stage, the real-data budget and the SFT baselines, then the table.

    `train_parts`: (episodes, seed) per generation part, concatenated in order; `real_windows`:
    the first N training windows keep their real stream (None: all, sim and real equally many)."""

    name: str
    train_parts: tuple[tuple[int, int], ...]
    heldout: tuple[int, int] = (6, 2)
    episode_steps: int = 20
    real_windows: int | None = None
    autoencoder_steps: int = 1000
    teacher_steps: int = 800
    student_steps: int = 300
    sft_inits: tuple[str, ...] = ("base",)

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
    # every window paired: 96 training / 24 held-out windows (the tests' and the quick look's size)
    "small": Protocol("small", train_parts=((24, 1),)),
    # the scarce-real protocol: 480 sim windows train the teacher, the first 48 (12 episodes) keep
    # their real stream; the students and both real-only baselines get the same 600 real-data
    # updates (100 epochs of the real windows), so a sim motion prior has room to matter
    "scarce": Protocol(
        "scarce",
        train_parts=((60, 1), (60, 3)),
        real_windows=48,
        teacher_steps=2000,
        student_steps=600,
        sft_inits=("base", "teacher"),
    ),
}


def _generate_part(task: str, episodes: int, seed: int, steps: int, path: str) -> str:
    """One part of a protocol's data (9-frame windows, stride 4); written whole or not at all."""
    windows = mujoco_pairs(episodes, 9, 4, MujocoPairsConfig(task=task, steps=steps), seed=seed)
    windows.save(path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def protocol_data(protocol: Protocol, out: str, source: str = "peg", workers: int = 1) -> None:
    """`out`/train.h5 and heldout.h5 for `protocol` (kept when they exist): MuJoCo episodes of the
    sim task replayed in its "real" variant, in the protocol's parts; `source="synthetic"` writes
    one fixed small synthetic-arm set whatever the protocol (machines without the UR5e models)."""
    os.makedirs(out, exist_ok=True)
    train_file, heldout_file = os.path.join(out, "train.h5"), os.path.join(out, "heldout.h5")
    if os.path.isfile(train_file) and os.path.isfile(heldout_file):
        return
    if source == "synthetic":
        synthetic_pairs(48, num_frames=9, steps=24, stride=4, seed=1).save(train_file)
        synthetic_pairs(8, num_frames=9, steps=24, stride=8, seed=2).save(heldout_file)
        return
    jobs = [
        (source, n, seed, protocol.episode_steps, os.path.join(out, f"train_part{i}.h5"))
        for i, (n, seed) in enumerate(protocol.train_parts)
    ]
    jobs.append((source, *protocol.heldout, protocol.episode_steps, heldout_file))
    todo = [job for job in jobs if not os.path.isfile(job[-1])]
    if workers > 1 and len(todo) > 1:
        spawn = multiprocessing.get_context("spawn")  # no EGL context or torch threads forked
        with concurrent.futures.ProcessPoolExecutor(min(workers, len(todo)), spawn) as pool:
            for future in [pool.submit(_generate_part, *job) for job in todo]:
                future.result()
    else:
        for job in todo:
            _generate_part(*job)
    parts = [PairedWindows.load(job[-1]) for job in jobs[:-1]]
    PairedWindows.concat(parts).save(train_file + ".tmp")
    os.replace(train_file + ".tmp", train_file)


def protocol_run(
    protocol: Protocol,
    out: str,
    device: str,
    source: str | None = None,
    scorer: Scorer | None = None,
    workers: int = 1,
    **eval_options,
) -> dict:
    """Data (the MuJoCo peg, or `source`: a task or "synthetic") -> training -> evaluation, each
    step resumed from `out` where it stopped; `eval_options` are EvalConfig fields."""
    os.makedirs(out, exist_ok=True)
    protocol_data(protocol, out, source or "peg", workers)
    run(
        protocol.run_config(device),
        os.path.join(out, "train.h5"),
        out,
        ["autoencoder", "teacher", "student"],
        list(LADDER),
        resume=True,
        sft_inits=protocol.sft_inits,
    )
    return evaluate_run(
        out,
        os.path.join(out, "heldout.h5"),
        os.path.join(out, "eval"),
        EvalConfig(device=device, sim_steps=1, real_steps=10, latency_reps=2, **eval_options),
        scorer or Scorer(),
    )


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--run", help="training run directory with student_<variant>/ checkpoints")
    p.add_argument("--heldout", help="held-out paired-window HDF5 file")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--small",
        action="store_true",
        help="--protocol small: generate data, train every variant and evaluate (about 30 min)",
    )
    p.add_argument(
        "--protocol",
        choices=sorted(PROTOCOLS),
        help="generate a protocol's data, train every row and evaluate (resumes from --out)",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="parallel data-generation processes (--protocol)"
    )
    p.add_argument(
        "--source", help="--small data source: 'peg', 'table_leg' or 'synthetic' (default: peg)"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--sim-steps", type=int, default=5)
    p.add_argument("--real-steps", type=int, default=10)
    p.add_argument(
        "--guidance",
        type=parse_weights,
        default=EvalConfig.sweep,
        metavar="W[,W...]",
        help="guidance weights for the sim-conditioned students, one row each (default: "
        + ",".join(f"{w:g}" for w in EvalConfig.sweep)
        + ")",
    )
    p.add_argument(
        "--headline-guidance",
        type=float,
        default=EvalConfig.guidance,
        help="w of the PNG and the full-vs-SFT verdict (the listed weight nearest to it)",
    )
    p.add_argument(
        "--context-frames",
        type=int,
        default=EvalConfig.context_frames,
        help="real frames the baselines see; every row is scored on the frames after them",
    )
    p.add_argument("--lpips-backbone", help="local AlexNet weights (safetensors or state dict)")
    p.add_argument("--lpips-heads", help="local LPIPS linear-head weights")
    p.add_argument("--fid-weights", help="local Inception-v3 weights")
    p.add_argument("--fvd-weights", help="local R3D-18 weights")
    p.add_argument(
        "--motion-threshold",
        type=float,
        default=metrics.MOTION_THRESHOLD,
        help="colour change (pixels in [0, 1]) that marks a real pixel as moving",
    )
    p.add_argument(
        "--threads", type=int, help="torch CPU threads (1 is fastest on a busy shared CPU)"
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    scorer = Scorer(
        args.lpips_backbone,
        args.lpips_heads,
        args.fid_weights,
        args.fvd_weights,
        args.motion_threshold,
    )
    protocol = "small" if args.small else args.protocol
    if protocol:
        result = protocol_run(
            PROTOCOLS[protocol],
            args.out,
            args.device,
            args.source,
            scorer,
            args.workers,
            context_frames=args.context_frames,
            sweep=args.guidance,
            guidance=args.headline_guidance,
        )
    else:
        if not (args.run and args.heldout):
            p.error("--run and --heldout are required unless --small or --protocol")
        cfg = EvalConfig(
            sim_steps=args.sim_steps,
            real_steps=args.real_steps,
            sweep=args.guidance,
            guidance=args.headline_guidance,
            device=args.device,
            context_frames=args.context_frames,
        )
        result = evaluate_run(args.run, args.heldout, args.out, cfg, scorer)
    print(format_markdown(result))


if __name__ == "__main__":
    main()
