"""The simulation dataset on disk: HDF5 shards, an episode-by-episode writer, a reader, windows.

One shard per generator worker / torchrun rank (`shard-00000.h5`, ...). Every shard is a plain
HDF5 file (gzip + shuffle, chunked) that h5py, h5dump or HDFView read without this project; the
schema is documented in docs/dataset.md and versioned by the root attribute `schema_version`.

Rows: an episode with L transitions stores L + 1 rows. Row k holds observation o_k, the action
a_k executed after it, the reward r_k of that transition, V^e(o_k) and the expert flag of a_k.
The last row holds the final observation and its value; its action is zero, reward 0, flag 0.
An episode is complete once its row in /episodes exists (written after its steps), which is
what makes resuming exact: anything past the last complete episode is truncated.
"""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import asdict, dataclass, field

import h5py
import numpy as np
import torch

from robot_drivers.registry import step_phases

FORMAT = "simdist-sim-dataset"
SCHEMA_VERSION = 1
SHARD_GLOB = "shard-*.h5"
PRELOAD_MODES = ("none", "vectors", "all")  # what ShardedDataset holds in memory

# Per-step datasets that are not observations, with their dtypes.
_STEP_SCALARS = {
    "reward": np.float32,
    "value": np.float32,
    "expert": np.uint8,
    "noised": np.uint8,
    "episode": np.int64,
    "t": np.int32,
}
# Per-episode datasets (scalar per episode); `noise_scale` (E, A) is added from the layout.
_EPISODE_FIELDS = {
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
_ROWS_PER_CHUNK = 256
_IMAGES_PER_CHUNK = 8


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
    image_shape: tuple[int, int] = (0, 0)
    height_map_shape: tuple[int, int] | None = None
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
        for name, dtype in _STEP_SCALARS.items():
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


# ------------------------------------------------------------------------------------- writer
def episode_record(
    observations: list[dict],
    actions: list[np.ndarray],
    episode_id: int,
    layout: StepLayout,
    seed: int = -1,
    success: bool = False,
    source: str = "",
) -> EpisodeRecord:
    """L + 1 observation arrays and L executed actions as a dataset episode (no rewards/values)."""
    rows = len(observations)
    if len(actions) != rows - 1 or rows < 2:
        raise ValueError(
            f"an episode needs L >= 1 actions and L + 1 observations, got {len(actions)} / {rows}"
        )
    steps = {
        "proprio": np.stack([o["proprio"] for o in observations]),
        "action": np.concatenate([np.stack(actions), np.zeros((1, layout.action_dim), np.float32)]),
        "reward": np.zeros(rows, np.float32),
        "value": np.zeros(rows, np.float32),
        "expert": np.zeros(rows, np.uint8),
        "noised": np.zeros(rows, np.uint8),
    }
    for i, cam in enumerate(layout.cameras):
        steps[f"images/{cam}"] = np.stack([o["images"][i].transpose(1, 2, 0) for o in observations])
    if layout.height_map_shape:
        steps["height_map"] = np.stack([o["height_map"] for o in observations])
    if layout.command_dim:
        steps["command"] = np.stack([o["command"] for o in observations])
    return EpisodeRecord(
        id=episode_id,
        steps=steps,
        policy=-1,
        seed=seed,
        noise_scale=np.zeros(layout.action_dim, np.float32),
        never_noised=True,
        success=success,
        terminated=success,
        truncated=not success,
        meta={"source": source},
    )


class ShardWriter:
    """Appends complete episodes to one shard; reopening with resume=True continues exactly.

    `attrs` (root attributes: task, config JSON, policy names, ...) must equal the stored ones
    on resume, apart from keys listed in `mutable_attrs`, so that a resumed shard is never a mix
    of two configurations.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        layout: StepLayout,
        attrs: dict[str, str | int | float],
        resume: bool = False,
        mutable_attrs: tuple[str, ...] = (),
    ):
        self.path = pathlib.Path(path)
        self.layout = layout
        if self.path.exists() and not resume:
            raise FileExistsError(
                f"{self.path} exists; pass resume=True (CLI: --resume) to continue it "
                "or choose an empty output directory"
            )
        self.quarantined: pathlib.Path | None = None
        if self.path.exists():
            try:
                self._file = _open_h5(self.path, "r+")
                self._check_resumable(attrs, mutable_attrs)
                for key in mutable_attrs:
                    if key in attrs:
                        self._file.attrs[key] = attrs[key]
                self._truncate_partial()
            except (OSError, CorruptShardError):
                # A kill mid-write can leave a shard HDF5 cannot repair. Keep it aside and
                # start the shard again: its episodes are deterministic, nothing is lost.
                if getattr(self, "_file", None) is not None and self._file.id.valid:
                    self._file.close()
                self.quarantined = _free_name(self.path.with_name(self.path.name + ".corrupt"))
                self.path.rename(self.quarantined)
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = h5py.File(self.path, "w", track_order=False)
            self._create(attrs)
        self._file.flush()

    # -- creation / resume
    def _create(self, attrs) -> None:
        f = self._file
        f.attrs["format"] = FORMAT
        f.attrs["schema_version"] = SCHEMA_VERSION
        f.attrs["layout"] = self.layout.to_json()
        for key, value in attrs.items():
            f.attrs[key] = value
        steps = f.create_group("steps", track_order=False)
        for name, (shape, dtype) in self.layout.step_shapes().items():
            rows = _IMAGES_PER_CHUNK if name.startswith("images/") else _ROWS_PER_CHUNK
            steps.create_dataset(
                name,
                shape=(0, *shape),
                maxshape=(None, *shape),
                dtype=dtype,
                chunks=(rows, *shape),
                compression="gzip",
                compression_opts=4,
                shuffle=True,
                track_times=False,
            )
        eps = f.create_group("episodes", track_order=False)
        for name, dtype in _EPISODE_FIELDS.items():
            eps.create_dataset(
                name,
                shape=(0,),
                maxshape=(None,),
                dtype=dtype,
                chunks=(_ROWS_PER_CHUNK,),
                track_times=False,
            )
        eps.create_dataset(
            "noise_scale",
            shape=(0, self.layout.action_dim),
            maxshape=(None, self.layout.action_dim),
            dtype=np.float32,
            chunks=(_ROWS_PER_CHUNK, self.layout.action_dim),
            track_times=False,
        )
        eps.create_dataset(
            "meta",
            shape=(0,),
            maxshape=(None,),
            dtype=h5py.string_dtype(),
            chunks=(_ROWS_PER_CHUNK,),
            track_times=False,
        )

    def _check_resumable(self, attrs, mutable_attrs) -> None:
        _check_header(self._file, self.path)
        stored = StepLayout.from_json(self._file.attrs["layout"])
        if stored != self.layout:
            raise DatasetError(
                f"{self.path}: stored layout {stored} differs from this run's {self.layout}; "
                "resume only with the same task and robot"
            )
        for key, value in attrs.items():
            if key in mutable_attrs:
                continue
            old = self._file.attrs.get(key)
            if old is None or _attr_value(old) != _attr_value(value):
                raise DatasetError(
                    f"{self.path}: attribute {key!r} is {old!r} in the shard but {value!r} in "
                    "this run; resume only with the same configuration (or use a new --out)"
                )

    def _truncate_partial(self) -> None:
        """Keep only complete episodes whose rows are all still readable; drop the rest.

        A kill while appending can leave the chunks that append was rewriting unreadable,
        including the last chunk shared with the previous (complete) episode; episodes
        touching such a chunk are dropped too and get generated again.
        """
        eps = self._file["episodes"]
        n = min(eps[name].shape[0] for name in eps)
        ends = (eps["start"][:n] + eps["length"][:n]).astype(np.int64)
        rows = int(ends[-1]) if n else 0
        readable = rows
        for name, ds in _step_datasets(self._file):
            if ds.shape[0] < rows:
                raise CorruptShardError(
                    f"{self.path}: /steps/{name} has {ds.shape[0]} rows but the episode table "
                    f"covers {rows}"
                )
            chunk = ds.chunks[0]
            for lo in range(rows // chunk * chunk, ds.shape[0], chunk):
                try:
                    ds[lo : min(lo + chunk, ds.shape[0])]
                except OSError:
                    readable = min(readable, lo)
                    break
        n = int(np.searchsorted(ends, readable, side="right"))
        for name in eps:
            eps[name].resize(n, axis=0)
        rows = int(ends[n - 1]) if n else 0
        for _, ds in _step_datasets(self._file):
            ds.resize(rows, axis=0)

    # -- appending
    @property
    def episode_ids(self) -> list[int]:
        return [int(i) for i in self._file["episodes/id"][:]]

    @property
    def num_rows(self) -> int:
        return int(self._file["steps/reward"].shape[0])

    def append(self, ep: EpisodeRecord) -> None:
        shapes = self.layout.step_shapes()
        length = _episode_rows(ep.steps, shapes, ep.id)
        start = self.num_rows
        steps = dict(ep.steps)
        steps["episode"] = np.full(length, ep.id, np.int64)
        steps["t"] = np.arange(length, dtype=np.int32)
        for name, (shape, dtype) in shapes.items():
            ds = self._file["steps/" + name]
            ds.resize(start + length, axis=0)
            ds[start:] = np.asarray(steps[name], dtype=dtype)
        self._file.flush()  # steps are on disk before the record that declares them complete
        noise = np.asarray(ep.noise_scale, np.float32).reshape(self.layout.action_dim)
        row = {
            "id": ep.id,
            "start": start,
            "length": length,
            "policy": ep.policy,
            "seed": ep.seed,
            "never_noised": ep.never_noised,
            "success": ep.success,
            "terminated": ep.terminated,
            "truncated": ep.truncated,
            "return": float(np.sum(steps["reward"][:-1], dtype=np.float64)),
            "noise_scale": noise,
            "meta": json.dumps(ep.meta, sort_keys=True),
        }
        eps = self._file["episodes"]
        n = eps["id"].shape[0]
        for name, value in row.items():
            eps[name].resize(n + 1, axis=0)
            eps[name][n] = value
        self._file.flush()

    def close(self) -> None:
        if self._file.id.valid:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _episode_rows(steps: dict[str, np.ndarray], shapes, ep_id: int) -> int:
    missing = [k for k in shapes if k not in ("episode", "t") and k not in steps]
    if missing:
        raise DatasetError(f"episode {ep_id}: missing step arrays {missing}")
    lengths = {k: len(steps[k]) for k in shapes if k in steps}
    length = lengths["reward"]
    if length < 2 or any(v != length for v in lengths.values()):
        raise DatasetError(
            f"episode {ep_id}: every step array needs the same length >= 2 (transitions + 1), "
            f"got {lengths}"
        )
    for k, (shape, _) in shapes.items():
        if k in steps and tuple(np.shape(steps[k])[1:]) != shape:
            raise DatasetError(
                f"episode {ep_id}: {k} has row shape {np.shape(steps[k])[1:]}, expected {shape}"
            )
    return length


def _attr_value(v):
    return v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)


def _step_datasets(f: h5py.File):
    out = []
    f["steps"].visititems(lambda n, o: out.append((n, o)) if isinstance(o, h5py.Dataset) else None)
    return out


def _free_name(path: pathlib.Path) -> pathlib.Path:
    k = 0
    while path.with_name(f"{path.name}{k}").exists():
        k += 1
    return path.with_name(f"{path.name}{k}")


def _open_h5(path: pathlib.Path, mode: str) -> h5py.File:
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


def _check_header(f: h5py.File, path) -> None:
    fmt = _attr_value(f.attrs.get("format", ""))
    if fmt != FORMAT:
        raise DatasetError(f"{path}: attribute format is {fmt!r}, expected {FORMAT!r}")
    version = _attr_value(f.attrs.get("schema_version", -1))
    if version != SCHEMA_VERSION:
        raise DatasetError(
            f"{path}: schema_version {version}, this reader understands {SCHEMA_VERSION}; "
            "regenerate the dataset with this version of simdist-generate"
        )
    for group in ("steps", "episodes"):
        if group not in f:
            raise CorruptShardError(f"{path}: missing group /{group}")


# ------------------------------------------------------------------------------------- reader
class _Shard:
    """One open shard: validated header, episode table in memory, vectors cached on demand."""

    def __init__(self, path: pathlib.Path, preload: str):
        self.path = path
        self.preload = preload
        self._file: h5py.File | None = None
        self._pid = None
        self._datasets: dict[str, h5py.Dataset] = {}
        self._cache: dict[str, np.ndarray] = {}
        f = self.file
        _check_header(f, path)
        self.layout = StepLayout.from_json(f.attrs["layout"])
        self.attrs = {k: _attr_value(v) for k, v in f.attrs.items()}
        expected = set(self.layout.step_shapes())
        present = {n for n, _ in _step_datasets(f)}
        if expected - present:
            raise DatasetError(
                f"{path}: missing datasets {sorted('/steps/' + n for n in expected - present)}"
            )
        eps = f["episodes"]
        missing = (set(_EPISODE_FIELDS) | {"noise_scale", "meta"}) - set(eps)
        if missing:
            raise DatasetError(
                f"{path}: missing datasets {sorted('/episodes/' + n for n in missing)}"
            )
        n = min(eps[k].shape[0] for k in eps)
        self.episodes = {k: eps[k][:n] for k in list(_EPISODE_FIELDS) + ["noise_scale"]}
        rows = int(self.episodes["start"][-1] + self.episodes["length"][-1]) if n else 0
        short = {name: ds.shape[0] for name, ds in _step_datasets(f) if ds.shape[0] < rows}
        if short:
            raise CorruptShardError(
                f"{path}: the episode table covers {rows} rows but {short} have fewer; "
                "the shard is truncated or corrupt"
            )

    @property
    def file(self) -> h5py.File:
        # h5py handles must not cross fork (DataLoader workers): reopen per process.
        if self._file is None or self._pid != os.getpid():
            self._file = _open_h5(self.path, "r")
            self._pid = os.getpid()
            self._datasets = {}
        return self._file

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        if self.preload == "all" or (self.preload == "vectors" and not name.startswith("images/")):
            if name not in self._cache:
                self._cache[name] = self.file["steps/" + name][:]
            return self._cache[name][start:stop]
        f = self.file
        if name not in self._datasets:
            self._datasets[name] = f["steps/" + name]
        return self._datasets[name][start:stop]

    def meta(self, i: int) -> dict:
        return json.loads(_attr_value(self.file["episodes/meta"][i]))

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_file"], state["_datasets"] = None, {}
        return state


def shard_paths(paths_or_dir) -> list[pathlib.Path]:
    """The shard files named by a directory (all shard-*.h5 in it, sorted) or explicit paths."""
    items = [paths_or_dir] if isinstance(paths_or_dir, (str, os.PathLike)) else list(paths_or_dir)
    out: list[pathlib.Path] = []
    for item in items:
        p = pathlib.Path(item)
        if p.is_dir():
            found = sorted(p.glob(SHARD_GLOB))
            if not found:
                raise FileNotFoundError(f"{p}: no {SHARD_GLOB} files in this directory")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such shard file or directory")
    return out


class ShardedDataset:
    """Random access to the steps of a selection of episodes across shards.

    Selection is by episode and deterministic: episodes, ordered by (generation run, id), are
    put in a permutation seeded with `selection_seed`; `expert_only` keeps only episodes whose
    every action is a clean expert action; `fraction` keeps the first round(fraction * n) of
    that order (so the 10% selection is inside the 50% one); `max_steps` then keeps the shortest
    prefix with at least that many rows (equal-volume ablations); finally rank r of `world_size`
    keeps every world_size-th selected episode starting at r.

    preload: "vectors" keeps every non-image /steps array in memory (small; fast windows),
    "all" images too (small datasets: no decompression per window), "none" reads lazily.
    """

    def __init__(
        self,
        paths_or_dir,
        *,
        fraction: float = 1.0,
        expert_only: bool = False,
        max_steps: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        selection_seed: int = 0,
        preload: str = "vectors",
    ):
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        if preload not in PRELOAD_MODES:
            raise ValueError(f"preload must be one of {PRELOAD_MODES}, got {preload!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}"
            )
        self.shards = [_Shard(p, preload) for p in shard_paths(paths_or_dir)]
        self.layout = self.shards[0].layout
        for s in self.shards[1:]:
            if s.layout != self.layout:
                raise DatasetError(
                    f"{s.path}: layout {s.layout} differs from "
                    f"{self.shards[0].path}'s {self.layout}"
                )
        # Several generation runs may be combined (e.g. fixed and randomised friction): a run is
        # identified by its generation config, episode ids are unique within a run, and the
        # order is by (run, id) with runs in the order their first shard was named.
        runs: dict[str, int] = {}
        run_of = [runs.setdefault(str(s.attrs.get("config", "")), len(runs)) for s in self.shards]
        noise = {json.dumps(self._obs_noise_of(s.attrs), sort_keys=True) for s in self.shards}
        if len(noise) > 1:
            raise DatasetError(
                f"the runs combined here use different observation noise: {sorted(noise)}"
            )
        # (shard, local episode index) for every episode, ordered by (run, id)
        refs = [(si, li) for si, s in enumerate(self.shards) for li in range(len(s.episodes["id"]))]
        keys = np.array(
            [(run_of[si], self.shards[si].episodes["id"][li]) for si, li in refs], np.int64
        ).reshape(-1, 2)
        if len(np.unique(keys, axis=0)) != len(keys):
            raise DatasetError(
                "episode ids repeat across shards of one generation run (the same shard named "
                "twice, or two runs with the same config and seed)"
            )
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        order = order[np.random.default_rng(selection_seed).permutation(len(order))]
        if expert_only:
            order = np.array([k for k in order if self._all_clean_expert(*refs[k])], np.int64)
        order = order[: int(round(fraction * len(order)))]
        if max_steps is not None:
            lengths = np.array(
                [self.shards[refs[k][0]].episodes["length"][refs[k][1]] for k in order]
            )
            keep = int(np.searchsorted(np.cumsum(lengths), max_steps)) + 1
            if keep > len(order):
                raise ValueError(
                    f"max_steps={max_steps} but the selection holds only {int(lengths.sum())} rows"
                )
            order = order[:keep]
        order = order[rank::world_size]
        if len(order) == 0:
            raise DatasetError(
                f"no episodes selected (fraction={fraction}, expert_only={expert_only}, "
                f"rank={rank}/{world_size}) from {len(refs)} episodes"
            )
        self._refs = [refs[k] for k in order]
        self.lengths = np.array(
            [self.shards[si].episodes["length"][li] for si, li in self._refs], np.int64
        )
        self._offsets = np.concatenate([[0], np.cumsum(self.lengths)])

    def _all_clean_expert(self, si: int, li: int) -> bool:
        s = self.shards[si]
        start, length = int(s.episodes["start"][li]), int(s.episodes["length"][li])
        return bool(np.all(s.read("expert", start, start + length - 1) == 1))

    # -- metadata
    @property
    def attrs(self) -> dict:
        """Root attributes of the first shard (task, generation config JSON, ...)."""
        return self.shards[0].attrs

    @property
    def config(self) -> dict:
        return json.loads(self.attrs.get("config", "{}"))

    @staticmethod
    def _obs_noise_of(attrs) -> dict:
        return json.loads(attrs.get("config", "{}")).get("robot", {}).get("obs_noise", {})

    def obs_noise_std(self) -> dict[str, np.ndarray | float]:
        """Training-time observation noise: {"proprio": (P,) std per dimension, "height_map"}.

        From the generation config (`robot.obs_noise`, one std per term name); terms it does
        not name get 0. Observations are stored clean; the pretrainer adds this noise.
        """
        per_term = self._obs_noise_of(self.attrs)
        proprio = np.concatenate(
            [
                np.full(dim, float(per_term.get(name, 0.0)), np.float32)
                for name, dim in self.layout.proprio_terms
            ]
        )
        return {"proprio": proprio, "height_map": float(per_term.get("height_map", 0.0))}

    @property
    def num_episodes(self) -> int:
        return len(self._refs)

    @property
    def num_steps(self) -> int:
        return int(self._offsets[-1])

    def episode_info(self, i: int) -> dict:
        """Per-episode metadata (policy, noise scale, success, seed, ...) of selected episode i."""
        si, li = self._refs[i]
        s = self.shards[si]
        info = {k: v[li].tolist() for k, v in s.episodes.items()}
        info["shard"] = str(s.path)
        info.update(s.meta(li))
        return info

    # -- data
    def read(self, i: int, start: int, stop: int, names=None) -> dict[str, np.ndarray]:
        """Rows [start, stop) of selected episode i: the /steps datasets `names` (default every
        one; images HWC uint8)."""
        length = int(self.lengths[i])
        if not 0 <= start <= stop <= length:
            raise IndexError(f"rows [{start}, {stop}) outside episode {i} of {length} rows")
        si, li = self._refs[i]
        s = self.shards[si]
        base = int(s.episodes["start"][li])
        return {
            name: s.read(name, base + start, base + stop)
            for name in (self.layout.step_shapes() if names is None else names)
        }

    def episode(self, i: int) -> dict[str, np.ndarray]:
        return self.read(i, 0, int(self.lengths[i]))

    def __len__(self) -> int:
        return self.num_steps

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        """One row by its global index within the selection."""
        if not -len(self) <= idx < len(self):
            raise IndexError(f"row {idx} outside dataset of {len(self)} rows")
        idx %= len(self)
        i = int(np.searchsorted(self._offsets, idx, side="right")) - 1
        k = idx - int(self._offsets[i])
        return {name: v[0] for name, v in self.read(i, k, k + 1).items()}


# ------------------------------------------------------------------------------------ windows
class WindowDataset(torch.utils.data.Dataset):
    """Training windows in the "Model inputs" format of docs/architecture.md.

    Item: {"obs": {"proprio" (H+T+1, P), "images" (H+T+1, n_cam, 3, h, w) uint8,
    "height_map" (H+T+1, 21, 15), "command" (H+T+1, 3)} (keys the robot lacks are absent),
    "actions" (H+T, A) = a_{t-H..t+T-1}, "rewards" (T,) = r_{t..t+T-1},
    "values" (T,) = v_{t+1..t+T}, "expert" (T,) flags of a_{t..t+T-1}, "state" (S,) the
    privileged task state of o_t when the shards hold one}; index H is step t.
    Windows never cross episodes. pad="repeat" also samples t < H: history rows before the
    episode start repeat o_0 and their actions are zero (what a planner sees right after a
    reset); pad="none" samples only t >= H.
    """

    def __init__(self, dataset: ShardedDataset, history: int, horizon: int, pad: str = "repeat"):
        if history < 0 or horizon < 1:
            raise ValueError(f"need history >= 0 and horizon >= 1, got H={history} T={horizon}")
        if pad not in ("repeat", "none"):
            raise ValueError(f"pad must be 'repeat' or 'none', got {pad!r}")
        self.dataset, self.H, self.T, self.pad = dataset, history, horizon, pad
        first = 0 if pad == "repeat" else history
        eps, ts = [], []
        for i, rows in enumerate(dataset.lengths):
            last = int(rows) - 1 - horizon  # t + T <= L = rows - 1
            if last >= first:
                eps.append(np.full(last - first + 1, i, np.int64))
                ts.append(np.arange(first, last + 1, dtype=np.int64))
        if not eps:
            raise DatasetError(
                f"no window of history {history} and horizon {horizon} fits any of the "
                f"{dataset.num_episodes} episodes (longest has {int(dataset.lengths.max())} rows)"
            )
        self.episode_index = np.concatenate(eps)
        self.t_index = np.concatenate(ts)

    def __len__(self) -> int:
        return len(self.episode_index)

    def window(self, idx: int) -> dict:
        """The window as numpy arrays (what __getitem__ converts to tensors)."""
        i, t = int(self.episode_index[idx]), int(self.t_index[idx])
        H, T = self.H, self.T
        lo = max(0, t - H)
        rows = self.dataset.read(i, lo, t + T + 1)
        pad = H - (t - lo)  # rows missing before the episode start
        layout = self.dataset.layout

        def obs_rows(x):
            return np.concatenate([np.repeat(x[:1], pad, axis=0), x]) if pad else x

        obs = {"proprio": obs_rows(rows["proprio"])}
        if layout.cameras:
            imgs = np.stack([rows[f"images/{c}"] for c in layout.cameras], axis=1)
            obs["images"] = np.ascontiguousarray(obs_rows(imgs).transpose(0, 1, 4, 2, 3))
        if layout.height_map_shape:
            obs["height_map"] = obs_rows(rows["height_map"])
        if layout.command_dim:
            obs["command"] = obs_rows(rows["command"])
        actions = rows["action"][: t - lo + T]
        if pad:
            actions = np.concatenate([np.zeros((pad, layout.action_dim), np.float32), actions])
        k = t - lo  # row of step t within `rows`
        window = {
            "obs": obs,
            "actions": actions,
            "rewards": rows["reward"][k : k + T],
            "values": rows["value"][k + 1 : k + T + 1],
            "expert": rows["expert"][k : k + T].astype(np.float32),
        }
        if layout.state_terms:  # a training target beside the observation, never an input
            window["state"] = rows["state"][k]
        return window

    def __getitem__(self, idx: int) -> dict:
        w = self.window(idx)
        return {
            "obs": {k: torch.from_numpy(v) for k, v in w["obs"].items()},
            **{k: torch.from_numpy(np.ascontiguousarray(w[k])) for k in w if k != "obs"},
        }


def window_phases(windows: WindowDataset) -> dict[str, np.ndarray]:
    """{phase: (len(windows),) mask} of the windows whose step t lies in each named phase of the
    dataset's task (robot_drivers.registry.step_phases; {} when the task names none)."""

    data = windows.dataset
    task = str(data.attrs.get("task", ""))
    names = ("action", "state") if data.layout.state_terms else ("action",)
    per_episode = [
        step_phases(task, data.read(i, 0, int(data.lengths[i]), names=names))
        for i in range(data.num_episodes)
    ]
    row = (
        np.concatenate([[0], np.cumsum(data.lengths)[:-1]])[windows.episode_index] + windows.t_index
    )
    return {phase: np.concatenate([p[phase] for p in per_episode])[row] for phase in per_episode[0]}
