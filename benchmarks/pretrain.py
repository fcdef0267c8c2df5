"""Throughput of one Eq. 2 pretraining step (forward, backward, Adam) at the presets' sizes, on
synthetic windows so no dataset is needed, with the dropout layers as in training.

    python benchmarks/pretrain.py [--device cuda] [--threads 2] [--steps 10]
                                  [--models go2,ur5e_small]
    python benchmarks/pretrain.py --data SHARD_DIR [--preset ur5e_peg]    # + the loader's batch

Prints steps/s and windows/s per model and batch; `--no-dropout` gives the same step with every
dropout probability 0, the bound that the cost of drawing the masks is measured against.
`--data` also times what a loader worker does per step on real shards (read the windows of one
batch, augment them), once per preload mode: on two cores that work competes with the step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from robot_drivers.tasks.ur5e_tasks import STATE_TERMS
from simdist_planner.data.synthetic import synthetic_windows
from simdist_planner.model.config import CONFIG_FACTORIES
from simdist_planner.model.losses import world_model_loss
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.config import PRETRAIN_PRESETS, PretrainConfig
from simdist_planner.training.sampler import AugmentedWindows, WindowSource

PRESET_OF_MODEL = {preset["model"]: name for name, preset in PRETRAIN_PRESETS.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    model_name: str, batch: int, steps: int, device: torch.device, dropout: bool
) -> list[float]:
    """Seconds per training step (2 warm-up steps first)."""
    overrides = {} if dropout else {"dropout_mlp": 0.0, "dropout_attention": 0.0}
    config = CONFIG_FACTORIES[model_name](**overrides)
    if (
        config.loss.state > 0 and not config.state_dim
    ):  # pretraining sizes it from the shards' task state
        config = config.replace(state_dim=sum(dim for _, dim in STATE_TERMS))
    model = WorldModel(config).to(device).train()
    window = {k: v.to(device) for k, v in synthetic_windows(config, batch, seed=0).items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-4)
    bf16 = device.type == "cuda"
    times = []
    for i in range(steps + 2):
        _sync(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            terms = world_model_loss(model, window)
        optimizer.zero_grad(set_to_none=True)
        terms.total.backward()
        optimizer.step()
        _sync(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    if not torch.isfinite(terms.total):
        raise FloatingPointError(f"{model_name}: loss {terms.total.item()}")
    return times


def time_loader(data: str, preset: str, preload: str, batches: int) -> list[float]:
    """Seconds per batch of the loader's work (read + augment), after a batch that fills caches."""
    flat = {**PRETRAIN_PRESETS[preset], "data": (data,), "preload": preload}
    cfg = PretrainConfig.from_flat(flat)
    batches_of = AugmentedWindows(WindowSource(cfg, rank=0, world_size=1))
    batches_of[0]
    times = []
    for step in range(1, batches + 1):
        start = time.perf_counter()
        batches_of[step]
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch CPU threads (the go2 preset uses 2)"
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", default="go2,ur5e_small")
    parser.add_argument(
        "--batch", type=int, default=None, help="default: each model's preset batch"
    )
    parser.add_argument(
        "--no-dropout", action="store_true", help="also time the step without dropout"
    )
    parser.add_argument(
        "--data", default=None, help="shard directory: also time the loader's batches"
    )
    parser.add_argument("--preset", default="ur5e_peg", choices=sorted(PRETRAIN_PRESETS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"pretraining step (fwd + bwd + Adam), device {device}, {args.threads} CPU thread(s), "
        f"{args.steps} steps (median / min)"
    )
    print(
        f"{'model':12} {'batch':>5} {'dropout':>8} {'ms/step':>17} {'steps/s':>8} {'windows/s':>10}"
    )
    for name in args.models.split(","):
        preset = PRETRAIN_PRESETS.get(PRESET_OF_MODEL.get(name, ""), {})
        batch = args.batch or preset.get("batch_size", 32)
        for with_dropout in (True, False) if args.no_dropout else (True,):
            ts = time_steps(name, batch, args.steps, device, with_dropout)
            med = statistics.median(ts)
            print(
                f"{name:12} {batch:5d} {'on' if with_dropout else 'off':>8} "
                f"{med * 1e3:8.1f} / {min(ts) * 1e3:6.1f} {1 / med:8.2f} {batch / med:10.0f}",
                flush=True,
            )
    if args.data:
        print(f"loader batch (read + augment, 1 thread) of preset {args.preset} on {args.data}:")
        torch.set_num_threads(1)  # as in a loader worker
        for preload in ("vectors", "all"):
            ts = time_loader(args.data, args.preset, preload, args.steps)
            print(
                f"  preload {preload:8} {statistics.median(ts) * 1e3:8.1f} / "
                f"{min(ts) * 1e3:6.1f} ms per batch",
                flush=True,
            )


if __name__ == "__main__":
    main()
