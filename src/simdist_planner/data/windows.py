"""Training windows over a ShardedDataset (`WindowDataset`, the "Model inputs" format of
docs/architecture.md) and the task phases of each window (`window_phases`)."""

from __future__ import annotations

import numpy as np
import torch

from robot_drivers.registry import step_phases
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.schema import DatasetError


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
