"""`simforcing-train`: autoencoder (built-in backbone) -> sim teacher -> SimForcing student.

    simforcing-train --data pairs.h5 --out runs/sf --stage all --variant full
    torchrun --nproc_per_node 2 -m sim_video_world_model.train --data pairs.h5 --out runs/sf ...

Every stage writes a full model checkpoint directory (see checkpoint.py) under --out:
`autoencoder/`, `teacher/`, `student_<variant>/` (`student_sft_teacher/` for the real-only baseline
started from the sim teacher); with --resume an interrupted stage continues
from its last save and a finished stage is skipped. DDP: NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import os
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from sim_video_world_model.backbones import build_backbone
from sim_video_world_model.backbones.base import VideoAutoencoder, VideoDenoiser
from sim_video_world_model.backbones.tiny import TinyVideoAutoencoder
from sim_video_world_model.checkpoint import (
    ModelBundle,
    load_bundle,
    load_optimizer,
    save_bundle,
    save_optimizer,
)
from sim_video_world_model.config import (
    BackboneConfig,
    ObjectiveConfig,
    TrainConfig,
    Variant,
    from_dict,
    to_dict,
)
from sim_video_world_model.objective import StudentObjective, TeacherObjective
from sim_video_world_model.paired_data import PairedVideoDataset, PairedWindows
from sim_video_world_model.scheduler import warmup_cosine

log = logging.getLogger("simforcing.train")


@dataclasses.dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> Dist:
    """torchrun sets WORLD_SIZE / RANK / LOCAL_RANK; one process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def resolve_device(device: str, dist: Dist) -> torch.device:
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available")
        return torch.device(
            "cuda", dist.local_rank if dist.world > 1 else torch.device(device).index or 0
        )
    return torch.device(device)


def fit(
    name: str,
    module: nn.Module,
    loss_fn: Callable,
    data: PairedVideoDataset | ScarceRealDataset | LatentDataset,
    tcfg: TrainConfig,
    out: str,
    dist: Dist,
    resume: bool,
    save: Callable[[str], None],
    writer=None,
) -> None:
    """The shared loop: AdamW, warm-up + cosine, grad clip, bf16 on CUDA, DDP, tqdm, TB, resume.

    `loss_fn(model, batch, generator) -> (loss, metrics)`; `save(path)` writes the model checkpoint.
    Every `log_every` steps the means of the metrics (each loss term separately) since the last log
    go to TensorBoard, to the Python log and as one JSON line to `<out>/losses.jsonl` (see
    `LOSS_LOG`).
    """

    device = next(module.parameters()).device
    cuda = device.type == "cuda"
    bf16 = cuda if tcfg.bf16 is None else tcfg.bf16
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tcfg.lr, betas=tcfg.betas, weight_decay=tcfg.weight_decay)
    start = 0
    if resume and os.path.isfile(os.path.join(out, "train_state.json")):
        meta = load_optimizer(out, opt)
        start = int(meta["step"])
        log.info("%s: resuming at step %d", name, start)
    model = module
    if dist.world > 1:
        model = nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if cuda else None
        )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: warmup_cosine(s, tcfg.steps, tcfg.warmup_frac),
        last_epoch=start - 1 if start else -1,
    )
    sampler: DistributedSampler | None = (
        DistributedSampler(data, dist.world, dist.rank, seed=tcfg.seed) if dist.world > 1 else None
    )
    loader = DataLoader(
        data,
        batch_size=tcfg.batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=True,
        num_workers=tcfg.num_workers,
        generator=torch.Generator().manual_seed(tcfg.seed + start),
    )
    if len(loader) == 0:
        raise ValueError(
            f"{name}: {len(data)} windows are fewer than one batch of {tcfg.batch_size} per rank"
        )
    log_path = os.path.join(out, LOSS_LOG)
    if dist.main:
        _trim_loss_log(log_path, start)
    sums: dict[str, float] = {}
    count = 0
    gen = torch.Generator(device="cpu").manual_seed(tcfg.seed * 1000 + dist.rank + start)
    step, epoch = start, 0
    bar = tqdm(
        total=tcfg.steps, initial=start, desc=name, disable=not dist.main, dynamic_ncols=True
    )
    model.train()
    while step < tcfg.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss, metrics = loss_fn(model, batch, gen)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"{name}: non-finite loss {float(loss)} at step {step}; metrics {metrics}"
                )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip)
            opt.step()
            sched.step()
            step += 1
            bar.update(1)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
            if dist.main and (step % tcfg.log_every == 0 or step == tcfg.steps):
                means = {k: v / count for k, v in sums.items()}
                record = {
                    "step": step,
                    **means,
                    "lr": sched.get_last_lr()[0],
                    "grad_norm": float(grad_norm),
                }
                bar.set_postfix(loss=f"{means['loss']:.4f}")
                log.info(
                    "%s step %d: %s",
                    name,
                    step,
                    " ".join(f"{k} {v:.4g}" for k, v in record.items() if k != "step"),
                )
                with open(log_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
                if writer is not None:
                    for k, v in record.items():
                        if k != "step":
                            writer.add_scalar(f"{name}/{k}", v, step)
            if step % tcfg.log_every == 0 or step == tcfg.steps:
                sums, count = {}, 0
            if dist.main and (step % tcfg.save_every == 0 and step < tcfg.steps):
                save(out)
                save_optimizer(out, opt, step)
            if step >= tcfg.steps:
                break
        epoch += 1
    bar.close()
    if dist.main:
        save(out)
        save_optimizer(out, opt, step, {"complete": True})


LOSS_LOG = "losses.jsonl"  # per stage directory: {"step", <metric means>, "lr", "grad_norm"}


def _trim_loss_log(path: str, keep_until: int) -> None:
    """A fresh stage starts an empty loss log; a resumed one keeps its records up to its step."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    kept = []
    if keep_until > 0 and os.path.isfile(path):
        with open(path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= keep_until]
    with open(path, "w") as f:
        f.writelines(kept)


def stage_done(path: str) -> bool:
    try:
        with open(os.path.join(path, "train_state.json")) as f:
            return bool(json.load(f).get("complete"))
    except FileNotFoundError:
        return False


def _set_checkpointing(denoiser: VideoDenoiser, tcfg: TrainConfig, device: torch.device) -> None:
    enabled = device.type == "cuda" if tcfg.grad_checkpointing is None else tcfg.grad_checkpointing
    denoiser.set_gradient_checkpointing(enabled)


def train_autoencoder(
    autoencoder: VideoAutoencoder,
    data: PairedVideoDataset | ScarceRealDataset,
    tcfg: TrainConfig,
    out: str,
    dist: Dist,
    resume: bool,
    bundle_info: dict,
    backbone: BackboneConfig,
    writer=None,
) -> None:
    """Reconstruction (MSE) on both streams, then fit the per-channel latent normalisation."""
    if not isinstance(autoencoder, TinyVideoAutoencoder):
        raise ValueError(
            "only the built-in autoencoder is trained here; Wan's VAE is pretrained and frozen"
        )

    class _AE(nn.Module):  # DDP wants a forward
        def __init__(self, ae):
            super().__init__()
            self.ae = ae

        def forward(self, video):
            return self.ae.reconstruct(video)

    wrapper = _AE(autoencoder)

    tf = autoencoder.temporal_factor

    def loss_fn(model, batch, gen):
        # Random (1 + tf)-frame crops: the first-frame and the group path at a fraction of the cost.
        video = torch.cat([batch["sim"], batch["real"]])
        start = int(torch.randint(0, video.shape[2] - tf, (1,), generator=gen))
        video = video[:, :, start : start + 1 + tf]
        loss = nn.functional.mse_loss(model(video), video)
        return loss, {"loss": float(loss.detach())}

    def save(path):
        sample = torch.stack(
            [data[i]["real"] for i in range(min(len(data), 32))]
            + [data[i]["sim"] for i in range(min(len(data), 32))]
        ).to(next(autoencoder.parameters()).device)
        autoencoder.fit_normalization(sample)
        save_bundle(
            path,
            ModelBundle(
                autoencoder,
                _placeholder_denoiser(backbone),
                backbone,
                dict(bundle_info, stage="autoencoder"),
            ),
        )

    fit("autoencoder", wrapper, loss_fn, data, tcfg, out, dist, resume, save, writer)


def _placeholder_denoiser(backbone: BackboneConfig) -> VideoDenoiser:
    return build_backbone(backbone)[1]


class ScarceRealDataset(torch.utils.data.Dataset):
    """Every window's sim stream, each paired in turn with one of the few real windows: the
    autoencoder of the scarce-real protocol sees all the sim data and only the real windows the
    students see (`RunConfig.real_windows`)."""

    def __init__(self, data: PairedVideoDataset, real: PairedVideoDataset):
        self.data, self.real = data, real

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"sim": self.data[i]["sim"], "real": self.real[i % len(self.real)]["real"]}


def student_dir(variant: Variant, sft_init: str = "base") -> str:
    """A student's directory name under the run: `student_<variant>`, and `student_sft_teacher`
    for the real-only baseline started from the sim teacher."""
    if variant is Variant.SFT and sft_init == "teacher":
        return "student_sft_teacher"
    return f"student_{variant.value}"


class LatentDataset(torch.utils.data.Dataset):
    """Every window's latents, encoded ONCE by the frozen autoencoder (it never trains after its
    own stage), so teacher and student steps cost only the denoiser."""

    def __init__(
        self, autoencoder: VideoAutoencoder, data: PairedVideoDataset, batch_size: int = 8
    ):
        device = next(autoencoder.parameters()).device
        parts: dict[str, list[torch.Tensor]] = {"z_sim": [], "z_real": [], "actions": []}
        with torch.no_grad():
            for start in range(0, len(data), batch_size):
                items = [data[i] for i in range(start, min(len(data), start + batch_size))]
                for key, stream in (("z_sim", "sim"), ("z_real", "real")):
                    video = torch.stack([it[stream] for it in items]).to(device)
                    parts[key].append(autoencoder.encode(video).float().cpu())
                parts["actions"].append(torch.stack([it["actions"] for it in items]))
        self.tensors = {k: torch.cat(v) for k, v in parts.items()}

    def __len__(self) -> int:
        return self.tensors["actions"].shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}


def train_teacher(
    bundle: ModelBundle,
    data: LatentDataset,
    ocfg: ObjectiveConfig,
    tcfg: TrainConfig,
    out: str,
    dist: Dist,
    resume: bool,
    writer=None,
) -> None:
    objective = TeacherObjective(ocfg)

    def loss_fn(model, batch, gen):
        return objective(model, batch["z_sim"], batch["actions"], gen)

    _set_checkpointing(bundle.denoiser, tcfg, next(bundle.denoiser.parameters()).device)

    def save(path):
        save_bundle(path, dataclasses.replace(bundle, info=dict(bundle.info, stage="teacher")))

    fit("teacher", bundle.denoiser, loss_fn, data, tcfg, out, dist, resume, save, writer)


def make_student(teacher: VideoDenoiser, variant: Variant) -> VideoDenoiser:
    """The student starts as an exact copy of the teacher (+ zero-initialised projections for
    'full')."""
    student = copy.deepcopy(teacher)
    student.requires_grad_(True)
    if variant.sim_conditioning:
        student.add_sim_conditioning()
    return student


def train_student(
    teacher_bundle: ModelBundle,
    data: LatentDataset,
    ocfg: ObjectiveConfig,
    tcfg: TrainConfig,
    out: str,
    dist: Dist,
    resume: bool,
    writer=None,
    init: VideoDenoiser | None = None,
) -> None:
    """`init` (default: the teacher) is the denoiser the student starts from; `out`'s directory
    name names the stage in the logs."""
    teacher = teacher_bundle.denoiser
    teacher.requires_grad_(False).eval()
    student = make_student(teacher if init is None else init, ocfg.variant)
    if resume and os.path.isfile(os.path.join(out, "train_state.json")):
        student.load_state_dict(load_bundle(out, "cpu").denoiser.state_dict())
    objective = StudentObjective(ocfg)
    ae = teacher_bundle.autoencoder

    def loss_fn(model, batch, gen):
        return objective(
            model,
            teacher if ocfg.variant.motion else None,
            batch["z_real"],
            batch["z_sim"],
            batch["actions"],
            gen,
        )

    _set_checkpointing(student, tcfg, next(student.parameters()).device)
    info = dict(
        teacher_bundle.info,
        stage="student",
        variant=ocfg.variant.value,
        init="teacher" if init is None else "base",
    )
    save = lambda path: save_bundle(path, ModelBundle(ae, student, teacher_bundle.backbone, info))  # noqa: E731
    fit(
        os.path.basename(os.path.normpath(out)),
        student,
        loss_fn,
        data,
        tcfg,
        out,
        dist,
        resume,
        save,
        writer,
    )


@dataclasses.dataclass
class RunConfig:
    """Everything `simforcing-train` needs; `--config run.json` overrides these defaults."""

    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    autoencoder_train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(steps=1500, lr=1e-3)
    )
    teacher_train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(steps=2000, lr=5e-4)
    )
    student_train: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(steps=1000, lr=2e-4)
    )
    # How many of the training file's windows (the first ones) keep their real stream; None: all.
    # The teacher trains on every window's sim stream; the autoencoder's real half, the students
    # and the real-only baselines see only these (the scarce-real protocol: sim data outnumbers
    # real data, as in the paper).
    real_windows: int | None = None

    @classmethod
    def from_json(cls, data: dict) -> "RunConfig":
        data = dict(data)
        real_windows = data.pop("real_windows", None)
        kinds = {
            "backbone": BackboneConfig,
            "objective": ObjectiveConfig,
            "autoencoder_train": TrainConfig,
            "teacher_train": TrainConfig,
            "student_train": TrainConfig,
        }
        unknown = set(data) - set(kinds)
        if unknown:
            raise ValueError(
                f"run config: unknown sections {sorted(unknown)}; expected {sorted(kinds)}"
            )
        return cls(
            real_windows=real_windows, **{k: from_dict(kinds[k], v) for k, v in data.items()}
        )


TRAIN_EPISODES = "train_episodes.json"  # <run>/: the training file's episode seeds


def record_train_episodes(out: str, windows: PairedWindows, data_path: str) -> None:
    """Write the training file's episode seeds to `<out>/train_episodes.json`, which evaluation
    checks every scored file against. A run that already trained on other episodes is refused:
    its stages would mix two training sets."""
    seeds = sorted(set(windows.episodes.tolist()))
    path = os.path.join(out, TRAIN_EPISODES)
    if os.path.isfile(path):
        recorded = train_episodes(out)
        if recorded != seeds:
            raise ValueError(
                f"{out} was trained on other episodes than {data_path} holds "
                f"({len(recorded)} recorded, {len(seeds)} in the file): a new run needs a new --out"
            )
        return
    with open(path + ".tmp", "w") as f:
        json.dump({"data": os.path.abspath(data_path), "episodes": seeds}, f)
    os.replace(path + ".tmp", path)


def train_episodes(run_dir: str) -> list[int]:
    """The episode seeds `run_dir` was trained on (`record_train_episodes`)."""
    path = os.path.join(run_dir, TRAIN_EPISODES)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: the run's training episodes are unknown, so no file can be "
            "checked against them (train the run again with this version)"
        )
    with open(path) as f:
        return [int(s) for s in json.load(f)["episodes"]]


def run(
    cfg: RunConfig,
    data_path: str,
    out: str,
    stages: list[str],
    variants: list[Variant],
    resume: bool,
    sft_inits: tuple[str, ...] | None = None,
) -> None:
    """`sft_inits`: the starts of the real-only SFT baseline when `variants` holds it, one student
    each ("base", "teacher"; default: the objective's `sft_init`)."""
    dist = init_distributed(cfg.teacher_train.device)
    device = resolve_device(cfg.teacher_train.device, dist)
    torch.manual_seed(cfg.teacher_train.seed)
    windows = PairedWindows.load(data_path)
    if windows.actions.shape[2] != cfg.backbone.action_dim:
        raise ValueError(
            f"{data_path} has {windows.actions.shape[2]}-D actions, "
            f"backbone expects {cfg.backbone.action_dim}"
        )
    data = PairedVideoDataset(windows)
    real_data = data
    if cfg.real_windows is not None:
        if not 0 < cfg.real_windows <= len(windows):
            raise ValueError(
                f"real_windows {cfg.real_windows}: {data_path} has {len(windows)} windows"
            )
        real_data = PairedVideoDataset(windows.subset(slice(0, cfg.real_windows)))
    info = {
        "num_frames": windows.num_frames,
        "real_windows": len(real_data),
        "sim_windows": len(data),
        "image_size": list(windows.sim.shape[2:4]),
        "action_low": windows.action_low.tolist(),
        "action_high": windows.action_high.tolist(),
    }
    writer = None
    if dist.main:
        os.makedirs(out, exist_ok=True)
        record_train_episodes(out, windows, data_path)
        writer = SummaryWriter(os.path.join(out, "tensorboard"))
        with open(os.path.join(out, "run_config.json"), "w") as f:
            json.dump(to_dict(cfg), f, indent=2)
    try:
        ae_dir, teacher_dir = os.path.join(out, "autoencoder"), os.path.join(out, "teacher")
        if (
            "autoencoder" in stages
            and cfg.backbone.kind == "tiny"
            and not (resume and stage_done(ae_dir))
        ):
            autoencoder, _ = build_backbone(cfg.backbone)
            if resume and os.path.isfile(os.path.join(ae_dir, "train_state.json")):
                autoencoder = load_bundle(ae_dir).autoencoder.requires_grad_(True)
            train_autoencoder(
                autoencoder.to(device),
                data if real_data is data else ScarceRealDataset(data, real_data),
                cfg.autoencoder_train,
                ae_dir,
                dist,
                resume,
                info,
                cfg.backbone,
                writer,
            )
        _barrier(dist)
        if "teacher" in stages and not (resume and stage_done(teacher_dir)):
            if cfg.backbone.kind == "tiny":
                base = load_bundle(ae_dir, device)
                bundle = ModelBundle(
                    base.autoencoder, build_backbone(cfg.backbone)[1].to(device), cfg.backbone, info
                )
            else:
                ae, den = build_backbone(cfg.backbone)
                bundle = ModelBundle(ae.to(device), den.to(device), cfg.backbone, info)
            if resume and os.path.isfile(os.path.join(teacher_dir, "train_state.json")):
                bundle.denoiser.load_state_dict(load_bundle(teacher_dir).denoiser.state_dict())
            latents = LatentDataset(bundle.autoencoder, data)
            train_teacher(
                bundle, latents, cfg.objective, cfg.teacher_train, teacher_dir, dist, resume, writer
            )
        _barrier(dist)
        if "student" in stages:
            teacher = load_bundle(teacher_dir, device)
            latents = LatentDataset(teacher.autoencoder, real_data)
            runs = [
                (variant, init)
                for variant in variants
                for init in (
                    (sft_inits or (cfg.objective.sft_init,))
                    if variant is Variant.SFT
                    else (cfg.objective.sft_init,)
                )
            ]
            for variant, init in runs:
                sdir = os.path.join(out, student_dir(variant, init))
                if resume and stage_done(sdir):
                    continue
                ocfg = dataclasses.replace(cfg.objective, variant=variant, sft_init=init)
                start_from = (
                    build_backbone(cfg.backbone)[1].to(device)
                    if variant is Variant.SFT and init == "base"
                    else None
                )
                train_student(
                    teacher,
                    latents,
                    ocfg,
                    cfg.student_train,
                    sdir,
                    dist,
                    resume,
                    writer,
                    init=start_from,
                )
                _barrier(dist)
    finally:
        if writer is not None:
            writer.close()


def _barrier(dist: Dist) -> None:
    if dist.world > 1:
        torch.distributed.barrier()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--data", required=True, help="paired-window HDF5 file (paired_data.PairedWindows)"
    )
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--stage", choices=["all", "autoencoder", "teacher", "student"], default="all")
    p.add_argument(
        "--variant",
        action="append",
        choices=[v.value for v in Variant],
        help="student variant(s) to train (repeatable; default: full)",
    )
    p.add_argument(
        "--sft-init",
        action="append",
        choices=["base", "teacher"],
        help="start(s) of the real-only SFT baseline, one student each (repeatable; default: "
        "the config's objective.sft_init); 'teacher' trains student_sft_teacher/",
    )
    p.add_argument(
        "--real-windows",
        type=int,
        help="keep the real stream of the first N windows only (the scarce-real protocol)",
    )
    p.add_argument("--config", help="JSON file with RunConfig sections overriding the defaults")
    p.add_argument("--device", help="cpu | cuda | cuda:N (all stages)")
    p.add_argument(
        "--steps", type=int, nargs=3, metavar=("AE", "TEACHER", "STUDENT"), help="steps per stage"
    )
    p.add_argument("--batch-size", type=int)
    p.add_argument("--backbone", choices=["tiny", "wan"])
    p.add_argument("--wan-dir", help="local Wan2.2-TI2V-5B diffusers folder (backbone wan)")
    p.add_argument(
        "--resume", action="store_true", help="continue interrupted stages, skip finished ones"
    )
    p.add_argument(
        "--threads", type=int, help="torch CPU threads (1 is fastest on a busy shared CPU)"
    )
    return p


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = RunConfig()
    if args.config:
        with open(args.config) as f:
            cfg = RunConfig.from_json(json.load(f))
    if args.backbone:
        cfg.backbone.kind = args.backbone
    if args.wan_dir:
        cfg.backbone.wan.model_dir = args.wan_dir
    trains = (cfg.autoencoder_train, cfg.teacher_train, cfg.student_train)
    for i, t in enumerate(trains):
        if args.device:
            t.device = args.device
        if args.batch_size:
            t.batch_size = args.batch_size
        if args.steps:
            t.steps = args.steps[i]
    if args.real_windows is not None:
        cfg.real_windows = args.real_windows
    stages = ["autoencoder", "teacher", "student"] if args.stage == "all" else [args.stage]
    variants = [Variant(v) for v in (args.variant or ["full"])]
    sft_inits = tuple(args.sft_init) if args.sft_init else None
    run(cfg, args.data, args.out, stages, variants, args.resume, sft_inits)


if __name__ == "__main__":
    main()
