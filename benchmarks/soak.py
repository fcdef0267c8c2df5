"""Soak: run a graph for N minutes and report memory growth per node, dropped ticks and latency.

Starts `simdist launch <graph>` with a random-weight model of the robot's official size (as
`ros_graph.py` does), in lockstep with the recorder and adapter on unless `--realtime`, and
samples every node's resident memory (/proc/<pid>/status VmRSS) every `--sample-s` seconds. At
the end it prints per node the RSS after the first minute and at the end, and the growth between
them (the issue's bound: < 5 %); the driver ticks published against the safe commands that
answered them (a tick without an answer is a dropped message of the control chain); and the
percentiles of the wall time from a tick's proprio to the safe command carrying its stamp.

    python benchmarks/soak.py --minutes 10 --graph go2_slope --samples 64 --iterations 2
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import re
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
import rclpy
import yaml
from rclpy.node import Node
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from ros_graph import ROOT, SIMDIST, make_checkpoint  # the sibling benchmark (same directory)
from simdist_planner.ros import launch_description as desc
from simdist_planner.ros.planner_node import QOS

STARTED = re.compile(r"\[simdist\] started (\w+) \(pid (\d+)\)")


def rss_mb(pid: int) -> float | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def soak(args, workdir: pathlib.Path) -> dict:
    robot = desc.GRAPHS[args.graph].robot
    params = yaml.safe_load(desc.config_path(args.graph).read_text())
    planner = params["planner"]["ros__parameters"]
    planner["num_samples"] = args.samples
    planner["num_elites"] = min(planner["num_elites"], args.samples)
    planner["iterations"] = args.iterations
    adapter = params.get("adapter", {}).get("ros__parameters")
    if adapter is not None:  # the adapter's registry and scratch space stay in the temp dir
        adapter["registry_dir"] = str(workdir / "models")
        adapter["work_dir"] = str(workdir / "work")
    params_file = workdir / "soak.yaml"
    params_file.write_text(yaml.safe_dump(params))
    checkpoint = make_checkpoint(robot, workdir / "ck")
    domain = random.randint(201, 232)
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    mode = (
        ["lockstep:=false"]
        if args.realtime
        else ["lockstep:=true", "record:=true", "adapt:=true", f"bag_dir:={workdir / 'bags'}"]
    )
    launch = subprocess.Popen(
        [SIMDIST, "launch", args.graph, *mode, f"checkpoint:={checkpoint}",
         f"params_file:={params_file}", f"domain:={domain}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    pids: dict[str, int] = {}

    def read_pids():
        for line in launch.stderr:
            m = STARTED.search(line)
            if m:
                pids[m.group(1)] = int(m.group(2))  # a respawned node: its newest pid

    threading.Thread(target=read_pids, daemon=True).start()
    rclpy.init()
    node = Node("soak_benchmark")
    ticks: dict[int, float] = {}
    answers: dict[int, float] = {}
    node.create_subscription(
        JointState,
        "/simdist/robot/proprio",
        lambda m: ticks.setdefault(ros_msgs.stamp_ns(m.header.stamp), time.monotonic()),
        QOS,
    )
    node.create_subscription(
        JointTrajectory,
        "/simdist/safe_command",
        lambda m: answers.setdefault(ros_msgs.stamp_ns(m.header.stamp), time.monotonic()),
        QOS,
    )
    rss: dict[str, list[tuple[float, float]]] = {}
    try:
        deadline = time.monotonic() + 180.0
        while not answers:  # every node up, the chain answering
            rclpy.spin_once(node, timeout_sec=0.05)
            if time.monotonic() > deadline or launch.poll() is not None:
                raise RuntimeError(f"the {args.graph} graph never answered a tick")
        start = next_sample = time.monotonic()
        while time.monotonic() - start < 60.0 * args.minutes:
            rclpy.spin_once(node, timeout_sec=0.05)
            if time.monotonic() >= next_sample:
                t = time.monotonic() - start
                for name, pid in list(pids.items()):
                    mb = rss_mb(pid)
                    if mb is not None:
                        rss.setdefault(name, []).append((t, mb))
                next_sample += args.sample_s
            if launch.poll() is not None:
                raise RuntimeError(f"the graph stopped after {time.monotonic() - start:.0f} s")
        rclpy.spin_once(node, timeout_sec=1.0)
    finally:
        node.destroy_node()
        rclpy.shutdown()
        launch.send_signal(signal.SIGINT)
        launch.wait(timeout=60)
    # a tick is dropped if no safe command carries its stamp (the newest tick may be in flight)
    asked = sorted(ticks)[:-1]
    latency = np.array([(answers[s] - ticks[s]) * 1e3 for s in asked if s in answers])
    return {"rss": rss, "ticks": len(asked), "answered": int(np.isin(asked, list(answers)).sum()),
            "latency_ms": latency}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="go2_slope", choices=sorted(desc.GRAPHS))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    parser.add_argument("--samples", type=int, default=64, help="MPPI samples")
    parser.add_argument("--iterations", type=int, default=2, help="MPPI iterations")
    parser.add_argument("--realtime", action="store_true", help="real-time driver, no recording")
    args = parser.parse_args()
    os.environ.setdefault("MENAGERIE_ROOT", str(ROOT.parent / "shared" / "menagerie"))
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    with tempfile.TemporaryDirectory() as tmp:
        r = soak(args, pathlib.Path(tmp))
    mode = "real time" if args.realtime else "lockstep, recorder and adapter on"
    print(f"== soak: {args.graph} ({mode}), {args.minutes} min, MPPI {args.samples} x "
          f"{args.iterations} ==")  # fmt: skip
    print(f"{'node':20} {'RSS at 1 min (MB)':>18} {'at end':>8} {'growth':>8}")
    for name, series in sorted(r["rss"].items()):
        after = [mb for t, mb in series if t >= 60.0] or [series[-1][1]]
        first, last = after[0], series[-1][1]
        print(f"{name:20} {first:18.1f} {last:8.1f} {100 * (last - first) / first:7.1f}%")
    dropped = r["ticks"] - r["answered"]
    print(f"ticks {r['ticks']}, answered by a safe command {r['answered']}, dropped {dropped}")
    lat = r["latency_ms"]
    if lat.size:
        p50, p95, p99 = np.percentile(lat, [50, 95, 99])
        print(f"tick -> safe command (ms): median {p50:.1f}, p95 {p95:.1f}, p99 {p99:.1f}, "
              f"max {lat.max():.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
