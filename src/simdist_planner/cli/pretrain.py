"""simdist-pretrain: pretrain a world model, then (when configured) select its best checkpoint.


    simdist-pretrain --preset ur5e_peg --data runs/data/peg --out runs/pretrain/peg
    torchrun --nproc_per_node 4 -m simdist_planner.cli.pretrain --preset go2 --data D --out O \
        --device cuda

One process, or one per rank under torchrun (DDP: gloo on CPU, nccl on CUDA; rank r reads every
world_size-th episode of the selection). Official optimiser: Adam, lr linear warm-up to 2e-4 then
cosine to 1e-4. Observation augmentation on the model inputs (o_{t-H..t}): per-term Gaussian noise
with the stds stored in the dataset, and for cameras brightness / contrast / shift per window.

Run directory:
    pretrain.json              the PretrainConfig (a resumed run must match it)
    train_state/               model checkpoint + optimizer.safetensors + state.json (exact resume)
    checkpoints/step-NNNNNNN/  periodic world-model checkpoints (the last few are kept)
    model/                     the final world-model checkpoint (the selected one with a selection)
    tb/                        TensorBoard scalars: every loss term, lr, windows/s

Exact resume: every random draw of step s (window indices, augmentation noise, dropout) comes
from generators seeded by (seed, rank, s), and the learning rate is a function of s, so the
optimizer moments and the step counter are the whole training state.

Every setting is a flag named after its PretrainConfig field (training/config.py, FLAT_FIELDS:
--learning-rate, --image-shift, --encoder-steps, ...); a flag given overrides the preset's value.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch.distributed as dist

from simdist_planner.evaluation.checkpoint_selection import check_fits, select_checkpoint
from simdist_planner.training.config import (
    FLAT_FIELDS,
    PRETRAIN_PRESETS,
    AugmentationConfig,
    CheckpointSelection,
    DataConfig,
    EncoderStage,
    OptimiserConfig,
    PretrainConfig,
)
from simdist_planner.training.loop import pretrain

# The dataclass that holds each group of FLAT_FIELDS (None: PretrainConfig itself).
_GROUPS = {
    None: PretrainConfig,
    "data": DataConfig,
    "optimiser": OptimiserConfig,
    "augmentation": AugmentationConfig,
    "encoder_stage": EncoderStage,
}
# Settings given as JSON (objects) or by their own argument rather than a generated flag.
_JSON_OR_OWN = (
    "data",
    "model_overrides",
    "phase_weights",
    "encoder_near_field",
    "state_near_field",
    "checkpoint_selection",
)


def _flag_type(name: str) -> str:
    group, leaf = FLAT_FIELDS[name]
    (field,) = (f for f in dataclasses.fields(_GROUPS[group]) if f.name == leaf)
    return str(field.type)


def parse_args(argv=None) -> tuple[PretrainConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="simdist-pretrain",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--preset", choices=sorted(PRETRAIN_PRESETS), help="small CPU defaults per robot"
    )
    parser.add_argument(
        "--out", required=True, help="run directory (resumed when it holds a train state)"
    )
    parser.add_argument("--data", nargs="*", default=None, help="shard files or directories")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-progress", action="store_true")
    for name in FLAT_FIELDS:
        if name in _JSON_OR_OWN:
            continue
        flag = "--" + name.replace("_", "-")
        ftype = _flag_type(name)
        if ftype == "bool":
            parser.add_argument(
                flag,
                type=lambda s: s.lower() in ("1", "true", "yes"),
                default=None,
                metavar="true|false",
            )
        elif str(ftype) == "tuple[str, ...]":
            parser.add_argument(flag, nargs="*", default=None)
        else:
            conv = {"int": int, "float": float, "str": str}[str(ftype)]
            parser.add_argument(flag, type=conv, default=None)
    parser.add_argument(
        "--model-overrides",
        type=json.loads,
        default=None,
        help='JSON merged into the model config, e.g. \'{"head_kind": "mlp"}\'',
    )
    parser.add_argument(
        "--phase-weights",
        type=json.loads,
        default=None,
        help="JSON {phase: weight} of the task's step phases, e.g. '{\"closing\": 10}'",
    )
    parser.add_argument(
        "--encoder-near-field",
        type=json.loads,
        default=None,
        help="JSON {state term: scale} for the encoder stage, e.g. '{\"bottom_to_hole\": 0.005}'",
    )
    parser.add_argument(
        "--state-near-field",
        type=json.loads,
        default=None,
        help="JSON {state term: scale} for the state loss on z, as --encoder-near-field",
    )
    parser.add_argument(
        "--checkpoint-selection",
        type=json.loads,
        default=argparse.SUPPRESS,
        help='JSON CheckpointSelection fields over the preset\'s, e.g. \'{"task": "peg", '
        '"region": "wide", "workers": 2}\'; null = the last step is the model',
    )
    args = parser.parse_args(argv)
    values = dict(PRETRAIN_PRESETS[args.preset]) if args.preset else {}
    for name in FLAT_FIELDS:
        v = getattr(args, name, None)
        if v is not None and name != "checkpoint_selection":
            values[name] = tuple(v) if isinstance(v, list) else v
    try:
        if "checkpoint_selection" in vars(args):  # null clears the preset's; an object amends it
            given, base = args.checkpoint_selection, values.get("checkpoint_selection")
            values["checkpoint_selection"] = (
                None
                if given is None
                else (
                    dataclasses.replace(base, **given)
                    if isinstance(base, CheckpointSelection)  # a preset's (else None)
                    else CheckpointSelection(**given)
                )
            )
        return PretrainConfig.from_flat(values), args
    except (TypeError, ValueError) as err:
        parser.error(str(err))


def main(argv=None) -> None:
    cfg, args = parse_args(argv)
    selection = cfg.checkpoint_selection
    final = pretrain(
        cfg,
        args.out,
        device=args.device,
        progress=not args.no_progress,
        check_model=None if selection is None else lambda m: check_fits(selection, m),
    )
    if int(os.environ.get("RANK", "0")) == 0:
        metrics = json.loads((final / "metrics.json").read_text())
        if selection is not None and not metrics["stopped_at_time_limit"]:
            select_checkpoint(args.out, selection, args.device)
        loss = metrics.get("loss/total", float("nan"))
        print(
            f"pretrain: wrote {final} (step {metrics['step']}, loss {loss:.4f}, "
            f"{metrics['seconds_this_run']:.0f} s this run)"
        )
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
