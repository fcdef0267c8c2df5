"""Train state on disk: weights, Adam moments and the step, for an exact resume."""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import uuid

import torch
from safetensors.torch import load_file, save_file

from simdist_planner.model.checkpoint import (
    load_checkpoint,
    replace_dir,
    save_checkpoint,
)
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.config import PretrainConfig

STATE_FORMAT_VERSION = 1


# Settings (flat flag names, PretrainConfig.to_flat) a resumed run may change; everything else
# must equal the interrupted run's.
RESUMABLE_CHANGES = {
    "steps",
    "checkpoint_every",
    "keep_checkpoints",
    "log_every",
    "workers",
    "threads",
    "preload",
    "time_limit_s",
}


def _atomic_dir(final: pathlib.Path):
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    return tmp


def save_train_state(
    out: pathlib.Path,
    model: WorldModel,
    optimizer: torch.optim.Optimizer,
    step: int,
    metrics: dict,
) -> None:
    final = out / "train_state"
    tmp = _atomic_dir(final)
    try:
        save_checkpoint(model, tmp / "model", metrics={"step": step, **metrics})
        index: dict[torch.Tensor, int] = {p: i for i, p in enumerate(model.parameters())}
        tensors = {}
        for p, state in optimizer.state.items():
            for key, value in state.items():
                tensors[f"{index[p]}.{key}"] = (
                    value.detach().cpu().contiguous().reshape(value.shape)
                )
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(
            json.dumps(
                {
                    "format_version": STATE_FORMAT_VERSION,
                    "step": step,
                    "optimizer": type(optimizer).__name__,
                }
            )
        )
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_train_state(
    out: pathlib.Path,
    model: WorldModel,
    optimizer: torch.optim.Optimizer,
) -> int:
    """Restore weights and Adam moments in place; returns the step to continue from."""
    root = out / "train_state"
    state = json.loads((root / "state.json").read_text())
    if (
        state.get("format_version") != STATE_FORMAT_VERSION
        or state.get("optimizer") != type(optimizer).__name__
    ):
        raise ValueError(
            f"{root / 'state.json'}: train state {state} does not fit this trainer "
            f"(format {STATE_FORMAT_VERSION}, {type(optimizer).__name__})"
        )
    saved = load_checkpoint(root / "model", expect=model.config)
    model.load_state_dict(saved.state_dict())
    tensors = load_file(str(root / "optimizer.safetensors"))
    params = list(model.parameters())
    per_param: dict[int, dict] = {}
    for name, value in tensors.items():
        number, key = name.split(".", 1)
        if not 0 <= int(number) < len(params):
            raise ValueError(
                f"{root / 'optimizer.safetensors'}: state for parameter {number}, "
                f"model has {len(params)}"
            )
        per_param.setdefault(int(number), {})[key] = value
    for i, st in per_param.items():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st and st[key].shape != params[i].shape:
                raise ValueError(
                    f"{root / 'optimizer.safetensors'}: {i}.{key} has shape "
                    f"{tuple(st[key].shape)}, parameter has {tuple(params[i].shape)}"
                )
    # the optimizer numbers only the parameters it trains (a frozen backbone is not among them)
    trained = {
        id(p): k for k, p in enumerate(p for g in optimizer.param_groups for p in g["params"])
    }
    if any(id(params[i]) not in trained for i in per_param):
        raise ValueError(
            f"{root / 'optimizer.safetensors'}: state for parameters this run does not train"
        )
    sd = optimizer.state_dict()
    sd["state"] = {trained[id(params[i])]: st for i, st in per_param.items()}
    optimizer.load_state_dict(sd)
    return int(state["step"])


def check_resume_config(out: pathlib.Path, cfg: PretrainConfig) -> None:
    """Refuse to resume the run in `out` with settings other than its pretrain.json's (that of an
    earlier version, in the flat form, is read too), except RESUMABLE_CHANGES."""
    saved = PretrainConfig.from_dict(json.loads((out / "pretrain.json").read_text()))
    a, b = saved.to_flat(), cfg.to_flat()
    diff = [
        f"{k}: run has {a[k]!r}, now {b[k]!r}"
        for k in a
        if a[k] != b[k] and k not in RESUMABLE_CHANGES
    ]
    if diff:
        raise ValueError(
            f"{out}: cannot resume a run with different settings ({'; '.join(diff)}); "
            "use another --out"
        )


def weights_sha256(model: WorldModel) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
