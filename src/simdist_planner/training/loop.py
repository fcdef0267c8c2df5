"""The pretraining loop: minimise Eq. 2 over (H, T) windows of the simulation dataset.

`pretrain(cfg, out)` trains (or resumes) the run in `out`, in one process or one per rank under
torchrun (DDP: gloo on CPU, nccl on CUDA; rank r reads every world_size-th episode of the
selection). Official optimiser: Adam, lr linear warm-up to 2e-4 then cosine to 1e-4.

Run directory:
    pretrain.json              the PretrainConfig (a resumed run must match it)
    train_state/               model checkpoint + optimizer.safetensors + state.json (exact resume)
    checkpoints/step-NNNNNNN/  periodic world-model checkpoints (the last few are kept)
    model/                     the final world-model checkpoint
    tb/                        TensorBoard scalars: every loss term, lr, windows/s

Exact resume: every random draw of step s (window indices, augmentation noise, dropout) comes
from generators seeded by (seed, rank, s), and the learning rate is a function of s, so the
optimizer moments and the step counter are the whole training state.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from simdist_planner.model.checkpoint import (
    load_checkpoint,
    read_config,
    recover_dir,
    save_checkpoint,
)
from simdist_planner.model.losses import TERMS, NearField, near_field_slices, world_model_loss
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.config import PretrainConfig
from simdist_planner.training.distributed import gather_digests, init_distributed, out_of_time
from simdist_planner.training.encoder_stage import pretrain_image_backbone
from simdist_planner.training.sampler import AugmentedWindows, WindowSource, step_seed
from simdist_planner.training.scaler_fit import fit_scaler
from simdist_planner.training.train_state import (
    check_resume_config,
    load_train_state,
    save_train_state,
    weights_sha256,
)

# Settings that add zero-initialised parameters: a warm start may switch them on (the model then
# computes what the earlier one did, and the new parameters start at their initial values).
WARM_START_ADDED = ("policy_proprio_skip",)


def lr_at(cfg: PretrainConfig, step: int) -> float:
    """Linear warm-up from 0 to the peak, then cosine decay to the end value (optax's schedule)."""
    opt = cfg.optimiser
    if step < opt.warmup_steps:
        return opt.learning_rate * step / opt.warmup_steps
    decay = max(opt.decay_steps or cfg.steps, opt.warmup_steps + 1)
    frac = min(step - opt.warmup_steps, decay - opt.warmup_steps) / (decay - opt.warmup_steps)
    return opt.end_learning_rate + (opt.learning_rate - opt.end_learning_rate) * 0.5 * (
        1 + math.cos(math.pi * frac)
    )


def pretrain(
    cfg: PretrainConfig,
    out,
    device: str = "cpu",
    progress: bool = True,
    check_model: Callable[[WorldModel], None] | None = None,
) -> pathlib.Path:
    """Train (or resume) the run in `out`; returns the final checkpoint directory `out/model`.

    `check_model` (rank 0, before the first step) may raise to refuse the built model, so that a
    run whose model a later step cannot use fails before it trains."""
    out = pathlib.Path(out)
    rank, world, local_rank = init_distributed(device)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
    torch.set_num_threads(cfg.threads)
    source = WindowSource(cfg, rank, world)
    if rank == 0 and source.cum_weights is not None:
        print(f"pretrain: rank 0 draws {source.weighting}")
    model = _build_model(cfg, source)
    if check_model is not None and rank == 0:
        check_model(model)
    model.to(dev)
    # a save killed between its fallback renames: the previous version back; rank 0 also
    # removes what killed saves left beside it (no rank is saving yet)
    if recover_dir(out / "train_state", remove_leftovers=rank == 0) is not None:
        print(f"pretrain: recovered {out / 'train_state'} from the save before the interrupted one")
    resuming = (out / "train_state" / "state.json").is_file()
    frozen = _encoder_stage(model, source, cfg, dev, rank, out, progress, resuming)
    near: NearField = ()
    if cfg.state_near_field:
        if source.windows is None:
            raise ValueError("state_near_field needs shard data with a task state, not synthetic")
        near = near_field_slices(
            source.windows.dataset.layout, cfg.state_near_field, "state_near_field"
        )
    optimizer = torch.optim.Adam(
        [p for p in model.parameters() if p.requires_grad], lr=lr_at(cfg, 0)
    )
    start = _open_run(out, cfg, model, optimizer, rank, world, resuming)
    run = _train(
        model, optimizer, source, cfg, out, dev, rank, world, start, near, frozen, progress
    )
    _finish(model, out, cfg, dev, rank, world, start, run)
    return out / "model"


def _build_model(cfg: PretrainConfig, source: WindowSource) -> WorldModel:
    """The seeded model with its scaler fitted on the data, warm-started from `cfg.init_from`
    (an earlier run's weights and scaler; the optimizer starts fresh)."""
    torch.manual_seed(cfg.seed)
    model = WorldModel(source.model_config)
    fit_scaler(model, cfg, source)
    if cfg.init_from:
        earlier = read_config(cfg.init_from)
        added = {
            k: False
            for k in WARM_START_ADDED
            if getattr(model.config, k) and not getattr(earlier, k)
        }
        loaded = load_checkpoint(cfg.init_from, expect=model.config.replace(**added)).state_dict()
        new = set(model.state_dict()) - set(loaded)
        missing, unexpected = model.load_state_dict(loaded, strict=not added)
        if unexpected or set(missing) != new:
            raise ValueError(
                f"warm start from {cfg.init_from}: missing {missing}, unexpected {unexpected}"
            )
    return model


def _encoder_stage(model, source, cfg, dev, rank, out, progress, resuming) -> bool:
    """The optional image-backbone stage before the first step of a new run (its result lives
    on in the model's weights); returns whether the backbone stays frozen."""
    stage = cfg.encoder_stage
    if stage is not None and not resuming:
        encoder_writer = None
        if rank == 0:
            encoder_writer = SummaryWriter(str(out / "tb" / "encoder"))
        _, losses = pretrain_image_backbone(model, source, cfg, dev, rank, encoder_writer, progress)
        if encoder_writer is not None:
            encoder_writer.close()
            print(
                f"pretrain: encoder stage, {stage.steps} steps, "
                f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
            )
    frozen = stage is not None and stage.freeze_backbone
    if frozen:
        model.encoder.images.backbone.requires_grad_(False)
    return frozen


def _open_run(out, cfg, model, optimizer, rank: int, world: int, resuming: bool) -> int:
    """Resume the train state (the config must match) or start at step 0; rank 0 writes
    pretrain.json. Returns the first step to run."""
    start = 0
    if resuming:
        check_resume_config(out, cfg)
        start = load_train_state(out, model, optimizer)
    if world > 1:
        dist.barrier()  # every rank has read the old pretrain.json before rank 0 rewrites it
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "pretrain.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    if world > 1:
        dist.barrier()
    return start


@dataclass
class _Run:
    """How the training steps of this process ended."""

    done: int  # steps done in total (this run and the ones before)
    metrics: dict  # the last logged metrics
    t_start: float  # perf_counter at the first step of this run


class _LossLog:
    """Loss terms averaged over each logging interval, to TensorBoard (rank 0) and the bar."""

    def __init__(self, cfg: PretrainConfig, world: int, writer, bar):
        self.cfg, self.world, self.writer, self.bar = cfg, world, writer, bar
        self.sums = {k: 0.0 for k in ("total", *TERMS)}
        self.count, self.t_log = 0, time.perf_counter()
        self.metrics: dict = {}

    def add(self, values: dict) -> None:
        for k, v in values.items():
            self.sums[k] += v
        self.count += 1

    def flush(self, done: int, lr: float) -> None:
        now = time.perf_counter()
        metrics = {f"loss/{k}": v / self.count for k, v in self.sums.items()}
        metrics["lr"] = lr
        metrics["windows_per_s"] = (
            self.count * self.cfg.batch_size * self.world / (now - self.t_log)
        )
        if self.writer is not None:
            for k, v in metrics.items():
                self.writer.add_scalar(k, v, done)
        self.bar.set_postfix(loss=f"{metrics['loss/total']:.4f}", lr=f"{lr:.2e}")
        self.sums = {k: 0.0 for k in self.sums}
        self.count, self.t_log = 0, now
        self.metrics = metrics


def _train(
    model, optimizer, source, cfg, out, dev, rank, world, start, near, frozen, progress
) -> _Run:
    """Steps start .. cfg.steps (or until the time limit): Eq. 2 on each step's batch, logging
    and periodic checkpoints (rank 0)."""
    train_model = model
    if world > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None
        )
    if cfg.compile:
        train_model = torch.compile(train_model)
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and dev.type == "cuda")

    writer = None
    if rank == 0:
        writer = SummaryWriter(str(out / "tb"), purge_step=start)
    loader = torch.utils.data.DataLoader(
        AugmentedWindows(source),
        batch_size=None,
        sampler=range(start, cfg.steps),
        num_workers=cfg.workers,
        persistent_workers=False,
        prefetch_factor=2 if cfg.workers else None,
    )
    bar = tqdm(
        total=cfg.steps,
        initial=start,
        disable=not progress or rank != 0,
        desc="pretrain",
        dynamic_ncols=True,
    )
    log = _LossLog(cfg, world, writer, bar)
    t_start = log.t_log
    done = start
    model.train()
    if frozen:
        model.encoder.images.backbone.eval()  # frozen: batch-norm statistics stay as they were too
    for step, batch in enumerate(loader, start=start):
        torch.manual_seed(step_seed(cfg.seed, rank, step, 2))  # dropout of this step
        batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
        lr = lr_at(cfg, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            terms = world_model_loss(train_model, batch, near_field=near)
        optimizer.zero_grad(set_to_none=True)
        terms.total.backward()
        optimizer.step()
        values = terms.as_floats()
        if not math.isfinite(values["total"]):
            raise FloatingPointError(
                f"pretrain: loss became {values['total']} at step {step}: {values}"
            )
        log.add(values)
        done = step + 1
        bar.update(1)
        stop = done < cfg.steps and out_of_time(cfg, t_start, world, dev)
        if done % cfg.log_every == 0 or done == cfg.steps or stop:
            log.flush(done, lr)
        if done % cfg.checkpoint_every == 0 or done == cfg.steps or stop:
            if rank == 0:
                save_train_state(out, model, optimizer, done, log.metrics)
                save_checkpoint(
                    model,
                    out / "checkpoints" / f"step-{done:07d}",
                    metrics={"step": done, **log.metrics},
                )
                _prune(out / "checkpoints", cfg.keep_checkpoints)
            if world > 1:
                dist.barrier()
        if stop:
            break
    bar.close()
    if writer is not None:
        writer.close()
    return _Run(done, log.metrics, t_start)


def _finish(model, out, cfg, dev, rank: int, world: int, start: int, run: _Run) -> None:
    """Every rank must end with the same weights; rank 0 writes the final checkpoint."""
    digest = weights_sha256(model)
    digests = gather_digests(digest, world, dev)
    if len(set(digests)) != 1:
        raise RuntimeError(f"pretrain: ranks ended with different weights: {digests}")
    if rank == 0:
        final = {
            "step": run.done,
            **run.metrics,
            "world_size": world,
            "rank_weights_sha256": digests,
            "seconds_this_run": time.perf_counter() - run.t_start,
            "steps_this_run": run.done - start,
            "stopped_at_time_limit": run.done < cfg.steps,
            "model_config": cfg.model,
        }
        save_checkpoint(model, out / "model", metrics=final)
    if world > 1:
        dist.barrier()


def _prune(folder: pathlib.Path, keep: int) -> None:
    ckpts = sorted(p for p in folder.glob("step-*") if p.is_dir())
    for p in ckpts[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
