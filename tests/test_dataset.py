"""The HDF5 shard format: round trip, windows, selection, resume truncation and bad files."""

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.schema import (
    SCHEMA_VERSION,
    DatasetError,
    EpisodeRecord,
    StepLayout,
    shard_name,
)
from simdist_planner.data.windows import WindowDataset
from simdist_planner.data.writer import ShardWriter

LAYOUT = StepLayout(
    proprio_terms=(("step", 1), ("episode", 1), ("x", 2)),
    action_dim=3,
    cameras=("wrist", "top"),
    image_shape=(4, 5),
    height_map_shape=(21, 15),
    command_dim=3,
    state_terms=(("row", 1), ("episode", 1)),
)
ATTRS = {"task": "synthetic", "config": json.dumps({"seed": 0})}


def make_episode(ep_id: int, rows: int, expert_all: bool = False, policy: int = 0) -> EpisodeRecord:
    """Every value encodes (episode, row) so a window's provenance can be read off it."""
    k = np.arange(rows)
    proprio = np.stack([k, np.full(rows, ep_id), k * 0.5, -k], axis=1).astype(np.float32)
    images = {
        cam: (np.arange(rows * 4 * 5 * 3).reshape(rows, 4, 5, 3) + 7 * c + ep_id).astype(np.uint8)
        for c, cam in enumerate(LAYOUT.cameras)
    }
    action = np.stack([k + 1, np.full(rows, ep_id), k], axis=1).astype(np.float32)
    action[-1] = 0
    expert = np.ones(rows, np.uint8) if expert_all else (k % 2).astype(np.uint8)
    expert[-1] = 0
    steps = {
        "proprio": proprio,
        **{f"images/{cam}": v for cam, v in images.items()},
        "height_map": np.broadcast_to((k + 100 * ep_id)[:, None, None], (rows, 21, 15)).astype(
            np.float32
        ),
        "command": np.stack([k, k, np.full(rows, ep_id)], axis=1).astype(np.float32),
        "state": np.stack([3000 + k, np.full(rows, ep_id)], axis=1).astype(np.float32),
        "action": action,
        "reward": np.where(k < rows - 1, 1000 + k, 0).astype(np.float32),
        "value": (2000 + k).astype(np.float32),
        "expert": expert,
        "noised": np.zeros(rows, np.uint8),
    }
    return EpisodeRecord(
        id=ep_id,
        steps=steps,
        policy=policy,
        seed=10 * ep_id,
        noise_scale=np.full(3, 0.1 * ep_id),
        never_noised=expert_all,
        success=ep_id % 2 == 0,
        terminated=ep_id % 2 == 0,
        truncated=ep_id % 2 == 1,
        meta={"policy_name": f"p{policy}"},
    )


def write_shards(tmp_path, lengths_per_shard, expert_all=()):
    eps = {}
    ep_id = 0
    for s, lengths in enumerate(lengths_per_shard):
        with ShardWriter(tmp_path / shard_name(s), LAYOUT, ATTRS) as w:
            for rows in lengths:
                ep = make_episode(ep_id, rows, expert_all=ep_id in expert_all, policy=ep_id % 3)
                w.append(ep)
                eps[ep_id] = ep
                ep_id += 1
    return eps


def test_round_trip_every_dataset_and_metadata(tmp_path):
    eps = write_shards(tmp_path, [[6, 9], [7]])
    ds = ShardedDataset(tmp_path)
    assert ds.num_episodes == 3 and ds.num_steps == 22 and len(ds) == 22
    seen = set()
    for i in range(ds.num_episodes):
        info = ds.episode_info(i)
        ep = eps[info["id"]]
        seen.add(info["id"])
        got = ds.episode(i)
        for name, value in ep.steps.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        assert got["episode"].tolist() == [ep.id] * len(ep.steps["reward"])
        assert got["t"].tolist() == list(range(len(ep.steps["reward"])))
        assert info["policy"] == ep.policy and info["seed"] == ep.seed
        assert info["policy_name"] == f"p{ep.policy}"
        np.testing.assert_allclose(info["noise_scale"], ep.noise_scale, rtol=1e-6)
        assert info["success"] == ep.success and info["truncated"] == ep.truncated
        assert info["return"] == pytest.approx(float(ep.steps["reward"].sum()))
    assert seen == {0, 1, 2}
    # random access by global row agrees with the episode reads
    row = ds[ds.lengths[0] + 2]
    np.testing.assert_array_equal(row["proprio"], ds.episode(1)["proprio"][2])
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert json.loads(ds.attrs["config"]) == {"seed": 0} and ds.layout == LAYOUT


def test_shard_is_plain_hdf5_with_documented_schema(tmp_path):
    write_shards(tmp_path, [[5]])
    with h5py.File(tmp_path / shard_name(0), "r") as f:
        assert f.attrs["schema_version"] == SCHEMA_VERSION
        assert f["steps/images/wrist"].dtype == np.uint8
        assert f["steps/images/wrist"].shape == (5, 4, 5, 3)
        assert f["steps/proprio"].compression == "gzip" and f["steps/proprio"].chunks
        assert f["episodes/length"][:].tolist() == [5]


@pytest.mark.parametrize("pad", ["repeat", "none"])
def test_windows_match_the_model_input_contract(tmp_path, pad):
    write_shards(tmp_path, [[6, 12], [9, 3]])
    ds = ShardedDataset(tmp_path)
    H, T = 3, 2
    win = WindowDataset(ds, H, T, pad=pad)
    first = 0 if pad == "repeat" else H
    assert len(win) == sum(max(0, (n - 1 - T) - first + 1) for n in ds.lengths)
    for idx in range(len(win)):
        w = win[idx]
        i, t = int(win.episode_index[idx]), int(win.t_index[idx])
        ep_id = ds.episode_info(i)["id"]
        obs = w["obs"]
        assert obs["proprio"].shape == (H + T + 1, 4)
        assert obs["images"].shape == (H + T + 1, 2, 3, 4, 5) and obs["images"].dtype == torch.uint8
        assert obs["height_map"].shape == (H + T + 1, 21, 15) and obs["command"].shape == (
            H + T + 1,
            3,
        )
        assert w["actions"].shape == (H + T, 3)
        assert w["rewards"].shape == w["values"].shape == w["expert"].shape == (T,)
        # never crosses an episode: every row carries this episode's id
        assert torch.all(obs["proprio"][:, 1] == ep_id)
        # index H is step t; earlier rows repeat o_0 before the start
        rows = np.clip(np.arange(t - H, t + T + 1), 0, None)
        assert obs["proprio"][:, 0].tolist() == rows.tolist()
        assert obs["proprio"][H, 0] == t
        # actions a_{t-H}..a_{t+T-1}, zero before the start
        want = [k + 1 if k >= 0 else 0 for k in range(t - H, t + T)]
        assert w["actions"][:, 0].tolist() == want
        assert w["rewards"].tolist() == [1000 + k for k in range(t, t + T)]
        assert w["values"].tolist() == [2000 + k for k in range(t + 1, t + T + 1)]
        assert w["expert"].tolist() == [k % 2 for k in range(t, t + T)]
        assert w["state"].tolist() == [3000 + t, ep_id]  # the task state of o_t only
        # images are CHW of the stored HWC frame of the right camera
        stored = ds.read(i, rows[H], rows[H] + 1)["images/top"][0]
        assert torch.equal(obs["images"][H, 1], torch.from_numpy(stored).permute(2, 0, 1))
    if pad == "none":
        assert win.t_index.min() == H


def test_preload_modes_read_the_same_windows(tmp_path):
    write_shards(tmp_path, [[7, 9]])
    wins = [
        WindowDataset(ShardedDataset(tmp_path, preload=m), 2, 3) for m in ("none", "vectors", "all")
    ]
    for idx in range(len(wins[0])):
        ref = wins[0].window(idx)
        for w in wins[1:]:
            other = w.window(idx)
            for k in ("actions", "rewards", "values", "expert"):
                np.testing.assert_array_equal(ref[k], other[k])
            for k in ref["obs"]:
                np.testing.assert_array_equal(ref["obs"][k], other["obs"][k])
    with pytest.raises(ValueError, match="preload"):
        ShardedDataset(tmp_path, preload=True)


def test_windows_batch_with_a_dataloader(tmp_path):
    write_shards(tmp_path, [[8, 8]])
    win = WindowDataset(ShardedDataset(tmp_path), 2, 3)
    win.dataset.read(0, 0, 1)  # handles opened in the parent must not leak into workers
    loader = torch.utils.data.DataLoader(win, batch_size=4, shuffle=True, num_workers=2)
    batches = list(loader)
    assert batches[0]["obs"]["images"].shape == (4, 6, 2, 3, 4, 5)
    assert batches[0]["actions"].shape == (4, 5, 3) and batches[0]["values"].shape == (4, 3)
    seen = torch.cat([b["obs"]["proprio"][:, 2, :2] for b in batches])  # (t, episode) of step t
    assert len(seen) == len(win) and len({tuple(r.tolist()) for r in seen}) == len(win)


def test_no_window_fits_is_a_clear_error(tmp_path):
    write_shards(tmp_path, [[3]])
    with pytest.raises(DatasetError, match="no window"):
        WindowDataset(ShardedDataset(tmp_path), 2, 5)


def test_selection_fraction_expert_only_volume_and_ranks(tmp_path):
    write_shards(tmp_path, [[5] * 10, [6] * 10], expert_all={3, 7, 12, 15})
    ids = lambda ds: {ds.episode_info(i)["id"] for i in range(ds.num_episodes)}  # noqa: E731
    full = ids(ShardedDataset(tmp_path))
    half = ids(ShardedDataset(tmp_path, fraction=0.5))
    tenth = ids(ShardedDataset(tmp_path, fraction=0.1))
    assert len(full) == 20 and len(half) == 10 and len(tenth) == 2
    assert tenth < half < full
    assert half == ids(ShardedDataset(tmp_path, fraction=0.5))  # deterministic
    assert half != ids(ShardedDataset(tmp_path, fraction=0.5, selection_seed=1))
    assert ids(ShardedDataset(tmp_path, expert_only=True)) == {3, 7, 12, 15}
    capped = ShardedDataset(tmp_path, max_steps=23)
    assert capped.num_steps >= 23 and capped.num_steps - capped.lengths[-1] < 23
    parts = [ids(ShardedDataset(tmp_path, rank=r, world_size=3)) for r in range(3)]
    assert set().union(*parts) == full and sum(map(len, parts)) == 20
    assert all(len(p) in (6, 7) for p in parts)
    with pytest.raises(ValueError, match="fraction"):
        ShardedDataset(tmp_path, fraction=0.0)
    with pytest.raises(ValueError, match="rank"):
        ShardedDataset(tmp_path, rank=3, world_size=3)
    with pytest.raises(ValueError, match="max_steps"):
        ShardedDataset(tmp_path, max_steps=10_000)


def test_runs_with_different_configs_combine_and_a_repeated_run_is_refused(tmp_path):
    """Two generation runs (e.g. fixed and randomised friction) train together: both number their
    episodes from 0, so identity is (run config, id); the same run named twice is an error."""
    a, b = tmp_path / "a", tmp_path / "b"
    for run, seed, n in ((a, 0, 3), (b, 1, 2)):
        run.mkdir()
        attrs = {**ATTRS, "config": json.dumps({"seed": seed})}
        with ShardWriter(run / shard_name(0), LAYOUT, attrs) as w:
            for i in range(n):
                w.append(make_episode(i, 4 + seed))
    both = ShardedDataset([a, b])
    assert both.num_episodes == 5 and both.num_steps == 3 * 4 + 2 * 5
    rows = sorted((len(both.episode(i)["action"]), both.episode_info(i)["id"]) for i in range(5))
    assert rows == [(4, 0), (4, 1), (4, 2), (5, 0), (5, 1)]
    halves = [ShardedDataset([a, b], rank=r, world_size=2) for r in range(2)]
    assert sum(h.num_episodes for h in halves) == 5
    with pytest.raises(DatasetError, match="repeat"):
        ShardedDataset([a, a])
    c = tmp_path / "c"
    c.mkdir()
    noisy = {**ATTRS, "config": json.dumps({"seed": 2, "robot": {"obs_noise": {"x": 0.1}}})}
    with ShardWriter(c / shard_name(0), LAYOUT, noisy) as w:
        w.append(make_episode(0, 4))
    with pytest.raises(DatasetError, match="observation noise"):
        ShardedDataset([a, c])


def test_resume_truncates_a_partial_episode(tmp_path):
    path = tmp_path / shard_name(0)
    with ShardWriter(path, LAYOUT, ATTRS) as w:
        for i in range(3):
            w.append(make_episode(i, 5))
    # a crash mid-episode: steps written, episode record missing
    with h5py.File(path, "r+") as f:
        for name in ("proprio", "reward", "images/top"):
            ds = f["steps/" + name]
            ds.resize(ds.shape[0] + 4, axis=0)
    # readers see only complete episodes (rows of a partial one are ignored)
    assert ShardedDataset(path).num_steps == 15
    with ShardWriter(path, LAYOUT, ATTRS, resume=True) as w:
        assert w.episode_ids == [0, 1, 2] and w.num_rows == 15
        w.append(make_episode(3, 6))
    ds = ShardedDataset(path)
    assert ds.num_steps == 21
    for i in range(4):
        assert np.all(ds.episode(i)["proprio"][:, 1] == ds.episode_info(i)["id"])
    assert sorted(ds.episode_info(i)["id"] for i in range(4)) == [0, 1, 2, 3]


def test_writer_refuses_to_overwrite_or_mix_configs(tmp_path):
    path = tmp_path / shard_name(0)
    with ShardWriter(path, LAYOUT, ATTRS) as w:
        w.append(make_episode(0, 4))
    with pytest.raises(FileExistsError, match="resume"):
        ShardWriter(path, LAYOUT, ATTRS)
    with pytest.raises(DatasetError, match="config"):
        ShardWriter(path, LAYOUT, {**ATTRS, "config": "{}"}, resume=True)
    other = StepLayout(proprio_terms=(("q", 2),), action_dim=3)
    with pytest.raises(DatasetError, match="layout"):
        ShardWriter(path, other, ATTRS, resume=True)
    with ShardWriter(path, LAYOUT, ATTRS, resume=True) as w:
        with pytest.raises(DatasetError, match="same length"):
            bad = make_episode(1, 4)
            bad.steps["reward"] = bad.steps["reward"][:3]
            w.append(bad)
        with pytest.raises(DatasetError, match="missing step arrays"):
            bad = make_episode(1, 4)
            del bad.steps["value"]
            w.append(bad)
    assert ShardedDataset(path).num_episodes == 1  # the rejected episodes left nothing behind


def test_bad_files_raise_clear_errors(tmp_path):
    write_shards(tmp_path, [[5, 5]])
    path = tmp_path / shard_name(0)
    good = path.read_bytes()

    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(DatasetError, match="schema_version"):
        ShardedDataset(path)

    path.write_bytes(good)
    with h5py.File(path, "r+") as f:
        del f["steps/value"]
    with pytest.raises(DatasetError, match="/steps/value"):
        ShardedDataset(path)

    path.write_bytes(good)
    with h5py.File(path, "r+") as f:
        del f["episodes/length"]
    with pytest.raises(DatasetError, match="/episodes/length"):
        ShardedDataset(path)

    path.write_bytes(good)
    with h5py.File(path, "r+") as f:
        f["steps/reward"].resize(3, axis=0)
    with pytest.raises(DatasetError, match="truncated or corrupt"):
        ShardedDataset(path)

    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(DatasetError, match="truncated"):
        ShardedDataset(path)

    path.write_bytes(good)
    holder = subprocess.Popen(  # another process writing the shard holds its lock
        [
            sys.executable,
            "-c",
            "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); "
            "print('open', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(DatasetError, match="locked by another process"):
            ShardedDataset(path)
        with pytest.raises(DatasetError, match="locked by another process"):
            ShardWriter(path, LAYOUT, ATTRS, resume=True)
    finally:
        holder.stdin.close()
        holder.wait()
    assert not list(tmp_path.glob("*.corrupt*"))  # a busy shard is never set aside

    path.write_bytes(b"not hdf5 at all")
    with pytest.raises(DatasetError, match="not a readable HDF5"):
        ShardedDataset(path)

    with pytest.raises(FileNotFoundError, match="no such shard"):
        ShardedDataset(tmp_path / "nope.h5")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no shard-"):
        ShardedDataset(tmp_path / "empty")


def test_shards_written_without_a_task_state_still_read(tmp_path):
    """Shards from before the task state was stored: no `state_terms` key, no /steps/state."""
    write_shards(tmp_path, [[6, 8]])
    with h5py.File(tmp_path / shard_name(0), "r+") as f:
        layout = json.loads(f.attrs["layout"])
        del layout["state_terms"]
        f.attrs["layout"] = json.dumps(layout)
        del f["steps/state"]
    ds = ShardedDataset(tmp_path)
    assert ds.layout.state_terms == () and ds.layout.state_dim == 0
    assert "state" not in ds.episode(0) and "state" not in WindowDataset(ds, 2, 2)[0]
