"""simdist-readout: how much of the privileged task state a pretrained latent holds, and how
closely pi follows the expert, on held-out data.

    simdist-readout --checkpoint RUN/model --data HELD_OUT_SHARDS [--windows 512]

The method and its outputs: `simdist_planner.evaluation.readout`.
"""

from __future__ import annotations

import argparse

from simdist_planner.data.reader import ShardedDataset
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
