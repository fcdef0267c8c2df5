"""Simulation throughput per task: physics steps/s, rendered frames/s, dataset samples/s.

    python benchmarks/sim.py [--tasks peg,go2_flat] [--physics-steps 2000] [--frames 20]
                             [--gen-steps 100] [--windows 500]

For every task in robot_drivers.registry.TASKS that builds (others are listed with the reason):
- physics: raw mj_step calls per second on the task's model (from its reset state),
- frames: rendered camera images per second (one observe() renders every camera),
- control: full task.step() calls per second (physics + control + rendering + reward),
- generation: one worker's setup time (task, expert ladder, V^e) and then its steady rate in
  dataset transitions per second (Algorithm 2 rollouts, expert value, HDF5 writes),
- loading: training windows per second of one reader (H = T = 5 UR5e-style, 25 for Go2),
  images decompressed per window (preload="vectors") and held in RAM (preload="all").
Single process, one thread; the figures depend on the machine's load (printed beside them).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time

import mujoco
import numpy as np
import torch

from robot_drivers import registry
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.schema import shard_name
from simdist_planner.data.windows import WindowDataset
from simdist_planner.data.writer import ShardWriter
from simdist_planner.evaluation import datagen


def _rate(n: int, fn) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def bench_task(name: str, args) -> dict:

    row: dict = {"task": name}
    task = registry.make_task(name)
    try:
        spec = task.spec
        obs = task.reset(0)
        backend = task.backend
        model, data = backend.model, mujoco.MjData(backend.model)
        mujoco.mj_copyData(data, model, backend.data)
        row["physics_steps_s"] = _rate(args.physics_steps, lambda: mujoco.mj_step(model, data))
        if spec.cameras:
            fps = _rate(args.frames, backend.observe) * len(spec.cameras)
            row["frames_s"] = fps
            row["frame"] = f"{len(spec.cameras)}x{spec.image_shape[0]}x{spec.image_shape[1]}"
        policy = registry.expert_ladder(task)[0]
        policy.reset(0)
        actions = []
        for _ in range(args.frames):
            actions.append(policy.act(obs))
            obs = task.step(actions[-1]).obs
        obs = task.reset(0)
        row["control_steps_s"] = _rate(len(actions), lambda it=iter(actions): task.step(next(it)))
    finally:
        task.close()

    robot = datagen.robot_data_config(spec)
    cfg = datagen.GenerateConfig(task=name, robot=robot, episodes=1, max_steps=args.gen_steps)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        gen = datagen.EpisodeGenerator(cfg)
        row["gen_setup_s"] = time.perf_counter() - start
        try:
            start, done, ep_id = time.perf_counter(), 0, 0
            with ShardWriter(pathlib.Path(out) / shard_name(0), gen.layout, {"task": name}) as w:
                while done < args.gen_steps:  # steady state: episodes + HDF5 writes, no setup
                    record = gen.episode(ep_id)
                    w.append(record)
                    done += len(record.steps["reward"]) - 1
                    ep_id += 1
            row["gen_transitions_s"] = done / (time.perf_counter() - start)
        finally:
            gen.close()
        ds = ShardedDataset(out)
        horizon = 5 if spec.cameras else 25
        if ds.lengths.max() > horizon + 1:
            for key, preload in (("load_windows_s", "vectors"), ("load_windows_s_ram", "all")):
                win = WindowDataset(ShardedDataset(out, preload=preload), horizon, horizon)
                idx = np.random.default_rng(0).integers(0, len(win), args.windows)
                row[key] = _rate(len(idx), lambda it=iter(idx), w=win: w[int(next(it))])
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default=None, help="comma list (default: every registered task)")
    p.add_argument("--physics-steps", type=int, default=2000)
    p.add_argument("--frames", type=int, default=20, help="observe() and task.step() calls")
    p.add_argument(
        "--gen-steps", type=int, default=100, help="transitions generated (and episode cap)"
    )
    p.add_argument("--windows", type=int, default=500)
    args = p.parse_args(argv)

    torch.set_num_threads(1)

    names = args.tasks.split(",") if args.tasks else list(registry.TASKS)
    load = os.getloadavg()[0]
    print(
        f"# sim benchmark, load average {load:.1f} on {os.cpu_count()} CPUs, "
        f"MUJOCO_GL={os.environ.get('MUJOCO_GL', '')}"
    )
    cols = [
        "physics_steps_s",
        "frames_s",
        "control_steps_s",
        "gen_setup_s",
        "gen_transitions_s",
        "load_windows_s",
        "load_windows_s_ram",
    ]
    print(f"{'task':16s}" + "".join(f"{c:>19s}" for c in cols) + "  frame")
    for name in names:
        try:
            row = bench_task(name, args)
        except Exception as e:  # report and go on: one broken task must not hide the others
            print(f"{name:16s}  skipped: {type(e).__name__}: {e}")
            continue
        cells = "".join(f"{row[c]:>19.1f}" if c in row else f"{'-':>19s}" for c in cols)
        print(f"{name:16s}{cells}  {row.get('frame', '-')}", flush=True)


if __name__ == "__main__":
    main()
