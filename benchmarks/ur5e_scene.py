"""Print the UR5e simulation's speed and tracking figures (docs/ur5e_sim.md quotes them).

    python benchmarks/ur5e_scene.py [--value]

Physics steps/s, 5 Hz control steps/s and end-of-period tracking error per IK rate, control
steps/s with three cameras rendered at 64x64 and 224x224 (defaults vs full meshes and MSAA), and
with --value the V^e held-out error of both tasks.
"""

from __future__ import annotations

import argparse
import os
import time

import mujoco  # noqa: E402  (after the GL default above)
import numpy as np

from robot_drivers.interface import Command, CommandKind
from robot_drivers.registry import expert_value, make_task
from robot_drivers.ur5e.backend import MujocoUR5eBackend
from robot_drivers.ur5e.config import ControllerConfig, SceneConfig


def _tracking(ik_hz: float, steps: int, feedforward: bool = True) -> tuple[float, float, float]:
    """Random steps up to 1.5 cm / 0.1 rad: (mean mm, mean deg, control steps/s)."""
    b = MujocoUR5eBackend(
        SceneConfig(cameras=()), ControllerConfig(ik_hz=ik_hz, feedforward=feedforward)
    )
    b.reset(0)
    rng = np.random.default_rng(0)
    errs = []
    t0 = time.perf_counter()
    for _ in range(steps):
        a = np.r_[rng.uniform(-0.015, 0.015, 3), rng.uniform(-0.1, 0.1, 3), 0.0]
        b.act(Command(CommandKind.EE_DELTA, a))
        b.step()
        errs.append(b.tracking_error())
    rate = steps / (time.perf_counter() - t0)
    e = np.asarray(errs)
    b.close()
    return 1000 * e[:, 0].mean(), np.degrees(e[:, 1].mean()), rate


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="control steps per measurement")
    ap.add_argument("--value", action="store_true", help="also fit/load V^e and print its error")
    args = ap.parse_args(argv)

    b = MujocoUR5eBackend(SceneConfig(cameras=()))
    b.reset(0)
    n = 5000
    t0 = time.perf_counter()
    for _ in range(n):
        mujoco.mj_step(b.model, b.data)
    print(f"physics: {n / (time.perf_counter() - t0):,.0f} mj_step/s (arm + gripper, dt 2 ms)")
    b.close()

    for ik in (500.0, 100.0, 50.0):
        mm, deg, rate = _tracking(ik, args.steps)
        print(f"IK {ik:5.0f} Hz: tracking {mm:.2f} mm / {deg:.3f} deg, {rate:.0f} control steps/s")
    mm, deg, _ = _tracking(100.0, args.steps, feedforward=False)
    print(f"IK   100 Hz without feed-forward: tracking {mm:.2f} mm / {deg:.3f} deg")

    full = {"render_mesh_faces": 0, "render_samples": 4}  # MuJoCo's own detail and MSAA
    for size in ((64, 64), (224, 224)):
        for label, kw in (("defaults", {}), ("full meshes + 4x MSAA", full)):
            b = MujocoUR5eBackend(SceneConfig(image_size=size, **kw))
            b.reset(0)
            rng = np.random.default_rng(0)
            t0 = time.perf_counter()
            for _ in range(args.steps):  # moving, so the arm crosses the views as in an episode
                b.act(Command(CommandKind.EE_DELTA, np.r_[rng.uniform(-0.02, 0.02, 3), 0, 0, 0, 0]))
                b.step()
            rate = args.steps / (time.perf_counter() - t0)
            print(
                f"control + render {size[0]}x{size[1]}, {label}: {rate:.1f} steps/s "
                f"(3 cameras, MUJOCO_GL={os.environ.get('MUJOCO_GL')})"
            )
            b.close()

    if args.value:
        for name in ("peg", "table_leg"):
            task = make_task(name, cameras=())
            m = expert_value(task).metrics
            print(
                f"V^e {name}: held-out RMSE {m['heldout_rmse']:.3f} (MAE {m['heldout_mae']:.3f}) "
                f"vs return std {m['heldout_return_std']:.2f} on {m['heldout_states']} states"
            )
            task.close()


if __name__ == "__main__":
    main()
