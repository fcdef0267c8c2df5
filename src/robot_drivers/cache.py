"""The on-disk cache of derived assets (fitted expert values, render meshes): one folder,
`SIMDIST_CACHE_DIR` or ~/.cache/simdist_ros. Entries are keyed by a hash of their inputs, so a
stale entry is never read; deleting the folder only costs recomputation."""

from __future__ import annotations

import os
import pathlib

import numpy as np


def cache_dir() -> pathlib.Path:
    return pathlib.Path(
        os.environ.get("SIMDIST_CACHE_DIR", pathlib.Path.home() / ".cache" / "simdist_ros")
    )


def save_npz_atomic(path: pathlib.Path, **arrays) -> None:
    """Write then rename, so parallel workers computing the same entry never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
