"""Fit the world model's scaler on the selection's first rows (or on synthetic windows)."""

from __future__ import annotations

import numpy as np

from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.synthetic import synthetic_windows
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.config import PretrainConfig
from simdist_planner.training.sampler import WindowSource, step_seed


def fit_scaler(model: WorldModel, cfg: PretrainConfig, source: WindowSource) -> None:
    """Fit on the selection's first `scaler_rows` rows (whole episodes in selection order, a
    random permutation; identical on every rank), or on synthetic windows. Images are not read."""
    if source.windows is None:
        w = synthetic_windows(model.config, 64, seed=step_seed(cfg.seed, 999), system_seed=cfg.seed)
        model.scaler.fit({k: w[k] for k in model.scaler.dims})
        return

    data = ShardedDataset(cfg.data.paths, **WindowSource.selection(cfg))
    columns = {
        "proprio": "proprio",
        "actions": "action",
        "rewards": "reward",
        "values": "value",
        "command": "command",
        "height_map": "height_map",
        "state": "state",
    }
    names = [columns[k] for k in model.scaler.dims]
    cols: dict[str, list] = {k: [] for k in model.scaler.dims}
    rows = 0
    for i in range(data.num_episodes):
        n = int(data.lengths[i])
        ep = data.read(i, 0, n, names)
        for k in cols:  # the last row carries no transition
            cols[k].append(
                ep[columns[k]][: n - 1] if k in ("actions", "rewards") else ep[columns[k]]
            )
        rows += n
        if rows >= cfg.data.scaler_rows:
            break
    model.scaler.fit({k: np.concatenate(v) for k, v in cols.items()})
