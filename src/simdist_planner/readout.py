"""How much of the privileged task state a pretrained latent holds (`simdist-readout`).

    simdist-readout --checkpoint RUN/model --data HELD_OUT_SHARDS [--windows 512]

The state head (LossWeights.state, docs/world_model.md) reads the task state from z_t = E(o_t).
On windows it was not trained on, its error per state term says what the encoder sees; the
training loss averages that away. Each term is scored on all windows and on the quarter where
the term is largest (for the UR5e's `tcp_to_grasp`: the approach, where the peg must be found
in the images), beside the error of always predicting the mean (what a blind latent scores).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch

from simdist_planner.dataset import ShardedDataset, WindowDataset


@dataclass(frozen=True)
class TermReadout:
    term: str
    error: float  # mean Euclidean error of the head's estimate, raw units, all windows
    blind: float  # the same for the mean of the targets (a latent that holds nothing)
    error_large: float  # on the quarter of windows where the term's norm is largest
    blind_large: float


def state_readout(model, data: ShardedDataset, windows: int = 512, seed: int = 0,
                  batch: int = 64) -> list[TermReadout]:
    """Score the model's state head on `windows` windows of `data` drawn with `seed`."""
    if model.state_head is None:
        raise ValueError(f"the {model.config.robot} model has no state head (trained with loss.state 0)")
    terms = data.layout.state_terms
    if data.layout.state_dim != model.config.state_dim:
        raise ValueError(f"the data's task state has {data.layout.state_dim} values "
                         f"({terms or 'none'}), the model's head {model.config.state_dim}")
    win = WindowDataset(data, model.config.history, model.config.horizon)
    picks = np.random.default_rng(seed).choice(len(win), min(windows, len(win)), replace=False)
    h, device = model.config.history, next(model.parameters()).device
    estimates, targets = [], []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(picks), batch):
            items = [win[int(i)] for i in picks[start:start + batch]]
            obs = {k: torch.stack([it["obs"][k][h] for it in items]).to(device) for k in items[0]["obs"]}
            estimates.append(model.state(model.encode(obs)).cpu())
            targets.append(torch.stack([it["state"] for it in items]))
    est, tgt = torch.cat(estimates).double(), torch.cat(targets).double()
    out, col = [], 0
    for name, dim in terms:
        e, t = est[:, col:col + dim], tgt[:, col:col + dim]
        col += dim
        err, blind = (e - t).norm(dim=1), (t - t.mean(0)).norm(dim=1)
        large = t.norm(dim=1) >= t.norm(dim=1).quantile(0.75)
        out.append(TermReadout(name, float(err.mean()), float(blind.mean()),
                               float(err[large].mean()), float(blind[large].mean())))
    return out


def format_readout(rows: list[TermReadout], title: str) -> str:
    header = f"{'term':18} {'error':>9} {'blind':>9} {'error(top 25%)':>15} {'blind(top 25%)':>15}"
    lines = [title, header, "-" * len(header)]
    lines += [f"{r.term:18} {r.error:9.4f} {r.blind:9.4f} {r.error_large:15.4f} {r.blind_large:15.4f}"
              for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="simdist-readout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="world-model checkpoint directory")
    p.add_argument("--data", nargs="+", required=True, help="shards it was not trained on")
    p.add_argument("--windows", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    from simdist_planner.checkpoint import load_checkpoint

    model = load_checkpoint(args.checkpoint, device=args.device)
    rows = state_readout(model, ShardedDataset(args.data), args.windows, args.seed)
    print(format_readout(rows, f"task state read from z ({args.checkpoint}), raw units, "
                               f"up to {args.windows} held-out windows"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
