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

import argparse

from simdist_planner.data.dataset import ShardedDataset
from simdist_planner.evaluation.readout import (
    format_policy_readout,
    format_readout,
    policy_readout,
    state_readout,
)
from simdist_planner.model.checkpoint import load_checkpoint


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="simdist-readout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="world-model checkpoint directory")
    p.add_argument("--data", nargs="+", required=True, help="shards it was not trained on")
    p.add_argument("--windows", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)

    model = load_checkpoint(args.checkpoint, device=args.device)
    data = ShardedDataset(args.data)
    if model.state_head is not None:
        rows = state_readout(model, data, args.windows, args.seed)
        print(
            format_readout(
                rows,
                f"task state read from z ({args.checkpoint}), raw units, "
                f"up to {args.windows} held-out windows",
            )
        )
    print(
        format_policy_readout(
            policy_readout(model, data, args.windows, args.seed),
            f"pi's first action against the clean expert's ({args.checkpoint}), "
            f"RMS, raw units, up to {args.windows} held-out windows",
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
