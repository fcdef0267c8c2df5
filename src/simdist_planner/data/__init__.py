"""The simulation dataset on disk: HDF5 shards, an episode-by-episode writer, a reader, windows.

Its modules: `schema` (format, layout, episode record, HDF5 checks), `writer` (ShardWriter),
`reader` (ShardedDataset) and `windows` (WindowDataset); each name is imported from the module
that defines it.

One shard per generator worker / torchrun rank (`shard-00000.h5`, ...). Every shard is a plain
HDF5 file (gzip + shuffle, chunked) that h5py, h5dump or HDFView read without this project; the
schema is documented in docs/dataset.md and versioned by the root attribute `schema_version`.

Rows: an episode with L transitions stores L + 1 rows. Row k holds observation o_k, the action
a_k executed after it, the reward r_k of that transition, V^e(o_k) and the expert flag of a_k.
The last row holds the final observation and its value; its action is zero, reward 0, flag 0.
An episode is complete once its row in /episodes exists (written after its steps), which is
what makes resuming exact: anything past the last complete episode is truncated.
"""
