"""Export the official SimDist orbax checkpoint of a world model to plain NumPy arrays.

    python scripts/export_official_orbax.py \\
        --checkpoint SIMDIST/checkpoints/models/go2_2026-02-12 --step 367004 \\
        --license SIMDIST/LICENSE --commit 8985ca1 --out EXPORT

SIMDIST is a checkout of the official release (github.com/CLeARoboticsLab/simdist, MIT licence)
installed with its own requirements: the export restores the checkpoint with the official code
(`simdist.utils.model.load_model_from_ckpt`), so it needs jax, flax and orbax. They are not
dependencies of this project; run the script in the official code's environment (numpy is all
it needs besides). The project itself reads only what the script writes:

    EXPORT/weights.npz        every array of the flax model state (`nnx.state(model)`), keyed by
                              its path joined with "/" (list indices as numbers), e.g.
                              `dynamics/layers/0/attention_2/query/kernel`; the trained scaler
                              statistics are part of the state (`scaler/scaler_params/...`), the
                              dropout RNG counters `*/rngs/*/count` too (not weights); PRNG keys
                              are left out
    EXPORT/param_index.txt    key, shape and dtype of each array, tab-separated, sorted by key
    EXPORT/model_config.yaml  the checkpoint's official model config, copied
    EXPORT/LICENSE            the release's MIT licence, copied (the importer records it)
    EXPORT/provenance.json    release, commit, run name and step

Then `simdist-import-official --weights EXPORT/weights.npz --config EXPORT/model_config.yaml
--out DIR` turns the export into a project checkpoint (docs/official_model.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
from collections.abc import Mapping

import numpy as np

RELEASE = "github.com/CLeARoboticsLab/simdist"


# ---------------------------------------- the key mapping (pure: tests/test_official_model.py)
def export_key(path) -> str:
    """The export's key of one state leaf: its path components joined with "/"."""
    return "/".join(str(part) for part in path)


def flatten_state(tree: Mapping, prefix: tuple = ()) -> dict[str, np.ndarray]:
    """A nested state dict (`nnx.State.to_pure_dict()`: str / int keys, array leaves) -> the
    export's flat {key: array}, sorted by key. None leaves (left-out PRNG keys) are dropped."""
    flat = {}
    for name, value in tree.items():
        path = (*prefix, name)
        if isinstance(value, Mapping):
            flat.update(flatten_state(value, path))
        elif value is not None:
            key = export_key(path)
            if key in flat:
                raise ValueError(f"two state leaves map to the key {key!r}")
            flat[key] = np.asarray(value)
    return dict(sorted(flat.items()))


def param_index(arrays: Mapping[str, np.ndarray]) -> str:
    """param_index.txt: `key<TAB>shape<TAB>dtype`, one array a line, sorted by key."""
    lines = [f"{k}\t{tuple(np.shape(a))}\t{np.asarray(a).dtype}" for k, a in sorted(arrays.items())]
    return "\n".join(lines) + "\n"


def write_export(
    arrays: Mapping[str, np.ndarray],
    config_yaml,
    license_file,
    out,
    provenance: Mapping,
) -> pathlib.Path:
    """Write weights.npz, param_index.txt, model_config.yaml, LICENSE and provenance.json."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    arrays = dict(sorted(arrays.items()))
    np.savez(out / "weights.npz", **arrays)
    (out / "param_index.txt").write_text(param_index(arrays))
    shutil.copyfile(config_yaml, out / "model_config.yaml")
    shutil.copyfile(license_file, out / "LICENSE")
    (out / "provenance.json").write_text(json.dumps(dict(provenance), indent=1) + "\n")
    return out


# ------------------------------------------------------------ restoring (the official code)
def restore_state(checkpoint_dir, step: int | None):
    """(nested numpy state, step) of the official checkpoint, restored by the official code."""
    import jax  # noqa: PLC0415 - optional: only the official code's environment has jax
    from flax import nnx  # noqa: PLC0415 - optional: only the official code's environment has it
    from simdist.utils.model import (  # noqa: PLC0415 - optional: the official release's code
        load_model_from_ckpt,
    )

    model, _, step = load_model_from_ckpt(str(checkpoint_dir), step)

    def to_numpy(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return None  # PRNG keys are no weights and numpy cannot hold them
        return np.asarray(jax.device_get(x))

    return jax.tree.map(to_numpy, nnx.state(model).to_pure_dict()), int(step)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="official checkpoints/models/<run> folder")
    p.add_argument("--step", type=int, default=None, help="orbax step (default: the latest)")
    p.add_argument("--license", required=True, help="the official release's LICENSE file")
    p.add_argument("--commit", default="unknown", help="the official release's commit")
    p.add_argument("--out", required=True, help="export folder to write")
    args = p.parse_args(argv)
    checkpoint = pathlib.Path(args.checkpoint)
    state, step = restore_state(checkpoint, args.step)
    arrays = flatten_state(state)
    info = {"release": RELEASE, "commit": args.commit, "run_name": checkpoint.name, "step": step}
    out = write_export(arrays, checkpoint / "model_config.yaml", args.license, args.out, info)
    print(f"wrote {len(arrays)} arrays of {checkpoint.name} step {step} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
