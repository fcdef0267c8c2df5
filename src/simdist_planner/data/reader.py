"""Reading shards: `shard_paths` and `ShardedDataset`, random access to the steps of a
deterministic selection of episodes across shards."""

from __future__ import annotations

import json
import os
import pathlib

import h5py
import numpy as np

from simdist_planner.data.schema import (
    EPISODE_FIELDS,
    PRELOAD_MODES,
    SHARD_GLOB,
    CorruptShardError,
    DatasetError,
    StepLayout,
    attr_value,
    check_header,
    open_h5,
    step_datasets,
)


class _Shard:
    """One open shard: validated header, episode table in memory, vectors cached on demand."""

    def __init__(self, path: pathlib.Path, preload: str):
        self.path = path
        self.preload = preload
        self._file: h5py.File | None = None
        self._pid: int | None = None
        self._datasets: dict[str, h5py.Dataset] = {}
        self._cache: dict[str, np.ndarray] = {}
        f = self.file
        check_header(f, path)
        self.layout = StepLayout.from_json(f.attrs["layout"])
        self.attrs = {k: attr_value(v) for k, v in f.attrs.items()}
        expected = set(self.layout.step_shapes())
        present = {n for n, _ in step_datasets(f)}
        if expected - present:
            raise DatasetError(
                f"{path}: missing datasets {sorted('/steps/' + n for n in expected - present)}"
            )
        eps = f["episodes"]
        missing = (set(EPISODE_FIELDS) | {"noise_scale", "meta"}) - set(eps)
        if missing:
            raise DatasetError(
                f"{path}: missing datasets {sorted('/episodes/' + n for n in missing)}"
            )
        n = min(eps[k].shape[0] for k in eps)
        self.episodes = {k: eps[k][:n] for k in list(EPISODE_FIELDS) + ["noise_scale"]}
        rows = int(self.episodes["start"][-1] + self.episodes["length"][-1]) if n else 0
        short = {name: ds.shape[0] for name, ds in step_datasets(f) if ds.shape[0] < rows}
        if short:
            raise CorruptShardError(
                f"{path}: the episode table covers {rows} rows but {short} have fewer; "
                "the shard is truncated or corrupt"
            )

    @property
    def file(self) -> h5py.File:
        # h5py handles must not cross fork (DataLoader workers): reopen per process.
        if self._file is None or self._pid != os.getpid():
            self._file = open_h5(self.path, "r")
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
        return json.loads(attr_value(self.file["episodes/meta"][i]))

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
