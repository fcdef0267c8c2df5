"""Forward latency of the dynamics f for a batch of candidate action sequences (MPPI's workload):
chunked (one pass for all T steps) versus autoregressive (one pass per step), Go2 and UR5e, each
plain and with the cross-attention keys / values of the shared context cached
(`WorldModel.dynamics_context`, built once per planner step, as `MPPIPlanner` does).

Ends with one line per robot, `ratio chunked/autoregressive: N` (cached medians): how many
times longer one autoregressive f call takes than one chunked call at the same batch.

    python benchmarks/world_model.py [--device cuda] [--batch 472] [--repeats 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from simdist_planner.model.config import go2_config, ur5e_config
from simdist_planner.model.world_model import WorldModel


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_dynamics(config, batch: int, repeats: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds per call of model.dynamics on `batch` candidates sharing one full history, plain
    ("plain") and with the batch-1 context cache built beforehand ("cached")."""
    model = WorldModel(config).to(device).eval()
    g = torch.Generator(device="cpu").manual_seed(0)
    d, h, t, a = config.latent_dim, config.history, config.horizon, config.action_dim
    z1 = torch.randn(1, d, generator=g).to(device)
    history1 = torch.randn(1, 2 * h, d, generator=g).to(device)
    z, history = z1.expand(batch, -1), history1.expand(batch, -1, -1)
    actions = torch.randn(batch, t, a, generator=g).to(device)
    times: dict[str, list[float]] = {"plain": [], "cached": []}
    with torch.inference_mode():
        context = model.dynamics_context(z1, history1)
        for mode, ctx in (("plain", None), ("cached", context)):
            for i in range(repeats + 3):  # 3 warm-up calls
                _sync(device)
                start = time.perf_counter()
                out = model.dynamics(z, actions, history, context=ctx)
                _sync(device)
                if i >= 3:
                    times[mode].append(time.perf_counter() - start)
            assert out.shape == (batch, t, d) and torch.isfinite(out).all()
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--batch", type=int, default=472, help="candidates (official Go2: 450 + 22)"
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"dynamics f forward latency, batch {args.batch}, device {device}, "
        f"{args.threads} CPU thread(s), {args.repeats} repeats (median / min, ms)"
    )
    print(f"{'robot':6} {'H':>3} {'T':>3} {'f':14} {'plain':>17} {'cached':>17} {'speed-up':>9}")
    ratios = {}
    for name, make in (("go2", go2_config), ("ur5e", ur5e_config)):
        cached = {}
        for kind in ("chunked", "autoregressive"):
            cfg = make(dynamics_kind=kind)
            times = time_dynamics(cfg, args.batch, args.repeats, device)
            row = {mode: (statistics.median(ts) * 1e3, min(ts) * 1e3) for mode, ts in times.items()}
            fmt = lambda m: f"{m[0]:8.2f} / {m[1]:6.2f}"  # noqa: E731
            print(
                f"{name:6} {cfg.history:3d} {cfg.horizon:3d} {kind:14} {fmt(row['plain']):>17} "
                f"{fmt(row['cached']):>17} {row['plain'][0] / row['cached'][0]:8.2f}x",
                flush=True,
            )
            cached[kind] = row["cached"][0]
        ratios[name] = cached["autoregressive"] / cached["chunked"]
    for name, ratio in ratios.items():
        print(f"{name}: ratio chunked/autoregressive: {ratio:.2f}")


if __name__ == "__main__":
    main()
