"""Eq. 3: re-fit only the dynamics f on real windows; E, C, R, V and pi stay frozen.

One clear loop (as in nanoGPT): Adam on f's parameters, linear warm-up then constant lr, batches
from the training episodes, the held-out latent loss measured on episodes never trained on.
Official settings: batch 32, lr 2e-4, 2k warm-up steps, 100 epochs, 95/5 split by episode; the
step budget here is a parameter because a robot adapts between episodes, not overnight.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from robot_drivers.described import setting
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.windows import WindowDataset
from simdist_planner.model.losses import adaptation_loss, freeze_for_adaptation
from simdist_planner.model.world_model import WorldModel


@dataclass
class AdaptConfig:
    """Settings of one adaptation round. A field with `setting` metadata is described once: the
    adapter node declares its ROS parameter from it (robot_drivers.described)."""

    batch_size: int = field(
        default=32, metadata=setting("Eq. 3 batch size (official 32)", low=1, high=4096)
    )
    lr: float = field(
        default=2e-4,
        metadata=setting("Adam learning rate of f (official 2e-4)", low=1e-7, high=1.0),
    )
    warmup_steps: int = field(
        default=2000,
        metadata=setting(
            "linear warm-up steps (capped at a tenth of the round)", low=0, high=1000000
        ),
    )
    epochs: int = field(
        default=100,
        metadata=setting("passes over D_real per round (official 100)", low=1, high=100000),
    )
    max_steps: int | None = None  # cap on optimiser steps (None: `epochs` full passes)
    holdout: float = field(
        default=0.05,
        metadata=setting(
            "fraction of episodes held out for the validation gate", low=0.01, high=0.5
        ),
    )
    seed: int = 0
    device: str = field(
        default="cpu", metadata=setting("torch device of the worker (cpu, cuda, cuda:N)")
    )
    train_encoder: bool = field(  # the paper: complete failure
        default=False, metadata=setting("ablation: also unfreeze the encoder E")
    )
    train_value: bool = field(  # the paper: catastrophic forgetting
        default=False, metadata=setting("ablation: also unfreeze the value function V")
    )
    eval_batches: int | None = None  # cap on held-out batches per evaluation (None: all)
    # Forgetting guard (not in the paper; docs/adaptation.md): simulation shards, e.g. a sample
    # of the pretraining data. A few on-policy episodes cover few actions; a fitted f can forget
    # the rest, and the planner then exploits it. With sim_data, the gate also compares the
    # latent loss on sim windows, and `sim_replay` of every batch can be sim windows.
    sim_data: str = field(
        default="",
        metadata=setting(
            "simulation shards (e.g. a sample of the pretraining data): forgetting guard"
        ),
    )
    sim_replay: float = field(  # 0: real windows only, the paper
        default=0.0,
        metadata=setting(
            "fraction of each batch replayed from sim_data (0 = real windows only)",
            low=0.0,
            high=0.9,
        ),
    )
    max_sim_loss_increase: float = field(  # relative
        default=0.5,
        metadata=setting(
            "gate: refuse a candidate whose sim latent loss rose by more", low=0.0, high=100.0
        ),
    )
    sim_windows: int = 512  # sim windows in the gate's comparison (a fixed, seeded sample)

    def __post_init__(self):
        for name in ("batch_size", "warmup_steps", "epochs"):
            if getattr(self, name) < (1 if name != "warmup_steps" else 0):
                raise ValueError(f"AdaptConfig.{name} must be positive, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"AdaptConfig.lr must be > 0, got {self.lr}")
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"AdaptConfig.holdout must be in (0, 1), got {self.holdout}")
        if not 0.0 <= self.sim_replay < 1.0:
            raise ValueError(f"AdaptConfig.sim_replay must be in [0, 1), got {self.sim_replay}")
        if self.sim_replay > 0 and not self.sim_data:
            raise ValueError("AdaptConfig.sim_replay needs sim_data (simulation shards to replay)")
        if self.max_sim_loss_increase < 0 or self.sim_windows < 1:
            raise ValueError("AdaptConfig.max_sim_loss_increase must be >= 0 and sim_windows >= 1")


def window_batch(items: list[dict]) -> dict[str, torch.Tensor]:
    """Collate WindowDataset items into the flat model window.

    Args:
        items: WindowDataset items ({"obs": {...}, "actions", "rewards", "values", "expert"}).

    Returns:
        Key -> stacked tensor, the observation keys at the top level.
    """
    out = {k: torch.stack([it["obs"][k] for it in items]) for k in items[0]["obs"]}
    for k in ("actions", "rewards", "values", "expert"):
        out[k] = torch.stack([it[k] for it in items])
    return out


def _to(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def real_windows(
    dataset_dir,
    history: int,
    horizon: int,
    holdout: float,
    seed: int,
    heldout_seeds: Collection[int] | None = None,
):
    """The (train, held-out) window datasets of D_real, split by episode: a seeded `holdout` share
    of the episodes, or with `heldout_seeds` exactly the episodes of those seeds (a gate set fixed
    for a whole experiment; none of them is ever trained on).

    Args:
        dataset_dir: the D_real shard directory.
        history: the model's history length H.
        horizon: its horizon T.
        holdout: the share of episodes held out (without `heldout_seeds`).
        seed: the seed of that draw.
        heldout_seeds: the held-out episodes' seeds, or None.

    Returns:
        (train, held-out) Subsets of the windows; ValueError for fewer than 2 usable episodes, no
        episode of the gate seeds or an empty side.
    """
    data = ShardedDataset(dataset_dir)
    windows = WindowDataset(data, history, horizon)
    usable = np.unique(windows.episode_index)  # episodes long enough for at least one window
    n = len(usable)
    if n < 2:
        raise ValueError(
            f"D_real in {dataset_dir} has {n} episode(s) long enough for a window "
            f"(H={history}, T={horizon}); need at least 2 to hold one out"
        )
    if heldout_seeds is not None:
        gate = set(heldout_seeds)
        held = np.array([i for i in usable if int(data.episode_info(int(i))["seed"]) in gate])
        if len(held) == 0:
            raise ValueError(
                f"D_real in {dataset_dir} holds no usable episode of the gate seeds {sorted(gate)}"
            )
    else:
        order = np.random.default_rng(seed).permutation(usable)
        held = order[: min(n - 1, max(1, int(round(holdout * n))))]
    is_held = np.isin(windows.episode_index, held)
    train, heldout = np.nonzero(~is_held)[0], np.nonzero(is_held)[0]
    if len(train) == 0 or len(heldout) == 0:
        raise ValueError(
            f"D_real split left {len(train)} training and {len(heldout)} held-out windows"
        )
    return Subset(windows, train.tolist()), Subset(windows, heldout.tolist())


def sim_windows(config: AdaptConfig, history: int, horizon: int):
    """The simulation windows of the forgetting guard and of replay.

    Args:
        config: the adaptation settings (its `sim_data`).
        history: the model's history length H.
        horizon: its horizon T.

    Returns:
        The WindowDataset of `config.sim_data`; None without sim data.
    """
    if not config.sim_data:
        return None
    return WindowDataset(ShardedDataset(config.sim_data), history, horizon)


def _sample(windows, n: int, seed: int):
    """A fixed, seeded subset of at most n windows."""
    picks = np.random.default_rng(seed).permutation(len(windows))[:n]
    return Subset(windows, np.sort(picks).tolist())


@torch.no_grad()
def latent_loss(
    model: WorldModel, windows, batch_size: int = 64, device="cpu", max_batches: int | None = None
) -> float:
    """The mean Eq. 3 loss of a model (in eval mode) over windows: the validation gate's figure.

    Args:
        model: the world model.
        windows: the windows scored.
        batch_size: windows per batch.
        device: where the batches go.
        max_batches: score at most this many batches (None: all).

    Returns:
        The mean loss per window; ValueError when there is no window.
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    loader = DataLoader(windows, batch_size=batch_size, shuffle=False, collate_fn=window_batch)
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        b = next(iter(batch.values())).shape[0]
        total += float(adaptation_loss(model, _to(batch, device))) * b
        count += b
    model.train(was_training)
    if count == 0:
        raise ValueError("no held-out windows to evaluate")
    return total / count


@dataclass
class AdaptResult:
    model: WorldModel
    heldout_before: float
    heldout_after: float
    train_loss: float
    steps: int
    seconds: float
    config: dict
    sim_before: float | None = None  # latent loss on the sim sample (None without sim_data)
    sim_after: float | None = None


def finetune_dynamics(
    model: WorldModel, train, heldout, config: AdaptConfig, progress=None
) -> AdaptResult:
    """Fine-tune a COPY of a model with Eq. 3 (the input model is left untouched), with the
    settings' frozen parts, schedule and sim replay.

    Args:
        model: the deployed world model.
        train: the training windows.
        heldout: the held-out windows (scored before and after).
        config: the adaptation settings.
        progress: `progress(step, total_steps, loss)` after every optimiser step (status topic,
            bars), or None.

    Returns:
        The AdaptResult: the fine-tuned copy, held-out and sim losses before and after, the
        training loss, steps and time; FloatingPointError when the loss becomes non-finite.
    """
    device = torch.device(config.device)
    torch.manual_seed(config.seed)
    candidate = copy.deepcopy(model).to(device)
    before = latent_loss(candidate, heldout, config.batch_size, device, config.eval_batches)
    sim = sim_windows(config, model.config.history, model.config.horizon)
    sim_check = None if sim is None else _sample(sim, config.sim_windows, config.seed)
    sim_before = (
        None if sim is None else latent_loss(candidate, sim_check, config.batch_size, device)
    )
    n_sim = min(
        int(round(config.sim_replay * config.batch_size)), config.batch_size - 1
    )  # >= 1 real window
    params = freeze_for_adaptation(candidate, config.train_encoder, config.train_value)
    optimiser = torch.optim.Adam(params, lr=config.lr)
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    warmup = max(1, min(config.warmup_steps, total // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: min(1.0, (s + 1) / warmup))
    gen = torch.Generator().manual_seed(config.seed)
    loader = DataLoader(
        train,
        batch_size=config.batch_size - n_sim,
        shuffle=True,
        drop_last=False,
        collate_fn=window_batch,
        generator=gen,
    )
    replay = np.random.default_rng(config.seed + 1)
    start, step, running = time.perf_counter(), 0, float("nan")
    while step < total:
        for batch in loader:
            if n_sim:
                extra = window_batch([sim[int(i)] for i in replay.integers(0, len(sim), n_sim)])
                batch = {k: torch.cat([batch[k], extra[k]]) for k in batch}
            loss = adaptation_loss(candidate, _to(batch, device))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"adaptation loss became {float(loss)} at step {step}")
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            running = (
                float(loss.detach()) if step == 0 else 0.9 * running + 0.1 * float(loss.detach())
            )
            step += 1
            if progress is not None:
                progress(step, total, float(loss))
            if step >= total:
                break
    candidate.eval()
    for p in candidate.parameters():
        p.requires_grad_(True)
    after = latent_loss(candidate, heldout, config.batch_size, device, config.eval_batches)
    sim_after = (
        None if sim is None else latent_loss(candidate, sim_check, config.batch_size, device)
    )
    return AdaptResult(
        candidate,
        before,
        after,
        running,
        step,
        time.perf_counter() - start,
        asdict(config),
        sim_before,
        sim_after,
    )
