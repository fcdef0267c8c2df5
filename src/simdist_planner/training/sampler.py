"""Training windows: which windows each rank draws per step (uniform or phase-weighted),
seeded by (seed, rank, step) so a resumed run draws exactly what the interrupted one would have."""

from __future__ import annotations

import numpy as np
import torch

from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.synthetic import synthetic_windows
from simdist_planner.data.windows import WindowDataset, window_phases
from simdist_planner.training.augment import augment
from simdist_planner.training.config import PretrainConfig, model_config_for


def step_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


class WindowSource(torch.utils.data.Dataset):
    """Item `step` = this rank's batch of windows for that step (indices seeded by the step)."""

    def __init__(self, cfg: PretrainConfig, rank: int, world_size: int):
        self.cfg, self.rank = cfg, rank
        self.windows = None
        self.cum_weights = None  # cumulative window weights with data.phase_weights
        if not cfg.data.synthetic:
            data = ShardedDataset(
                cfg.data.paths,
                **self.selection(cfg),
                rank=rank,
                world_size=world_size,
                preload=cfg.data.preload,
            )
            self.model_config = model_config_for(cfg, data.layout)
            self.windows = WindowDataset(data, self.model_config.history, self.model_config.horizon)
            self.obs_noise = data.obs_noise_std()
            if cfg.data.phase_weights:
                weights, inside = window_weights(self.windows, cfg.data.phase_weights)
                self.cum_weights = np.cumsum(weights)
                share = weights[inside].sum() / weights.sum()
                self.weighting = (
                    f"{int(inside.sum())} of {len(weights)} windows in the phases "
                    f"{cfg.data.phase_weights}, {share:.1%} of draws"
                )
        else:
            self.model_config = model_config_for(cfg)
            self.obs_noise = {
                "proprio": np.full(self.model_config.proprio_dim, 0.01, np.float32),
                "height_map": 0.01,
            }

    @staticmethod
    def selection(cfg: PretrainConfig) -> dict:
        """The ShardedDataset selection arguments of the run's data settings."""
        return dict(
            fraction=cfg.data.fraction,
            expert_only=cfg.data.expert_only,
            max_steps=cfg.data.max_data_steps or None,
            selection_seed=cfg.data.selection_seed,
        )

    def __len__(self) -> int:
        return self.cfg.steps

    def __getitem__(self, step: int) -> dict:
        b = self.cfg.batch_size
        if self.windows is None:
            return synthetic_windows(
                self.model_config,
                b,
                seed=step_seed(self.cfg.seed, self.rank, step),
                system_seed=self.cfg.seed,
            )
        picks = self.draw(np.random.default_rng(step_seed(self.cfg.seed, self.rank, step, 0)), b)
        items = [self.windows[int(i)] for i in picks]
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0] if k != "obs"}
        batch.update({k: torch.stack([it["obs"][k] for it in items]) for k in items[0]["obs"]})
        return batch

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n window indices, uniform or by the phase weights."""
        if self.windows is None:
            raise ValueError("no data windows to draw from: this source makes synthetic batches")
        if self.cum_weights is None:
            return rng.integers(0, len(self.windows), n)
        return np.searchsorted(self.cum_weights, rng.random(n) * self.cum_weights[-1], side="right")

    def proprio_noise(self) -> torch.Tensor:
        """Per-dimension noise std of the proprio vector (ShardedDataset.obs_noise_std)."""
        return torch.as_tensor(self.obs_noise["proprio"], dtype=torch.float32)


def window_weights(windows, phase_weights: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """(len(windows),) sampling weight of each window: the largest weight among the phases its
    step t lies in (dataset.window_phases), 1 outside them; and the (len(windows),) mask of the
    windows inside a weighted phase."""

    phases = window_phases(windows)
    unknown = set(phase_weights) - set(phases)
    if unknown:
        raise ValueError(
            f"phase_weights names {sorted(unknown)}, but task "
            f"{str(windows.dataset.attrs.get('task', ''))!r} defines "
            f"the phases {sorted(phases) or 'none'}"
        )
    weights = np.zeros(len(windows))  # 0 = in no weighted phase
    empty = []
    for phase, weight in phase_weights.items():
        inside = phases[phase]
        weights[inside] = np.maximum(weights[inside], weight)
        if not inside.any():
            empty.append(phase)
    if empty:
        raise ValueError(
            f"no window of the selection lies in the phases {empty}: nothing to weight"
        )
    inside = weights > 0
    return np.where(inside, weights, 1.0), inside


class AugmentedWindows(torch.utils.data.Dataset):
    """The loader's view of a WindowSource: item `step` = that step's batch with its observation
    augmentation, done in the loader workers (off the training loop's critical path) and seeded
    by the step like the batch itself."""

    def __init__(self, source: WindowSource):
        self.source = source
        self.proprio_noise = source.proprio_noise()
        self.hm_noise = float(source.obs_noise["height_map"])

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, step: int) -> dict:
        src = self.source
        batch = src[step]
        aug = src.cfg.augmentation
        if aug.enabled:
            g = torch.Generator().manual_seed(step_seed(src.cfg.seed, src.rank, step, 1))
            batch = augment(batch, aug, self.proprio_noise, self.hm_noise, src.model_config, g)
        return batch
