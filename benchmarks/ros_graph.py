"""Running-graph figures: observation-to-command latency and achieved control rate.

Starts a whole graph with `simdist launch` (MuJoCo robot in real time, i.e. `lockstep:=false`, so
the driver ticks on the wall clock like hardware; a randomly initialised world model at the
official MPPI settings of config/<graph>.yaml unless --samples/--iterations say otherwise) and
listens from a separate process:

- obs->command: driver publishes /simdist/robot/proprio of a tick -> the safety supervisor's
  /simdist/safe_command carrying that tick's stamp arrives (the full ingestion + planner +
  supervisor path, measured on this process's clock);
- ingestion: /simdist/robot/proprio -> /simdist/observation/proprio of the same stamp, plus the
  node's own mean per-image processing time from /diagnostics;
- achieved rate: planner actions per wall second vs the nominal control rate; MPPI vs base-policy
  ticks and deadline misses from the planner's diagnostics.

With `--lockstep` the MuJoCo driver waits for every answer instead (as in `make demo`,
recording and adapter on): it reports lockstep ticks per wall second beside the planner's own
latency per tick (its diagnostics), and the overhead the graph adds to each plan:
wall time per tick - plan latency (the issue's bound: <= 0.3 x plan + 10 ms).

    python benchmarks/ros_graph.py                      # UR5e (three cameras) and Go2
    python benchmarks/ros_graph.py --robot ur5e --seconds 30 --samples 128
    python benchmarks/ros_graph.py --robot go2 --lockstep --samples 64 --iterations 2
    python benchmarks/ros_graph.py --robot go2 --lockstep --samples 64 --iterations 2 \
        --precision bfloat16
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np
import rclpy
import torch
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from robot_drivers.specs import robot_spec
from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.config import go2_config, ur5e_small_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning.config import (
    PLANNER_FIELDS,
    PRECISIONS,
    PlannerConfig,
    planner_config_for,
)
from simdist_planner.ros.planner_node import QOS

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIMDIST = str(pathlib.Path(sys.executable).parent / "simdist")
GRAPHS = {"ur5e": "peg", "go2": "go2_slope"}


def make_checkpoint(robot: str, path: pathlib.Path) -> str:

    spec = robot_spec(robot)
    config = (
        ur5e_small_config(proprio_dim=spec.proprio_dim)
        if robot == "ur5e"
        else go2_config(proprio_dim=spec.proprio_dim)
    )
    torch.manual_seed(0)
    save_checkpoint(WorldModel(config), path)
    return str(path)


def preset_config(robot: str, planner: dict) -> PlannerConfig:
    """The PlannerConfig a graph's planner section plans with (its preset, its own values)."""
    config = planner_config_for(robot_spec(robot), planner.get("planner_preset", ""))
    return replace(config, **{k: v for k, v in planner.items() if k in PLANNER_FIELDS})


def measure(
    robot: str,
    seconds: float,
    samples: int | None,
    iterations: int | None,
    workdir: pathlib.Path,
    lockstep: bool = False,
    view: bool = False,
    precision: str | None = None,
) -> dict:

    graph = GRAPHS[robot]
    params = yaml.safe_load((ROOT / "config" / f"{graph}.yaml").read_text())
    planner = params["planner"]["ros__parameters"]
    if samples:
        elites = preset_config(robot, planner).num_elites
        planner["num_samples"], planner["num_elites"] = samples, min(elites, samples)
    if iterations:
        planner["iterations"] = iterations
    if precision:
        planner["precision"] = precision
    if lockstep:  # the adapter's registry and scratch space stay in the temporary directory
        adapter = params["adapter"]["ros__parameters"]
        adapter["registry_dir"] = str(workdir / "models")
        adapter["work_dir"] = str(workdir / "work")
    params_file = workdir / f"{graph}_bench.yaml"
    params_file.write_text(yaml.safe_dump(params))
    checkpoint = make_checkpoint(robot, workdir / f"{robot}_ck")
    domain = random.randint(201, 232)
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    mode = (
        ["lockstep:=true", "record:=true", "adapt:=true", f"bag_dir:={workdir / 'bags'}"]
        if lockstep
        else ["lockstep:=false"]
    )
    if view:  # the viewer node serving its gRPC view and writing a recording
        params["viewer"]["ros__parameters"]["recording"] = str(workdir / f"{graph}_view.rrd")
        params_file.write_text(yaml.safe_dump(params))
        mode.append("view:=true")
    launch = subprocess.Popen(
        [SIMDIST, "launch", graph, *mode, f"checkpoint:={checkpoint}",
         f"params_file:={params_file}", f"domain:={domain}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    rclpy.init()
    node = Node("ros_graph_benchmark")
    seen: dict[str, dict[int, float]] = {
        "robot": {},
        "observation": {},
        "action": {},
        "command": {},
    }
    diags: dict[str, dict] = {}

    def keep(kind):
        def cb(msg):
            seen[kind].setdefault(ros_msgs.stamp_ns(msg.header.stamp), time.monotonic())

        return cb

    latencies: dict[str, float] = {}  # last_stamp -> the planner's latency of that tick (ms)

    def on_diag(msg):
        for s in msg.status:
            diags[s.name] = values = {kv.key: kv.value for kv in s.values}
            if s.name == "planner: planning" and "last_latency_ms" in values:
                latencies[values.get("last_stamp", "")] = float(values["last_latency_ms"])

    node.create_subscription(JointState, "/simdist/robot/proprio", keep("robot"), QOS)
    node.create_subscription(JointState, "/simdist/observation/proprio", keep("observation"), QOS)
    node.create_subscription(JointTrajectory, "/simdist/action", keep("action"), QOS)
    node.create_subscription(JointTrajectory, "/simdist/safe_command", keep("command"), QOS)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, QOS)
    try:
        deadline = time.monotonic() + 180.0
        while not seen["action"]:  # warm-up: every node started, the planner answering
            rclpy.spin_once(node, timeout_sec=0.05)
            if time.monotonic() > deadline or launch.poll() is not None:
                stderr = launch.stderr.read() if launch.poll() is not None else ""
                raise RuntimeError(f"the {graph} graph never produced an action:\n{stderr}")
        for store in seen.values():
            store.clear()
        latencies.clear()
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            rclpy.spin_once(node, timeout_sec=0.05)
        elapsed = time.monotonic() - start
    finally:
        node.destroy_node()
        rclpy.shutdown()
        launch.send_signal(signal.SIGINT)
        launch.wait(timeout=60)

    def delays(a, b):
        return np.array([(seen[b][s] - seen[a][s]) * 1e3 for s in seen[a] if s in seen[b]])

    obs_to_cmd, ingest = delays("robot", "command"), delays("robot", "observation")
    nominal = {"ur5e": 5.0, "go2": 50.0}[robot]
    planner_diag = diags.get("planner: planning", {})
    ingestion_diag = diags.get("ingestion: observation", {})
    plan_ms = np.array(list(latencies.values()))
    tick_ms = 1e3 * elapsed / max(len(seen["action"]), 1)
    return {
        "lockstep": lockstep,
        "tick_wall_ms": tick_ms,
        "plan_ms": _stats(plan_ms),
        "plan_ms_median": float(np.median(plan_ms)) if plan_ms.size else float("nan"),
        "robot": robot,
        "mppi": f"{planner['num_samples']} samples x {planner['iterations']} iterations",
        "nominal_hz": nominal,
        "ticks_published_hz": len(seen["robot"]) / elapsed,
        "actions_hz": len(seen["action"]) / elapsed,
        "obs_to_command_ms": _stats(obs_to_cmd),
        "ticks_answered": f"{len(obs_to_cmd)}/{len(seen['robot'])}",
        "ingestion_ms": _stats(ingest),
        "ingestion_image_ms_mean": ingestion_diag.get("image_ms_mean", "n/a"),
        "planner": {k: planner_diag.get(k) for k in ("mppi_ticks", "policy_fallbacks",
                                                     "deadline_misses", "latency_estimate_ms",
                                                     "last_latency_ms")},
    }  # fmt: skip


def _stats(values: np.ndarray) -> str:
    if values.size == 0:
        return "no samples"
    return (
        f"median {np.median(values):.1f}, p95 {np.percentile(values, 95):.1f}, "
        f"max {values.max():.1f} (n={values.size})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robot", choices=["ur5e", "go2", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=20.0, help="measurement window per robot")
    parser.add_argument(
        "--samples", type=int, default=None, help="MPPI samples (default: the config's)"
    )
    parser.add_argument(
        "--iterations", type=int, default=None, help="MPPI iterations (default: the config's)"
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="the fast evaluator's compute dtype (default: the config's)",
    )
    parser.add_argument(
        "--lockstep",
        action="store_true",
        help="simulator waits for each answer (recording and adapter on): ticks per wall second",
    )
    parser.add_argument(
        "--view",
        action="store_true",
        help="with --lockstep: measure again with the Rerun viewer node on (view:=true) and "
        "print its ticks per second against those without",
    )
    args = parser.parse_args()
    os.environ.setdefault("MENAGERIE_ROOT", str(ROOT.parent / "shared" / "menagerie"))
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    robots = ["ur5e", "go2"] if args.robot == "both" else [args.robot]
    with tempfile.TemporaryDirectory() as tmp:
        for robot in robots:
            result = measure(
                robot,
                args.seconds,
                args.samples,
                args.iterations,
                pathlib.Path(tmp),
                args.lockstep,
                precision=args.precision,
            )
            driver = (
                "lockstep driver, recorder and adapter" if args.lockstep else "real-time driver"
            )
            print(f"== {robot} ({GRAPHS[robot]} graph, {driver}, MPPI {result['mppi']}) ==")
            if args.lockstep:
                plan = result["plan_ms_median"]
                print(f"  lockstep ticks            {result['actions_hz']:.2f} per wall second")
                print(f"  wall time per tick        {result['tick_wall_ms']:.1f} ms")
                print(f"  planner latency (ms)      {result['plan_ms']}")
                print(
                    f"  graph overhead per tick   {result['tick_wall_ms'] - plan:.1f} ms "
                    f"(bound 0.3 x plan + 10 ms = {0.3 * plan + 10:.1f} ms)"
                )
                print(f"  planner                   {result['planner']}")
                if args.view:
                    viewed = measure(robot, args.seconds, args.samples, args.iterations,
                                     pathlib.Path(tmp), True, view=True,
                                     precision=args.precision)  # fmt: skip
                    print(
                        f"  with the viewer           {viewed['actions_hz']:.2f} ticks per wall "
                        f"second = {viewed['actions_hz'] / result['actions_hz']:.1%} of those "
                        "without (bound >= 95 %)"
                    )
                continue
            print(f"  nominal control rate      {result['nominal_hz']:.1f} Hz")
            print(f"  driver ticks published    {result['ticks_published_hz']:.2f} Hz")
            print(f"  planner actions           {result['actions_hz']:.2f} Hz")
            print(
                f"  obs -> safe command (ms)  {result['obs_to_command_ms']}  "
                f"answered {result['ticks_answered']}"
            )
            print(
                f"  ingestion (ms)            {result['ingestion_ms']}; "
                f"per image {result['ingestion_image_ms_mean']} ms"
            )
            print(f"  planner                   {result['planner']}")


if __name__ == "__main__":
    main()
