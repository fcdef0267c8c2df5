"""Writing shards episode by episode: `episode_record` (a finished episode's rows) and
`ShardWriter` (append-only, resumable: anything past the last complete episode is truncated)."""

from __future__ import annotations

import json
import os
import pathlib

import h5py
import numpy as np

from simdist_planner.data.schema import (
    EPISODE_FIELDS,
    FORMAT,
    IMAGES_PER_CHUNK,
    ROWS_PER_CHUNK,
    SCHEMA_VERSION,
    CorruptShardError,
    DatasetError,
    EpisodeRecord,
    StepLayout,
    attr_value,
    check_header,
    open_h5,
    step_datasets,
)


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
                self._file = open_h5(self.path, "r+")
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
            rows = IMAGES_PER_CHUNK if name.startswith("images/") else ROWS_PER_CHUNK
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
        for name, dtype in EPISODE_FIELDS.items():
            eps.create_dataset(
                name,
                shape=(0,),
                maxshape=(None,),
                dtype=dtype,
                chunks=(ROWS_PER_CHUNK,),
                track_times=False,
            )
        eps.create_dataset(
            "noise_scale",
            shape=(0, self.layout.action_dim),
            maxshape=(None, self.layout.action_dim),
            dtype=np.float32,
            chunks=(ROWS_PER_CHUNK, self.layout.action_dim),
            track_times=False,
        )
        eps.create_dataset(
            "meta",
            shape=(0,),
            maxshape=(None,),
            dtype=h5py.string_dtype(),
            chunks=(ROWS_PER_CHUNK,),
            track_times=False,
        )

    def _check_resumable(self, attrs, mutable_attrs) -> None:
        check_header(self._file, self.path)
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
            if old is None or attr_value(old) != attr_value(value):
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
        for name, ds in step_datasets(self._file):
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
        for _, ds in step_datasets(self._file):
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


def _free_name(path: pathlib.Path) -> pathlib.Path:
    k = 0
    while path.with_name(f"{path.name}{k}").exists():
        k += 1
    return path.with_name(f"{path.name}{k}")
