"""The dataset's on-disk schema: format and version, the per-step and per-episode datasets, the
step layout of a robot, one episode as the writer takes it, and the HDF5 checks both the writer
and the reader make (docs/dataset.md)."""

from __future__ import annotations

import json
import pathlib
from dataclasses import asdict, dataclass, field

import h5py
import numpy as np

FORMAT = "simdist-sim-dataset"
SCHEMA_VERSION = 1
SHARD_GLOB = "shard-*.h5"
PRELOAD_MODES = ("none", "vectors", "all")  # what ShardedDataset holds in memory

# Per-step datasets that are not observations, with their dtypes.
STEP_SCALARS = {
    "reward": np.float32,
    "value": np.float32,
    "expert": np.uint8,
    "noised": np.uint8,
    "episode": np.int64,
    "t": np.int32,
}
# Per-episode datasets (scalar per episode); `noise_scale` (E, A) is added from the layout.
EPISODE_FIELDS = {
    "id": np.int64,
    "start": np.int64,
    "length": np.int64,
    "policy": np.int16,
    "seed": np.int64,
    "never_noised": np.uint8,
    "success": np.uint8,
    "terminated": np.uint8,
    "truncated": np.uint8,
    "return": np.float32,
}
ROWS_PER_CHUNK = 256
IMAGES_PER_CHUNK = 8


class DatasetError(ValueError):
    """A shard is missing, unreadable, of another schema version, or inconsistent."""


class CorruptShardError(DatasetError):
    """A shard's contents are damaged (e.g. a writer was killed mid-episode)."""


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.h5"


@dataclass(frozen=True)
class StepLayout:
    """Which observation terms a robot has and their shapes; sizes every dataset of a shard."""

    proprio_terms: tuple[tuple[str, int], ...]
    action_dim: int
    cameras: tuple[str, ...] = ()
    image_shape: tuple[int, ...] = (0, 0)  # (height, width)
    height_map_shape: tuple[int, ...] | None = None
    command_dim: int = 0
    state_terms: tuple[tuple[str, int], ...] = ()  # privileged task state (Task.state_terms)

    @classmethod
    def from_spec(cls, spec, state_terms=()) -> "StepLayout":
        return cls(
            proprio_terms=tuple((t.name, int(t.dim)) for t in spec.proprio_terms),
            action_dim=int(spec.action_dim),
            cameras=tuple(spec.cameras),
            image_shape=tuple(int(s) for s in spec.image_shape) if spec.cameras else (0, 0),
            height_map_shape=(
                tuple(int(s) for s in spec.height_map_shape) if spec.height_map_shape else None
            ),
            command_dim=int(spec.command_dim),
            state_terms=tuple((str(n), int(k)) for n, k in state_terms),
        )

    @classmethod
    def from_json(cls, text: str) -> "StepLayout":
        d = json.loads(text)
        return cls(
            proprio_terms=tuple((str(n), int(k)) for n, k in d["proprio_terms"]),
            action_dim=int(d["action_dim"]),
            cameras=tuple(d["cameras"]),
            image_shape=tuple(d["image_shape"]),
            height_map_shape=tuple(d["height_map_shape"]) if d["height_map_shape"] else None,
            command_dim=int(d["command_dim"]),
            state_terms=tuple((str(n), int(k)) for n, k in d.get("state_terms", ())),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def proprio_dim(self) -> int:
        return sum(d for _, d in self.proprio_terms)

    @property
    def state_dim(self) -> int:
        return sum(d for _, d in self.state_terms)

    def state_slices(self) -> dict[str, slice]:
        """{term: its columns of the state vector}, in layout order."""
        out, offset = {}, 0
        for name, dim in self.state_terms:
            out[name] = slice(offset, offset + dim)
            offset += dim
        return out

    def step_shapes(self) -> dict[str, tuple[tuple[int, ...], type]]:
        """Per-row shape and dtype of every /steps dataset, keyed by its path under /steps."""
        shapes: dict[str, tuple[tuple[int, ...], type]] = {
            "proprio": ((self.proprio_dim,), np.float32),
            "action": ((self.action_dim,), np.float32),
        }
        for cam in self.cameras:
            shapes[f"images/{cam}"] = ((*self.image_shape, 3), np.uint8)
        if self.height_map_shape:
            shapes["height_map"] = (tuple(self.height_map_shape), np.float32)
        if self.command_dim:
            shapes["command"] = ((self.command_dim,), np.float32)
        if self.state_terms:
            shapes["state"] = ((self.state_dim,), np.float32)
        for name, dtype in STEP_SCALARS.items():
            shapes[name] = ((), dtype)
        return shapes


@dataclass
class EpisodeRecord:
    """One finished episode as the generator hands it to the writer (rows = transitions + 1)."""

    id: int
    steps: dict[str, np.ndarray]  # keys of StepLayout.step_shapes() except "episode" and "t"
    policy: int
    seed: int
    noise_scale: np.ndarray  # (A,) per-dimension action-noise std of this episode
    never_noised: bool
    success: bool
    terminated: bool
    truncated: bool
    meta: dict = field(default_factory=dict)


def attr_value(v):
    return v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)


def step_datasets(f: h5py.File):
    out = []
    f["steps"].visititems(lambda n, o: out.append((n, o)) if isinstance(o, h5py.Dataset) else None)
    return out


def open_h5(path: pathlib.Path, mode: str) -> h5py.File:
    try:
        return h5py.File(path, mode)
    except BlockingIOError as e:
        raise DatasetError(
            f"{path}: locked by another process (a generator still writing it?); "
            "wait for it to finish"
        ) from e
    except OSError as e:
        raise CorruptShardError(
            f"{path}: not a readable HDF5 file ({e}); it may be truncated or still being "
            "written. Delete it and generate it again (its episodes are deterministic)."
        ) from e


def check_header(f: h5py.File, path) -> None:
    fmt = attr_value(f.attrs.get("format", ""))
    if fmt != FORMAT:
        raise DatasetError(f"{path}: attribute format is {fmt!r}, expected {FORMAT!r}")
    version = attr_value(f.attrs.get("schema_version", -1))
    if version != SCHEMA_VERSION:
        raise DatasetError(
            f"{path}: schema_version {version}, this reader understands {SCHEMA_VERSION}; "
            "regenerate the dataset with this version of simdist-generate"
        )
    for group in ("steps", "episodes"):
        if group not in f:
            raise CorruptShardError(f"{path}: missing group /{group}")
