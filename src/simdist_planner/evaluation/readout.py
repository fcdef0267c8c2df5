"""How much of the privileged task state a pretrained latent holds, and how closely pi follows
the expert, on held-out data (`simdist-readout`).

    simdist-readout --checkpoint RUN/model --data HELD_OUT_SHARDS [--windows 512]

The state head (LossWeights.state, docs/world_model.md) reads the task state from z_t = E(o_t).
On windows it was not trained on, its error per state term says what the encoder sees; the
training loss averages that away. Each term is scored on all windows and on the quarter where
the term is largest (for the UR5e's `tcp_to_grasp`: the approach, where the peg must be found
in the images), beside the error of always predicting the mean (what a blind latent scores),
then again on the windows in each phase the task names.

pi is scored on windows whose first action is a clean expert action: its first action against the
expert's, per action dimension, overall and in each phase the task names (the UR5e peg's
"at_hole": the last centimetre), beside the error of always acting the mean. Ten seconds of this
tells a pi that follows the expert there from one that does not; fifty closed-loop episodes
that succeed a few times do not (measurements: docs/notebook/peg_wide.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.windows import WindowDataset, window_phases


@dataclass(frozen=True)
class TermReadout:
    phase: str  # "all", or a phase of the task
    term: str
    windows: int
    error: float  # mean Euclidean error of the head's estimate, raw units
    blind: float  # the same for the mean of these targets (a latent that holds nothing)
    error_large: float  # on the quarter of these windows where the term's norm is largest
    blind_large: float


def _phase_masks(win: WindowDataset, picks: np.ndarray) -> dict[str, np.ndarray]:
    """{"all": every pick, phase: the picks whose step t lies in it} for phases any pick is in."""
    masks = {
        "all": np.ones(len(picks), bool),
        **{k: v[picks] for k, v in window_phases(win).items()},
    }
    return {k: m for k, m in masks.items() if m.any()}


def _batches(win: WindowDataset, picks: np.ndarray, batch: int, device):
    """(window items, the observation at step t as a batch on `device`) per `batch` picks."""
    for start in range(0, len(picks), batch):
        items = [win[int(i)] for i in picks[start : start + batch]]
        yield (
            items,
            {
                k: torch.stack([it["obs"][k][win.H] for it in items]).to(device)
                for k in items[0]["obs"]
            },
        )


def state_readout(
    model, data: ShardedDataset, windows: int = 512, seed: int = 0, batch: int = 64
) -> list[TermReadout]:
    """Score the model's state head on `windows` windows of `data` drawn with `seed`: every term
    over all of them, then over those in each phase of the task."""
    if model.state_head is None:
        raise ValueError(
            f"the {model.config.robot} model has no state head (trained with loss.state 0)"
        )
    terms = data.layout.state_terms
    if data.layout.state_dim != model.config.state_dim:
        raise ValueError(
            f"the data's task state has {data.layout.state_dim} values "
            f"({terms or 'none'}), the model's head {model.config.state_dim}"
        )
    win = WindowDataset(data, model.config.history, model.config.horizon)
    picks = np.random.default_rng(seed).choice(len(win), min(windows, len(win)), replace=False)
    device = next(model.parameters()).device
    estimates, targets = [], []
    model.eval()
    with torch.no_grad():
        for items, obs in _batches(win, picks, batch, device):
            estimates.append(model.state(model.encode(obs)).cpu())
            targets.append(torch.stack([it["state"] for it in items]))
    est, tgt = torch.cat(estimates).double(), torch.cat(targets).double()
    out = []
    for phase, m in _phase_masks(win, picks).items():
        for name, cols in data.layout.state_slices().items():
            e, t = est[m, cols], tgt[m, cols]
            err, blind = (e - t).norm(dim=1), (t - t.mean(0)).norm(dim=1)
            large = t.norm(dim=1) >= t.norm(dim=1).quantile(0.75)
            out.append(
                TermReadout(
                    phase,
                    name,
                    int(m.sum()),
                    float(err.mean()),
                    float(blind.mean()),
                    float(err[large].mean()),
                    float(blind[large].mean()),
                )
            )
    return out


@dataclass(frozen=True)
class ActionReadout:
    phase: str  # "all", or a phase of the task
    windows: int
    error: tuple[
        float, ...
    ]  # RMS of pi's first action minus the expert's, per action dim, raw units
    blind: tuple[float, ...]  # the same for always acting the mean expert action of these windows


def policy_readout(
    model, data: ShardedDataset, windows: int = 512, seed: int = 0, batch: int = 64
) -> list[ActionReadout]:
    """Score pi's first action on up to `windows` windows of `data` (drawn with `seed`) whose
    first action is a clean expert action: overall, then per task phase that holds any."""
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    h = model.config.history
    win = WindowDataset(data, h, model.config.horizon)
    flags = [
        data.read(i, 0, int(n), names=("expert",))["expert"] for i, n in enumerate(data.lengths)
    ]
    clean = np.nonzero([flags[e][t] == 1 for e, t in zip(win.episode_index, win.t_index)])[0]
    if not len(clean):
        raise ValueError(
            "no window of the data starts with a clean expert action: nothing to compare pi with"
        )
    picks = np.sort(
        np.random.default_rng(seed).choice(clean, min(windows, len(clean)), replace=False)
    )
    device = next(model.parameters()).device
    chosen, expert = [], []
    model.eval()
    with torch.no_grad():
        for items, obs in _batches(win, picks, batch, device):
            history = model.encode_history(
                torch.stack([it["obs"]["proprio"][:h] for it in items]).to(device),
                torch.stack([it["actions"][:h] for it in items]).to(device),
            )
            chosen.append(
                model.policy(model.encode(obs), history, obs.get("command"), obs["proprio"])[
                    :, 0
                ].cpu()
            )
            expert.append(torch.stack([it["actions"][h] for it in items]))
    pi, ex = torch.cat(chosen).double(), torch.cat(expert).double()
    rows = []
    for phase, m in _phase_masks(win, picks).items():
        e, p = ex[torch.from_numpy(m)], pi[torch.from_numpy(m)]
        rms = lambda d: tuple(float(x) for x in d.pow(2).mean(0).sqrt())  # noqa: E731
        rows.append(ActionReadout(phase, int(m.sum()), rms(p - e), rms(e - e.mean(0))))
    return rows


def format_policy_readout(rows: list[ActionReadout], title: str) -> str:
    dims = len(rows[0].error)
    header = f"{'phase':10} {'windows':>7} " + " ".join(
        f"{f'a{k} error / blind':>19}" for k in range(dims)
    )
    lines = [title, header, "-" * len(header)]
    lines += [
        f"{r.phase:10} {r.windows:7d} "
        + " ".join(f"{e:9.4f} / {b:7.4f}" for e, b in zip(r.error, r.blind))
        for r in rows
    ]
    return "\n".join(lines)


def format_readout(rows: list[TermReadout], title: str) -> str:
    header = (
        f"{'phase':10} {'windows':>7} {'term':18} {'error':>9} {'blind':>9} {'error(top 25%)':>15} "
        f"{'blind(top 25%)':>15}"
    )
    lines = [title, header, "-" * len(header)]
    lines += [
        f"{r.phase:10} {r.windows:7d} {r.term:18} {r.error:9.4f} {r.blind:9.4f} "
        f"{r.error_large:15.4f} {r.blind_large:15.4f}"
        for r in rows
    ]
    return "\n".join(lines)
