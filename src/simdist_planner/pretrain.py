"""simdist-pretrain: minimise Eq. 2 over (H, T) windows of the simulation dataset.

    simdist-pretrain --preset ur5e_peg --data runs/data/peg --out runs/pretrain/peg
    torchrun --nproc_per_node 4 -m simdist_planner.pretrain --preset go2 --data D --out O --device cuda

One process, or one per rank under torchrun (DDP: gloo on CPU, nccl on CUDA; rank r reads every
world_size-th episode of the selection). Official optimiser: Adam, lr linear warm-up to 2e-4 then
cosine to 1e-4. Observation augmentation on the model inputs (o_{t-H..t}): per-term Gaussian noise
with the stds stored in the dataset, and for cameras brightness / contrast / shift per window.

Run directory:
    pretrain.json              the PretrainConfig (a resumed run must match it)
    train_state/               model checkpoint + optimizer.safetensors + state.json (exact resume),
                               ema/ with the weight average when ema_decay > 0
    checkpoints/step-NNNNNNN/  periodic world-model checkpoints (the last few are kept)
    model/                     the final world-model checkpoint (the weight average with ema_decay > 0)
    tb/                        TensorBoard scalars: every loss term, lr, windows/s

Exact resume: every random draw of step s (window indices, augmentation noise, dropout) comes
from generators seeded by (seed, rank, s), and the learning rate is a function of s, so the
optimizer moments, the step counter and the weight average are the whole training state.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import shutil
import time
import uuid

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from simdist_planner.checkpoint import load_checkpoint, read_config, replace_dir, save_checkpoint
from simdist_planner.checkpoint_selection import check_fits, select_checkpoint
from simdist_planner.config import (CONFIG_FACTORIES, PRETRAIN_PRESETS, SMALL_BACKBONES, CheckpointSelection,
                                    PretrainConfig, WorldModelConfig)
from simdist_planner.losses import TERMS, near_field_slices, world_model_loss
from simdist_planner.model import WorldModel
from simdist_planner.synthetic import synthetic_windows

STATE_FORMAT_VERSION = 1
# Settings a resumed run may change; everything else must equal the interrupted run's.
RESUMABLE_CHANGES = {"steps", "checkpoint_every", "keep_checkpoints", "log_every", "workers", "threads", "preload",
                     "time_limit_s"}
# Model settings a warm start (`init_from`) may change: they leave every weight's shape and role.
WARM_START_FREE = ("policy_sees_history",)
# Settings that add zero-initialised parameters: a warm start may switch them on (the model then
# computes what the earlier one did, and the new parameters start at their initial values).
WARM_START_ADDED = ("policy_proprio_skip", "policy_proprio_gain")


def lr_at(cfg: PretrainConfig, step: int) -> float:
    """Linear warm-up from 0 to the peak, then cosine decay to the end value (optax's schedule)."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * step / cfg.warmup_steps
    decay = max(cfg.decay_steps or cfg.steps, cfg.warmup_steps + 1)
    frac = min(step - cfg.warmup_steps, decay - cfg.warmup_steps) / (decay - cfg.warmup_steps)
    return cfg.end_learning_rate + (cfg.learning_rate - cfg.end_learning_rate) * 0.5 * (1 + math.cos(math.pi * frac))


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def _deep_merge(base: dict, changes: dict) -> dict:
    out = dict(base)
    for k, v in changes.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def model_config_for(cfg: PretrainConfig, layout=None) -> WorldModelConfig:
    """The preset's architecture with the dataset's dimensions and the run's overrides."""
    base = CONFIG_FACTORIES[cfg.model]()
    if layout is not None:
        changes = dict(proprio_dim=layout.proprio_dim, action_dim=layout.action_dim,
                       command_dim=layout.command_dim)
        if base.height_map is not None or layout.height_map_shape:
            if not layout.height_map_shape or base.height_map is None:
                raise ValueError(f"model {cfg.model!r} and the dataset disagree on the height map "
                                 f"(dataset: {layout.height_map_shape})")
            changes["height_map"] = base.height_map.__class__(
                **{**base.height_map.__dict__, "shape": tuple(layout.height_map_shape)})
        if base.image is not None or layout.cameras:
            if not layout.cameras or base.image is None:
                raise ValueError(f"model {cfg.model!r} and the dataset disagree on cameras "
                                 f"(dataset: {layout.cameras})")
            image = {**base.image.__dict__, "cameras": tuple(layout.cameras)}
            if base.image.backbone in SMALL_BACKBONES:  # encode at the rendered resolution
                image["height"], image["width"] = (int(s) for s in layout.image_shape)
            changes["image"] = base.image.__class__(**image)
        base = base.replace(**changes)
    if cfg.model_overrides:
        try:
            base = WorldModelConfig.from_dict(_deep_merge(base.to_dict(), cfg.model_overrides))
        except (ValueError, TypeError) as err:
            raise ValueError(f"model_overrides {cfg.model_overrides}: {err}") from err
    if base.loss.state > 0:  # the state head is sized by the task state the shards hold
        state_dim = base.proprio_dim if layout is None else layout.state_dim  # synthetic: a view of x
        if state_dim == 0:
            raise ValueError(
                f"model {cfg.model!r} trains the auxiliary state loss (loss.state "
                f"{base.loss.state}) but the dataset holds no task state: generate it with this "
                "version, or pass --model-overrides '{\"loss\": {\"state\": 0}}'")
        base = base.replace(state_dim=state_dim)
    return base


# ------------------------------------------------------------------------------------ data
class WindowSource(torch.utils.data.Dataset):
    """Item `step` = this rank's batch of windows for that step (indices seeded by the step)."""

    def __init__(self, cfg: PretrainConfig, rank: int, world_size: int):
        self.cfg, self.rank = cfg, rank
        self.windows = None
        self.cum_weights = None  # cumulative window weights when cfg.phase_weights is set
        if not cfg.synthetic:
            from simdist_planner.dataset import ShardedDataset, WindowDataset

            selection = self.selection(cfg)
            data = ShardedDataset(cfg.data, **selection, rank=rank, world_size=world_size, preload=cfg.preload)
            self.model_config = model_config_for(cfg, data.layout)
            self.windows = WindowDataset(data, self.model_config.history, self.model_config.horizon)
            self.obs_noise = data.obs_noise_std()
            if cfg.phase_weights:
                weights, inside = window_weights(self.windows, cfg.phase_weights)
                self.cum_weights = np.cumsum(weights)
                self.weighting = (f"{int(inside.sum())} of {len(weights)} windows in the phases "
                                  f"{cfg.phase_weights}, {weights[inside].sum() / weights.sum():.1%} of draws")
        else:
            self.model_config = model_config_for(cfg)
            self.obs_noise = {"proprio": np.full(self.model_config.proprio_dim, 0.01, np.float32),
                              "height_map": 0.01}

    @staticmethod
    def selection(cfg: PretrainConfig) -> dict:
        return dict(fraction=cfg.fraction, expert_only=cfg.expert_only,
                    max_steps=cfg.max_data_steps or None, selection_seed=cfg.selection_seed)

    def __len__(self) -> int:
        return self.cfg.steps

    def __getitem__(self, step: int) -> dict:
        b = self.cfg.batch_size
        if self.windows is None:
            return synthetic_windows(self.model_config, b, seed=_seed(self.cfg.seed, self.rank, step),
                                     system_seed=self.cfg.seed)
        picks = self.draw(np.random.default_rng(_seed(self.cfg.seed, self.rank, step, 0)), b)
        items = [self.windows[int(i)] for i in picks]
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0] if k != "obs"}
        batch.update({k: torch.stack([it["obs"][k] for it in items]) for k in items[0]["obs"]})
        return batch

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n window indices, uniform or by the phase weights."""
        if self.cum_weights is None:
            return rng.integers(0, len(self.windows), n)
        return np.searchsorted(self.cum_weights, rng.random(n) * self.cum_weights[-1], side="right")

    def proprio_noise(self) -> torch.Tensor:
        """Per-dimension noise std of the proprio vector (ShardedDataset.obs_noise_std)."""
        return torch.as_tensor(self.obs_noise["proprio"], dtype=torch.float32)


def window_weights(windows, phase_weights: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """(len(windows),) sampling weight of each window: the largest weight among the phases its
    step t lies in (dataset.window_phases), 1 outside them; and the (len(windows),) mask of the
    windows inside a weighted phase."""
    from simdist_planner.dataset import window_phases

    phases = window_phases(windows)
    unknown = set(phase_weights) - set(phases)
    if unknown:
        raise ValueError(f"phase_weights names {sorted(unknown)}, but task "
                         f"{str(windows.dataset.attrs.get('task', ''))!r} defines "
                         f"the phases {sorted(phases) or 'none'}")
    weights = np.zeros(len(windows))  # 0 = in no weighted phase
    empty = []
    for phase, weight in phase_weights.items():
        inside = phases[phase]
        weights[inside] = np.maximum(weights[inside], weight)
        if not inside.any():
            empty.append(phase)
    if empty:
        raise ValueError(f"no window of the selection lies in the phases {empty}: nothing to weight")
    inside = weights > 0
    return np.where(inside, weights, 1.0), inside


class AugmentedWindows(torch.utils.data.Dataset):
    """The loader's view of a WindowSource: item `step` = that step's batch with its observation
    augmentation, done in the loader workers (off the training loop's critical path) and seeded
    by the step like the batch itself."""

    def __init__(self, source: WindowSource):
        self.source = source
        self.proprio_noise = source.proprio_noise()
        self.hm_noise = float(source.obs_noise["height_map"])

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, step: int) -> dict:
        src = self.source
        batch = src[step]
        if src.cfg.augment:
            g = torch.Generator().manual_seed(_seed(src.cfg.seed, src.rank, step, 1))
            batch = augment(batch, src.cfg, self.proprio_noise, self.hm_noise, src.model_config, g)
        return batch


def fit_scaler(model: WorldModel, cfg: PretrainConfig, source: WindowSource) -> None:
    """Fit on the selection's first `scaler_rows` rows (whole episodes in selection order, a
    random permutation; identical on every rank), or on synthetic windows. Images are not read."""
    if source.windows is None:
        w = synthetic_windows(model.config, 64, seed=_seed(cfg.seed, 999), system_seed=cfg.seed)
        model.scaler.fit({k: w[k] for k in model.scaler.dims})
        return
    from simdist_planner.dataset import ShardedDataset

    data = ShardedDataset(cfg.data, **WindowSource.selection(cfg))
    columns = {"proprio": "proprio", "actions": "action", "rewards": "reward", "values": "value",
               "command": "command", "height_map": "height_map", "state": "state"}
    names = [columns[k] for k in model.scaler.dims]
    cols: dict[str, list] = {k: [] for k in model.scaler.dims}
    rows = 0
    for i in range(data.num_episodes):
        n = int(data.lengths[i])
        ep = data.read(i, 0, n, names)
        for k in cols:  # the last row carries no transition
            cols[k].append(ep[columns[k]][:n - 1] if k in ("actions", "rewards") else ep[columns[k]])
        rows += n
        if rows >= cfg.scaler_rows:
            break
    model.scaler.fit({k: np.concatenate(v) for k, v in cols.items()})


def augment(batch: dict, cfg: PretrainConfig, proprio_noise: torch.Tensor, hm_noise: float,
            model_config, generator: torch.Generator) -> dict:
    """Noise on the inputs o_{t-H..t} (targets stay clean, as in the official dataset)."""
    out = dict(batch)
    history = model_config.history
    n_in = history + 1
    p = batch["proprio"].clone()
    p[:, :n_in] += torch.randn(p[:, :n_in].shape, generator=generator) * proprio_noise
    out["proprio"] = p
    if "height_map" in batch and hm_noise > 0:
        hm = batch["height_map"].clone()
        hm[:, :n_in] += torch.randn(hm[:, :n_in].shape, generator=generator) * hm_noise
        out["height_map"] = hm
    if "images" in batch:
        cameras = model_config.image.cameras
        movable = torch.tensor([c not in cfg.fixed_cameras for c in cameras])
        out["images"] = _augment_images(batch["images"], cfg, history, generator, movable)
    return out


def _augment_images(images: torch.Tensor, cfg: PretrainConfig, history: int, g: torch.Generator,
                    movable: torch.Tensor) -> torch.Tensor:
    """Image augmentation per (window, camera); `movable` (n_cam,) bool: the cameras a shift may move.

    Brightness and contrast change only the current image o_t: the latent target sg(E(o_{t+i}))
    stays clean, which teaches E to ignore appearance. The random shift (a camera that moved) moves
    o_t AND the target frames o_{t+1..t+T} alike: shifting the input alone would make every
    position-dependent feature of E unpredictable, and the latent loss would then teach E to
    drop where objects are in the image. The history frames are left as they are (E reads only
    the latest image). Images keep their dtype: uint8 frames stay uint8 (what a camera gives), so
    the loader ships a quarter of the bytes and the model converts only the frames it reads.
    """
    x = images.clone()
    b, _, n_cam, _, h, w = x.shape
    top = 255.0 if x.dtype == torch.uint8 else 1.0
    cur = x[:, history].float()  # (B, n_cam, 3, h, w)
    bright = 1 + (torch.rand(b, n_cam, 1, 1, 1, generator=g) * 2 - 1) * cfg.image_brightness
    contrast = 1 + (torch.rand(b, n_cam, 1, 1, 1, generator=g) * 2 - 1) * cfg.image_contrast
    mean = cur.mean(dim=(2, 3, 4), keepdim=True)
    cur = (((cur - mean) * contrast + mean) * bright).clamp(0, top)
    x[:, history] = cur.round().to(x.dtype) if x.dtype == torch.uint8 else cur
    s = cfg.image_shift
    if s > 0:
        # A shift by (dy, dx) in [-s, s] with the border pixels repeated: the source rows / cols
        # of every output pixel, per (window, camera).
        moves = movable.repeat(b)  # (B * n_cam,), camera-minor like x[:, t]
        dy = torch.randint(-s, s + 1, (b * n_cam,), generator=g)
        dx = torch.randint(-s, s + 1, (b * n_cam,), generator=g)
        rows = (torch.arange(h) + dy[:, None]).clamp(0, h - 1)  # (B * n_cam, h)
        cols = (torch.arange(w) + dx[:, None]).clamp(0, w - 1)
        for i in torch.nonzero(moves).flatten().tolist():
            k, c = divmod(i, n_cam)
            frames = x[k, history:, c]  # (T + 1, 3, h, w)
            x[k, history:, c] = frames.index_select(2, rows[i]).index_select(3, cols[i])
    return x


# ------------------------------------------------------------------------------ train state
class WeightAverage:
    """Exponential moving average of a model's weights and float buffers (PretrainConfig.ema_decay).

    The usual remedy for a model that swings between checkpoints: the average of the last
    ~1 / (1 - decay) steps does not hinge on one of them. On the peg preset, whose runs end with
    base policies inserting 0 % to about 50 % of the time at equal losses, it changed nothing measured
    (docs/experiments/peg_wide.md, session 30).
    """

    def __init__(self, model: WorldModel, decay: float):
        self.decay = decay
        self.model = copy.deepcopy(model).requires_grad_(False).eval()

    @torch.no_grad()
    def update(self, model: WorldModel, step: int) -> None:
        """Fold in the weights after optimiser step `step` (0-based); early steps weigh more
        (the ramp), so the average does not start out as mostly the initial weights."""
        keep = min(self.decay, (1 + step) / (10 + step))
        for avg, new in zip(self.model.state_dict().values(), model.state_dict().values()):
            if avg.is_floating_point():
                avg.lerp_(new, 1.0 - keep)
            else:
                avg.copy_(new)


def _atomic_dir(final: pathlib.Path):
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    return tmp


def save_train_state(out: pathlib.Path, model: WorldModel, optimizer: torch.optim.Optimizer,
                     step: int, metrics: dict, ema: WeightAverage | None = None) -> None:
    final = out / "train_state"
    tmp = _atomic_dir(final)
    try:
        save_checkpoint(model, tmp / "model", metrics={"step": step, **metrics})
        if ema is not None:
            save_checkpoint(ema.model, tmp / "ema", metrics={"step": step, "ema_decay": ema.decay})
        index = {p: i for i, p in enumerate(model.parameters())}
        tensors = {}
        for p, state in optimizer.state.items():
            for key, value in state.items():
                tensors[f"{index[p]}.{key}"] = value.detach().cpu().contiguous().reshape(value.shape)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(json.dumps(
            {"format_version": STATE_FORMAT_VERSION, "step": step, "optimizer": type(optimizer).__name__}))
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_train_state(out: pathlib.Path, model: WorldModel, optimizer: torch.optim.Optimizer,
                     ema: WeightAverage | None = None) -> int:
    """Restore weights, Adam moments and the weight average in place; returns the step to continue from."""
    root = out / "train_state"
    state = json.loads((root / "state.json").read_text())
    if state.get("format_version") != STATE_FORMAT_VERSION or state.get("optimizer") != type(optimizer).__name__:
        raise ValueError(f"{root / 'state.json'}: train state {state} does not fit this trainer "
                         f"(format {STATE_FORMAT_VERSION}, {type(optimizer).__name__})")
    saved = load_checkpoint(root / "model", expect=model.config)
    model.load_state_dict(saved.state_dict())
    tensors = load_file(str(root / "optimizer.safetensors"))
    params = list(model.parameters())
    per_param: dict[int, dict] = {}
    for name, value in tensors.items():
        i, key = name.split(".", 1)
        if not 0 <= int(i) < len(params):
            raise ValueError(f"{root / 'optimizer.safetensors'}: state for parameter {i}, model has {len(params)}")
        per_param.setdefault(int(i), {})[key] = value
    for i, st in per_param.items():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st and st[key].shape != params[i].shape:
                raise ValueError(f"{root / 'optimizer.safetensors'}: {i}.{key} has shape "
                                 f"{tuple(st[key].shape)}, parameter has {tuple(params[i].shape)}")
    # the optimizer numbers only the parameters it trains (a frozen backbone is not among them)
    trained = {id(p): k for k, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    if any(id(params[i]) not in trained for i in per_param):
        raise ValueError(f"{root / 'optimizer.safetensors'}: state for parameters this run does not train")
    sd = optimizer.state_dict()
    sd["state"] = {trained[id(params[i])]: st for i, st in per_param.items()}
    optimizer.load_state_dict(sd)
    if ema is not None:
        if not (root / "ema").is_dir():
            raise ValueError(f"{root}: no ema/ weight average to resume (the run was saved without ema_decay)")
        ema.model.load_state_dict(load_checkpoint(root / "ema", expect=model.config).state_dict())
    return int(state["step"])


def _check_resume_config(out: pathlib.Path, cfg: PretrainConfig) -> None:
    saved = PretrainConfig.from_dict(json.loads((out / "pretrain.json").read_text()))
    a, b = saved.to_dict(), cfg.to_dict()
    diff = [f"{k}: run has {a[k]!r}, now {b[k]!r}" for k in a if a[k] != b[k] and k not in RESUMABLE_CHANGES]
    if diff:
        raise ValueError(f"{out}: cannot resume a run with different settings ({'; '.join(diff)}); "
                         "use another --out")


def weights_sha256(model: WorldModel) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------------ train
def _distributed(device: str) -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, 0
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))


def pretrain(cfg: PretrainConfig, out, device: str = "cpu", progress: bool = True) -> pathlib.Path:
    """Train (or resume) the run in `out`; returns the final checkpoint directory `out/model`."""
    out = pathlib.Path(out)
    rank, world, local_rank = _distributed(device)
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
    torch.set_num_threads(cfg.threads)
    source = WindowSource(cfg, rank, world)
    if rank == 0 and source.cum_weights is not None:
        print(f"pretrain: rank 0 draws {source.weighting}")
    torch.manual_seed(cfg.seed)
    model = WorldModel(source.model_config)
    fit_scaler(model, cfg, source)
    if cfg.init_from:  # warm start: an earlier run's weights and scaler, a fresh optimizer
        earlier = read_config(cfg.init_from)
        free = {k: getattr(earlier, k) for k in WARM_START_FREE}
        added = {k: False for k in WARM_START_ADDED if getattr(model.config, k) and not getattr(earlier, k)}
        loaded = load_checkpoint(cfg.init_from, expect=model.config.replace(**free, **added)).state_dict()
        new = set(model.state_dict()) - set(loaded)
        missing, unexpected = model.load_state_dict(loaded, strict=not added)
        if unexpected or set(missing) != new:
            raise ValueError(f"warm start from {cfg.init_from}: missing {missing}, unexpected {unexpected}")
    if cfg.checkpoint_selection is not None and rank == 0:  # a wrong task fails now, not after the run
        check_fits(cfg.checkpoint_selection, model)
    model.to(dev)
    resuming = (out / "train_state" / "state.json").is_file()
    if cfg.encoder_steps and not resuming:  # the stage's result lives on in the model's weights
        from simdist_planner.encoder_pretrain import pretrain_image_backbone

        encoder_writer = None
        if rank == 0:
            from torch.utils.tensorboard import SummaryWriter

            encoder_writer = SummaryWriter(str(out / "tb" / "encoder"))
        _, losses = pretrain_image_backbone(model, source, cfg, dev, rank, encoder_writer, progress)
        if encoder_writer is not None:
            encoder_writer.close()
            print(f"pretrain: encoder stage, {cfg.encoder_steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if cfg.freeze_image_backbone:
        model.encoder.images.backbone.requires_grad_(False)
    near = (near_field_slices(source.windows.dataset.layout, cfg.state_near_field, "state_near_field")
            if cfg.state_near_field else ())
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr_at(cfg, 0))

    ema = WeightAverage(model, cfg.ema_decay) if cfg.ema_decay > 0 else None
    kept = model if ema is None else ema.model  # what checkpoints and the final model hold
    start = 0
    if resuming:
        _check_resume_config(out, cfg)
        start = load_train_state(out, model, optimizer, ema)
    if world > 1:
        dist.barrier()  # every rank has read the old pretrain.json before rank 0 rewrites it
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "pretrain.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    if world > 1:
        dist.barrier()

    train_model = model
    if world > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if cfg.compile:
        train_model = torch.compile(train_model)
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and dev.type == "cuda")

    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out / "tb"), purge_step=start)
    loader = torch.utils.data.DataLoader(
        AugmentedWindows(source), batch_size=None, sampler=range(start, cfg.steps), num_workers=cfg.workers,
        persistent_workers=False, prefetch_factor=2 if cfg.workers else None)
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=start, disable=not progress or rank != 0, desc="pretrain",
               dynamic_ncols=True)
    sums = {k: 0.0 for k in ("total", *TERMS)}
    count, t_log, t_start = 0, time.perf_counter(), time.perf_counter()
    metrics: dict = {}
    step, done = start, start
    model.train()
    if cfg.freeze_image_backbone:
        model.encoder.images.backbone.eval()  # frozen: batch-norm statistics stay as they were too
    for step, batch in enumerate(loader, start=start):
        torch.manual_seed(_seed(cfg.seed, rank, step, 2))  # dropout of this step
        batch = {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
        lr = lr_at(cfg, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            terms = world_model_loss(train_model, batch, near_field=near)
        optimizer.zero_grad(set_to_none=True)
        terms.total.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        if ema is not None:
            ema.update(model, step)
        values = terms.as_floats()
        if not math.isfinite(values["total"]):
            raise FloatingPointError(f"pretrain: loss became {values['total']} at step {step}: {values}")
        for k, v in values.items():
            sums[k] += v
        count += 1
        done = step + 1
        bar.update(1)
        stop = done < cfg.steps and _out_of_time(cfg, t_start, world, dev)
        if done % cfg.log_every == 0 or done == cfg.steps or stop:
            now = time.perf_counter()
            metrics = {f"loss/{k}": v / count for k, v in sums.items()}
            metrics["lr"] = lr
            metrics["windows_per_s"] = count * cfg.batch_size * world / (now - t_log)
            if writer is not None:
                for k, v in metrics.items():
                    writer.add_scalar(k, v, done)
            bar.set_postfix(loss=f"{metrics['loss/total']:.4f}", lr=f"{lr:.2e}")
            sums = {k: 0.0 for k in sums}
            count, t_log = 0, now
        if done % cfg.checkpoint_every == 0 or done == cfg.steps or stop:
            if rank == 0:
                save_train_state(out, model, optimizer, done, metrics, ema)
                save_checkpoint(kept, out / "checkpoints" / f"step-{done:07d}", metrics={"step": done, **metrics})
                _prune(out / "checkpoints", cfg.keep_checkpoints)
            if world > 1:
                dist.barrier()
        if stop:
            break
    bar.close()

    digest = weights_sha256(model)
    digests = _gather_digests(digest, world, dev)
    if len(set(digests)) != 1:
        raise RuntimeError(f"pretrain: ranks ended with different weights: {digests}")
    if rank == 0:
        # rank_weights_sha256 hashes the trained weights (train_state/model), not an average
        final = {"step": done, **metrics, "world_size": world, "rank_weights_sha256": digests,
                 "seconds_this_run": time.perf_counter() - t_start, "steps_this_run": done - start,
                 "stopped_at_time_limit": done < cfg.steps, "model_config": cfg.model,
                 "ema_decay": cfg.ema_decay}
        save_checkpoint(kept, out / "model", metrics=final)
        if writer is not None:
            writer.close()
    if world > 1:
        dist.barrier()
    if rank == 0 and cfg.checkpoint_selection is not None and done == cfg.steps:
        select_checkpoint(out, cfg.checkpoint_selection, device)
    return out / "model"


def _out_of_time(cfg: PretrainConfig, t_start: float, world: int, dev: torch.device) -> bool:
    """Whether this run has used its wall-clock budget; rank 0's clock decides for every rank."""
    if cfg.time_limit_s <= 0:
        return False
    late = time.perf_counter() - t_start >= cfg.time_limit_s
    if world == 1:
        return late
    flag = torch.tensor([float(late)], device=dev)
    dist.broadcast(flag, 0)
    return bool(flag.item())


def _gather_digests(digest: str, world: int, dev: torch.device) -> list[str]:
    if world == 1:
        return [digest]
    local = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8, device=dev)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    return [bytes(t.cpu().tolist()).hex() for t in gathered]


def _prune(folder: pathlib.Path, keep: int) -> None:
    ckpts = sorted(p for p in folder.glob("step-*") if p.is_dir())
    for p in ckpts[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------------------------ CLI
def parse_args(argv=None) -> tuple[PretrainConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="simdist-pretrain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRETRAIN_PRESETS), help="small CPU defaults per robot")
    parser.add_argument("--out", required=True, help="run directory (resumed when it holds a train state)")
    parser.add_argument("--data", nargs="*", default=None, help="shard files or directories")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-progress", action="store_true")
    fields = PretrainConfig.__dataclass_fields__
    for name in fields:
        if name in ("data", "model_overrides", "phase_weights", "encoder_near_field", "state_near_field",
                    "checkpoint_selection"):
            continue
        flag = "--" + name.replace("_", "-")
        ftype = fields[name].type
        if ftype in ("bool", bool):
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=None,
                                metavar="true|false")
        elif str(ftype) == "tuple[str, ...]":
            parser.add_argument(flag, nargs="*", default=None)
        else:
            conv = {"int": int, "float": float, "str": str}[str(ftype)]
            parser.add_argument(flag, type=conv, default=None)
    parser.add_argument("--model-overrides", type=json.loads, default=None,
                        help='JSON merged into the model config, e.g. \'{"head_kind": "mlp"}\'')
    parser.add_argument("--phase-weights", type=json.loads, default=None,
                        help='JSON {phase: weight} of the task\'s step phases, e.g. \'{"closing": 10}\'')
    parser.add_argument("--encoder-near-field", type=json.loads, default=None,
                        help='JSON {state term: scale} for the encoder stage, e.g. \'{"bottom_to_hole": 0.005}\'')
    parser.add_argument("--state-near-field", type=json.loads, default=None,
                        help="JSON {state term: scale} for the state loss on z, as --encoder-near-field")
    parser.add_argument("--checkpoint-selection", type=json.loads, default=argparse.SUPPRESS,
                        help='JSON CheckpointSelection fields over the preset\'s, e.g. \'{"task": "peg", '
                             '"region": "wide", "workers": 2}\'; null = the last step is the model')
    args = parser.parse_args(argv)
    values = dict(PRETRAIN_PRESETS[args.preset]) if args.preset else {}
    for name in fields:
        v = getattr(args, name, None)
        if v is not None and name != "checkpoint_selection":
            values[name] = tuple(v) if isinstance(v, list) else v
    try:
        if "checkpoint_selection" in vars(args):  # null clears the preset's; an object amends it
            given, base = args.checkpoint_selection, values.get("checkpoint_selection")
            values["checkpoint_selection"] = None if given is None else (
                dataclasses.replace(base, **given) if base is not None else CheckpointSelection(**given))
        return PretrainConfig(**values), args
    except (TypeError, ValueError) as err:
        parser.error(str(err))


def main(argv=None) -> None:
    cfg, args = parse_args(argv)
    final = pretrain(cfg, args.out, device=args.device, progress=not args.no_progress)
    if int(os.environ.get("RANK", "0")) == 0:
        metrics = json.loads((final / "metrics.json").read_text())
        print(f"pretrain: wrote {final} (step {metrics['step']}, loss {metrics.get('loss/total', float('nan')):.4f}, "
              f"{metrics['seconds_this_run']:.0f} s this run)")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
