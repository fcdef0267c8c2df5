"""The video-prediction node's latency per job, live in the peg graph.

Starts `simdist launch peg video:=true` (the MuJoCo robot in lockstep, a randomly initialised
planner at a CPU-sized MPPI) with the node at the given N_s, N_r and w, and listens to
`/simdist/predicted_video/side/status` from this process: each job's `latency_s` (the robot mask
from the joints, the sim and real sampling stages and the decoding, as the node's worker thread
times them), over `--jobs` jobs after `--warmup` discarded ones.

    python benchmarks/video_node.py --checkpoint runs/sf/winner --guidance 0.6 --jobs 20
    python benchmarks/video_node.py      # a random student of benchmarks/simforcing.py's size

Without a checkpoint it serves a randomly initialised student of the size benchmarks/simforcing.py
times (latency does not depend on the weights). The graph's other nodes share the CPU with it, as
they do in operation; the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import rclpy
import torch
import yaml
from rclpy.node import Node
from std_msgs.msg import String

from robot_drivers.specs import robot_spec
from sim_video_world_model.backbones import build_backbone
from sim_video_world_model.checkpoint import ModelBundle, save_bundle
from sim_video_world_model.config import BackboneConfig, TinyBackboneConfig
from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.config import ur5e_small_config
from simdist_planner.model.world_model import WorldModel

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIMDIST = str(pathlib.Path(sys.executable).parent / "simdist")
CAMERA = "side"


def random_student(path: pathlib.Path) -> str:
    """A randomly initialised student (sim conditioning on): 9 frames of 64 x 64, UR5e actions."""
    torch.manual_seed(0)
    cfg = BackboneConfig(tiny=TinyBackboneConfig(spatial_factor=8, latent_channels=16))
    ae, den = build_backbone(cfg)
    den.add_sim_conditioning()
    info = {
        "num_frames": 9,
        "image_size": [64, 64],
        "stage": "student",
        "action_low": [-0.02] * 3 + [-0.2] * 3 + [0.0],
        "action_high": [0.02] * 3 + [0.2] * 3 + [1.0],
    }
    save_bundle(str(path), ModelBundle(ae, den, cfg, info))
    return str(path)


def planner_checkpoint(path: pathlib.Path) -> str:
    torch.manual_seed(0)
    save_checkpoint(WorldModel(ur5e_small_config(proprio_dim=robot_spec("ur5e").proprio_dim)), path)
    return str(path)


def measure(args, workdir: pathlib.Path) -> list[float]:
    student = args.checkpoint or random_student(workdir / "student")
    info = json.loads((pathlib.Path(student) / "config.json").read_text())["info"]
    h, w = (int(v) for v in info["image_size"])
    params = yaml.safe_load((ROOT / "config" / "peg.yaml").read_text())
    params["planner"]["ros__parameters"].update(
        num_samples=args.samples, num_elites=min(8, args.samples), iterations=args.iterations
    )
    # the camera at the student's size: the node predicts without resizing
    params["mujoco_driver"]["ros__parameters"].update(image_height=h, image_width=w)
    params["ingestion"]["ros__parameters"].update(camera_height=h, camera_width=w)
    params["video_prediction"]["ros__parameters"].update(
        camera=CAMERA,
        sim_steps=args.sim_steps,
        real_steps=args.real_steps,
        guidance=args.guidance,
    )
    params_file = workdir / "peg_video_bench.yaml"
    params_file.write_text(yaml.safe_dump(params))
    domain = args.domain or random.randint(201, 232)
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    planner = planner_checkpoint(workdir / "ck")
    log = workdir / "launch.log"  # a file: a pipe nobody reads would fill and stall the graph
    out = log.open("w")
    launch = subprocess.Popen(
        [SIMDIST, "launch", "peg", "robot:=sim", f"checkpoint:={planner}", "video:=true",
         f"video_checkpoint:={student}", f"params_file:={params_file}", f"domain:={domain}"],
        stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out.close()  # the launcher holds its own copy
    rclpy.init()
    node = Node("video_node_benchmark")
    jobs: list[dict] = []
    node.create_subscription(
        String,
        f"/simdist/predicted_video/{CAMERA}/status",
        lambda m: jobs.append(json.loads(m.data)),
        100,
    )
    want = args.warmup + args.jobs
    try:
        deadline = time.monotonic() + args.timeout
        while sum(j.get("ok", False) for j in jobs) < want:
            rclpy.spin_once(node, timeout_sec=0.1)
            if time.monotonic() > deadline or launch.poll() is not None:
                tail = log.read_text()[-3000:]
                raise RuntimeError(f"{len(jobs)} statuses, {want} wanted: {jobs[-3:]}\n{tail}")
    finally:
        node.destroy_node()
        rclpy.shutdown()
        launch.send_signal(signal.SIGINT)
        launch.wait(timeout=60)
    done = [j for j in jobs if j.get("ok")][args.warmup : want]
    settings = {(j["sim_steps"], j["real_steps"], j["guidance"]) for j in done}
    assert settings == {(args.sim_steps, args.real_steps, args.guidance)}, settings
    return [j["latency_s"] for j in done]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", help="student checkpoint directory (default: a random one)")
    p.add_argument("--sim-steps", type=int, default=1, help="N_s")
    p.add_argument("--real-steps", type=int, default=10, help="N_r")
    p.add_argument("--guidance", type=float, default=0.6, help="w")
    p.add_argument("--jobs", type=int, default=20, help="jobs measured")
    p.add_argument("--warmup", type=int, default=1, help="first jobs discarded")
    p.add_argument("--samples", type=int, default=64, help="the planner's MPPI samples")
    p.add_argument("--iterations", type=int, default=2, help="the planner's MPPI iterations")
    p.add_argument("--domain", type=int, default=0, help="ROS_DOMAIN_ID (0: random in 201-232)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before giving up")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seconds = np.array(measure(args, pathlib.Path(tmp)))
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"video node, camera {CAMERA}: {args.checkpoint or 'random student'}")
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(
        f"N_s {args.sim_steps}, N_r {args.real_steps}, w {args.guidance:g}, device cpu, "
        f"OMP_NUM_THREADS={threads}"
    )
    print(
        f"{len(seconds)} jobs: median {np.median(seconds):.3f} s, "
        f"p90 {np.percentile(seconds, 90):.3f} s, min {seconds.min():.3f} s, "
        f"max {seconds.max():.3f} s (load average {load}, {os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    main()
