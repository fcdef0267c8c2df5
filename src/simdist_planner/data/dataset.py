"""The simulation dataset on disk: HDF5 shards, an episode-by-episode writer, a reader, windows.

The import path of the whole dataset API; the parts live in `schema` (format, layout, episode
record, HDF5 checks), `writer` (ShardWriter), `reader` (ShardedDataset) and `windows`
(WindowDataset).

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

from simdist_planner.data.reader import ShardedDataset, shard_paths
from simdist_planner.data.schema import (
    FORMAT,
    PRELOAD_MODES,
    SCHEMA_VERSION,
    SHARD_GLOB,
    CorruptShardError,
    DatasetError,
    EpisodeRecord,
    StepLayout,
    shard_name,
)
from simdist_planner.data.windows import WindowDataset, window_phases
from simdist_planner.data.writer import ShardWriter, episode_record

__all__ = [
    "FORMAT",
    "PRELOAD_MODES",
    "SCHEMA_VERSION",
    "SHARD_GLOB",
    "CorruptShardError",
    "DatasetError",
    "EpisodeRecord",
    "ShardWriter",
    "ShardedDataset",
    "StepLayout",
    "WindowDataset",
    "episode_record",
    "shard_name",
    "shard_paths",
    "window_phases",
]
