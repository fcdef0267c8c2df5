"""Print the Go2 expert figures quoted in docs/go2_sim.md.

python benchmarks/go2_experts.py            # bar (10 x 20 s), ladder + critic, gaps, speed
python benchmarks/go2_experts.py --quick    # 2 seeds, shorter episodes
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from robot_drivers.experts.go2 import load_go2_critic, load_go2_ladder
from robot_drivers.tasks.go2_tasks import make_go2_task, rollout

GAP_CASES = (
    ("go2_slope", "sim", (0.1, 0.3, 0.5)),
    ("slippery_slope", "real", (0.1, 0.3, 0.5)),
    ("foam", "sim", (0.2, 0.7, 1.2)),
    ("foam", "real", (0.2, 0.7, 1.2)),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 10 s bar, fewer cases")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = range(2) if args.quick else range(10)
    ladder = load_go2_ladder(device=args.device)
    critic = load_go2_critic(device=args.device)

    task = make_go2_task(
        "go2_flat", "sim", command=(0.5, 0.0, 0.0), episode_s=10.0 if args.quick else 20.0
    )
    t0, steps, rows = time.perf_counter(), 0, []
    for s in seeds:
        out = rollout(task, ladder[0], s)
        steps += out.steps
        rows.append((out.last.info["fallen"], *out.mean_velocity, out.last.info["vel_rmse"]))
    wall = time.perf_counter() - t0
    rows = np.array(rows, float)
    print(
        f"bar go2_flat 0.5 m/s {len(rows)} seeds x {task.config.episode_s:.0f} s: "
        f"falls {int(rows[:, 0].sum())}/{len(rows)}, mean vx {rows[:, 1].mean():.3f}, "
        f"vy {rows[:, 2].mean():.3f}, tracking RMSE {rows[:, 3].mean():.3f} "
        f"(max {rows[:, 3].max():.3f}) m/s; {steps / wall:.0f} control steps/s with the expert"
    )

    t0 = time.perf_counter()
    for _ in range(500):
        task.backend.simulate()
    sim_rate = 500 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(200):
        task.backend.observe()
    obs_ms = (time.perf_counter() - t0) / 200 * 1e3
    print(
        f"speed: {sim_rate:.0f} control periods/s physics+PD only "
        f"({4 * sim_rate:.0f} physics steps/s), observe() {obs_ms:.2f} ms"
    )

    for policy in ladder:
        outs = [rollout(task, policy, s, value=critic) for s in seeds[:3]]
        print(
            f"ladder {policy.name}: falls {sum(o.last.info['fallen'] for o in outs)}/{len(outs)}, "
            f"vx {np.mean([o.mean_velocity[0] for o in outs]):.2f}, "
            f"RMSE {np.mean([o.last.info['vel_rmse'] for o in outs]):.3f}, "
            f"critic {np.mean(np.concatenate([o.values for o in outs])):.3f}"
        )

    for name, variant, speeds in GAP_CASES:
        for vx in speeds[:1] if args.quick else speeds:
            gap_task = make_go2_task(name, variant, command=(vx, 0.0, 0.0), episode_s=30.0)
            outs = [rollout(gap_task, ladder[0], s).last for s in seeds[:5]]
            print(
                f"gap {name}/{variant} {vx:.1f} m/s: success "
                f"{sum(o.success for o in outs)}/{len(outs)}, falls "
                f"{sum(o.info['fallen'] for o in outs)}, distance "
                f"{np.mean([o.info['distance'] for o in outs]):.2f} m"
            )


if __name__ == "__main__":
    main()
