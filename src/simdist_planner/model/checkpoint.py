"""World-model checkpoints: a directory written atomically, validated on load, never unpickled.

    <dir>/model.safetensors   every parameter and persistent buffer except the scaler
    <dir>/config.json         {"format_version", "config": WorldModelConfig, "sha256": {file: hash}}
    <dir>/scaler.json         the fitted scaler
    <dir>/metrics.json        free-form training / validation figures

The directory is written under a temporary name, fsynced and swapped into place in one atomic
step (`replace_dir`), so a reader, and a run resumed after a kill at any point, finds either the
complete previous checkpoint or the complete new one, never a half-written one or none. Loading
checks the format version, the config, every tensor name and shape, and the SHA-256 of the
weights and scaler, and names the file and the problem on failure.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import pathlib
import shutil
import sys
import uuid

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from simdist_planner.model.config import WorldModelConfig
from simdist_planner.model.world_model import WorldModel, unwrap

CHECKPOINT_FORMAT_VERSION = 1
WEIGHTS, CONFIG, SCALER, METRICS = "model.safetensors", "config.json", "scaler.json", "metrics.json"


class CheckpointError(ValueError):
    """A checkpoint directory is missing, corrupt or does not match what the caller expects."""


def weight_tensors(model: WorldModel) -> dict[str, torch.Tensor]:
    """The tensors stored in model.safetensors (the scaler lives in scaler.json)."""
    return {
        k: v.detach().cpu().contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("scaler.")
    }


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_json(path: pathlib.Path, data) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


# Names of the points inside `replace_dir`, in order; `_at_step(name, final)` is called at each one.
# The kill tests replace `_at_step` with a function that SIGKILLs the process at one of them.
REPLACE_STEPS_EXCHANGE = ("written", "synced", "exchanged", "parent_synced", "removed")
REPLACE_STEPS_RENAMES = ("written", "synced", "old_away", "new_in", "parent_synced", "removed")


def _at_step(name: str, final: pathlib.Path) -> None:
    """A point in `replace_dir` of `final` (see REPLACE_STEPS_*); nothing happens here."""


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _load_renameat2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _load_renameat2()


def exchange_paths(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Swap the directory entries `a` and `b` in one atomic step (Linux renameat2
    RENAME_EXCHANGE). False where the C library, kernel or filesystem cannot; then nothing
    has changed."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _fsync_path(path: pathlib.Path) -> None:
    flags = os.O_RDONLY
    if path.is_dir():
        flags |= getattr(os, "O_DIRECTORY", 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: pathlib.Path) -> None:
    """Flush every file and directory under `root` (and `root` itself) to disk."""
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            _fsync_path(pathlib.Path(dirpath) / name)
        _fsync_path(pathlib.Path(dirpath))


def replace_dir(tmp: pathlib.Path, final: pathlib.Path) -> None:
    """Make the finished directory `tmp` the new `final`, crash-safe: on Linux, at every
    instant `final` is either the complete previous version or the complete new one.

    Everything in `tmp` is fsynced first. Where `final` exists, one renameat2(RENAME_EXCHANGE)
    swaps the two names (the previous version is then under the temporary name and is
    removed); a first save is one rename. Without RENAME_EXCHANGE (not Linux, a filesystem
    without it) the previous version is renamed away to `.<name>.old-*` and the new one
    renamed in; a kill between those two renames leaves no `final`, and `recover_dir(final)`
    puts the previous version back. The parent directory is fsynced after the swap, so the
    swap itself survives a power loss."""
    _at_step("written", final)
    fsync_tree(tmp)
    _at_step("synced", final)
    if final.exists() and exchange_paths(tmp, final):
        _at_step("exchanged", final)
        _fsync_path(final.parent)
        _at_step("parent_synced", final)
        shutil.rmtree(tmp)  # now the previous version
        _at_step("removed", final)
        return
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        final.rename(old)
        _at_step("old_away", final)
    tmp.rename(final)
    _at_step("new_in", final)
    _fsync_path(final.parent)
    _at_step("parent_synced", final)
    if old is not None:
        shutil.rmtree(old)
    _at_step("removed", final)


def recover_dir(final, remove_leftovers: bool = False) -> pathlib.Path | None:
    """If `final` is missing because `replace_dir` was killed between its two renames (the
    fallback without RENAME_EXCHANGE), move the previous version (the newest `.<name>.old-*`
    beside it) back; returns it, else None.

    With `remove_leftovers` (only where no other process is writing a new version, e.g. at the
    start of a training run) it also removes what killed saves left beside `final`: unfinished
    `.<name>.tmp-*` directories and previous versions `.<name>.old-*`."""
    final = pathlib.Path(final)
    recovered = None
    if not final.exists():
        olds = sorted(final.parent.glob(f".{final.name}.old-*"), key=lambda p: p.stat().st_mtime)
        if olds:
            try:
                olds[-1].rename(final)
                recovered = olds[-1]
            except FileNotFoundError:  # another process (a DDP rank) recovered it first
                pass
    if remove_leftovers and final.exists():
        for left in [
            *final.parent.glob(f".{final.name}.tmp-*"),
            *final.parent.glob(f".{final.name}.old-*"),
        ]:
            shutil.rmtree(left, ignore_errors=True)
    return recovered


def save_checkpoint(model, path, metrics: dict | None = None) -> pathlib.Path:
    """Write `model` to directory `path` atomically (replacing an existing checkpoint there)."""
    model = unwrap(model)  # TypeError for anything but a (wrapped) WorldModel
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(
            weight_tensors(model),
            str(tmp / WEIGHTS),
            metadata={"format": "pt", "simdist_format_version": str(CHECKPOINT_FORMAT_VERSION)},
        )
        model.scaler.save_json(tmp / SCALER)
        _write_json(tmp / METRICS, metrics or {})
        _write_json(
            tmp / CONFIG,
            {
                "format_version": CHECKPOINT_FORMAT_VERSION,
                "config": model.config.to_dict(),
                "sha256": {WEIGHTS: _sha256(tmp / WEIGHTS), SCALER: _sha256(tmp / SCALER)},
            },
        )
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _read_json(file: pathlib.Path):
    if not file.is_file():
        raise CheckpointError(
            f"{file}: missing (a checkpoint needs {WEIGHTS}, {CONFIG}, {SCALER}, {METRICS})"
        )
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: not valid JSON ({err})") from err


def read_config(path) -> WorldModelConfig:
    """The validated world-model config of a checkpoint directory."""
    file = pathlib.Path(path) / CONFIG
    data = _read_json(file)
    if not isinstance(data, dict) or data.get("format_version") != CHECKPOINT_FORMAT_VERSION:
        got = data.get("format_version") if isinstance(data, dict) else data
        raise CheckpointError(
            f"{file}: checkpoint format_version {got!r}, "
            f"this code reads {CHECKPOINT_FORMAT_VERSION}"
        )
    config = data.get("config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: invalid world-model config: no 'config' object")
    try:
        return WorldModelConfig.from_dict(config)
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{file}: invalid world-model config: {err}") from err


def read_metrics(path) -> dict:
    data = _read_json(pathlib.Path(path) / METRICS)
    if not isinstance(data, dict):
        raise CheckpointError(f"{pathlib.Path(path) / METRICS}: expected a JSON object")
    return data


def _config_diff(a: WorldModelConfig, b: WorldModelConfig) -> list[str]:
    da, db = a.to_dict(), b.to_dict()
    return [f"{k}: checkpoint {da[k]!r} != expected {db[k]!r}" for k in da if da[k] != db.get(k)]


def load_checkpoint(path, device="cpu", expect: WorldModelConfig | None = None) -> WorldModel:
    """Rebuild the model saved at `path`; with `expect`, refuse a checkpoint of another config."""
    path = pathlib.Path(path)
    recover_dir(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    config = read_config(path)
    if expect is not None and config != expect:
        raise CheckpointError(
            f"{path / CONFIG}: config mismatch: " + "; ".join(_config_diff(config, expect))
        )
    hashes = _read_json(path / CONFIG).get("sha256", {})
    model = WorldModel(config)
    expected = {k: tuple(v.shape) for k, v in weight_tensors(model).items()}

    weights = path / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    try:
        with safe_open(str(weights), framework="pt") as f:
            names = set(f.keys())
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in names}
    except Exception as err:  # safetensors raises its own error types for bad headers / sizes
        raise CheckpointError(f"{weights}: corrupt or truncated safetensors file ({err})") from err
    missing, unexpected = sorted(set(expected) - names), sorted(names - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{weights}: tensor names do not match the config in {CONFIG}: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    wrong = [
        f"{k} {shapes[k]} (config needs {expected[k]})"
        for k in sorted(names)
        if shapes[k] != expected[k]
    ]
    if wrong:
        raise CheckpointError(
            f"{weights}: tensor shapes do not match the config in {CONFIG}: " + ", ".join(wrong[:5])
        )
    for name in (WEIGHTS, SCALER):
        if name not in hashes:
            raise CheckpointError(f"{path / CONFIG}: no sha256 recorded for {name}")
        if _sha256(path / name) != hashes[name]:
            raise CheckpointError(
                f"{path / name}: SHA-256 does not match {CONFIG}; the file is corrupt"
            )
    try:
        with safe_open(str(weights), framework="pt") as f:
            state = {k: f.get_tensor(k) for k in names}
    except Exception as err:
        raise CheckpointError(f"{weights}: cannot read tensors ({err})") from err
    try:
        model.scaler.load_json(path / SCALER)
    except (ValueError, OSError) as err:
        raise CheckpointError(f"{path / SCALER}: {err}") from err
    model.load_state_dict(state, strict=False)
    return model.to(device).eval()
