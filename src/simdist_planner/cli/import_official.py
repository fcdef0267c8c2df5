"""Import the SimDist authors' pretrained Go2 world model (`simdist-import-official`).

    simdist-import-official --weights EXPORT/weights.npz --config EXPORT/model_config.yaml \\
        --out checkpoints/official_go2 [--verify EXPORT/reference_io.npz]

Writes a normal project checkpoint (model.safetensors, config.json, scaler.json, metrics.json)
that simdist-eval, the planner node (`checkpoint:=DIR`) and the adapter load like any other. The
export (weights.npz + model_config.yaml, with the release's LICENSE beside the weights) comes from
the official orbax checkpoint through scripts/export_official_orbax.py (docs/official_model.md).
A missing, extra, mis-shaped or non-finite array is refused by name and nothing is written.

--verify FILE.npz feeds the inputs of a file with the keys and layout of the export's
reference_io.npz (any batch size) through the imported model, prints the max absolute error of
each output, one a line, and exits 1 without writing when one is above its tolerance (1e-4;
1e-4 x the scaler std for the unscaled `inference/*` outputs).
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys

import numpy as np

from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.official import (
    METRICS_KEY,
    TOLERANCE,
    OfficialImportError,
    load_official,
    provenance,
    reference_errors,
)

PROG = "simdist-import-official"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--weights", required=True, help="the export's weights.npz")
    p.add_argument("--config", required=True, help="the export's model_config.yaml")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument(
        "--verify",
        default=None,
        help="check the model against a reference_io.npz-style file before writing",
    )
    p.add_argument(
        "--tolerance", type=float, default=TOLERANCE, help="max abs error allowed by --verify"
    )
    p.add_argument(
        "--license", default=None, help="the release's LICENSE (default: beside the weights)"
    )
    p.add_argument("--commit", default=None, help="official commit (default: known runs)")
    p.add_argument("--step", type=int, default=None, help="orbax step (default: known runs)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    weights = pathlib.Path(args.weights)
    license_file = weights.parent / "LICENSE" if args.license is None else args.license
    try:
        info = provenance(weights, args.config, license_file, args.commit, args.step)
        model = load_official(weights, args.config).build()
    except (OfficialImportError, OSError) as err:
        print(f"{PROG}: {err}; nothing written", file=sys.stderr)
        return 2
    if args.verify:
        try:
            with np.load(args.verify, allow_pickle=False) as z:
                ref = {k: z[k] for k in z.files}
            errors = reference_errors(model, ref, args.tolerance)
        except (ValueError, OSError) as err:
            print(f"{PROG}: --verify {args.verify}: {err}; nothing written", file=sys.stderr)
            return 2
        for e in errors:
            print(e.line())
        failed = [e.name for e in errors if not e.ok]
        if failed:
            print(f"{PROG}: above tolerance: {', '.join(failed)}; nothing written", file=sys.stderr)
            return 1
        info["reference_check"] = {
            "file": pathlib.Path(args.verify).name,
            "sha256": hashlib.sha256(pathlib.Path(args.verify).read_bytes()).hexdigest(),
            "tolerance": args.tolerance,
            "max_abs_error": {e.name: e.max_abs for e in errors},
        }
    path = save_checkpoint(model, args.out, metrics={METRICS_KEY: info})
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {path}: official {info['run_name']} (step {info['step']}), {n} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
