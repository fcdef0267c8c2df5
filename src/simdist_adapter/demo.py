"""`make demo`: Algorithm 1's real-world loop, short, through the full ROS graph.

1. A small pretrained Go2 world model, made by the project's own commands the first time
   (`simdist-generate --task go2_slope` then `simdist-pretrain --preset go2`), cached after.
2. `simdist launch go2_slope robot:=sim variant:=real record:=true adapt:=true`: the MuJoCo
   "real" Slippery Slope robot in lockstep, ingestion, safety supervisor, planner, recorder and
   adapter, on a private ROS domain.
3. This process watches `/simdist/episode` and `/simdist/adapter/status`: the first
   `--episodes` episodes run zero-shot and are recorded; the adapter then re-fits f on their bags
   (automatically, every `--episodes` bags), gates and hot-swaps the planner; the next
   `--episodes` episodes run with the adapted model. It prints zero-shot vs adapted success, the
   held-out latent loss before/after and where the bags, the model registry and the plot are.

Demo-sized settings (fewer MPPI samples than the official 450, a short pretraining) keep it under
20 minutes on two CPU cores; `simdist-adapt-experiment` runs the full measurement.
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
import time

import rclpy
import yaml
from std_msgs.msg import String

from simdist_planner.ros.launch_description import config_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent

# Demo-sized overrides of config/go2_slope.yaml (the defaults' single source); the rest as there.
DEMO_PARAMS = {
    # 8 s episodes, as simdist-adapt-experiment --max-steps 400: the course needs about 4 s, and a
    # model that walks slowly without falling would otherwise spend 20 s per episode in lockstep
    "mujoco_driver": {"max_steps": 400},
    "planner": {"num_samples": 64, "iterations": 2, "num_elites": 16},
    "adapter": {"batch_size": 32, "lr": 1e-3, "warmup_steps": 50, "max_steps": 300, "holdout": 0.2},
}


def run(cmd: list[str], what: str) -> float:
    print(f"[demo] {what}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - start
    print(f"[demo] {what} took {seconds:.0f} s", flush=True)
    return seconds


def pretrained_checkpoint(out: pathlib.Path, episodes: int, steps: int) -> pathlib.Path:
    model = out / "pretrain" / "model"
    if (model / "config.json").is_file():
        print(f"[demo] using the cached pretrained model {model}", flush=True)
        return model
    data = out / "sim_data"
    run(
        [
            str(BIN / "simdist-generate"),
            "--task",
            "go2_slope",
            "--episodes",
            str(episodes),
            "--workers",
            "2",
            "--max-steps",
            "400",
            "--out",
            str(data),
            "--no-progress",
            "--resume",
        ],
        "simulation data",
    )
    run(
        [
            str(BIN / "simdist-pretrain"),
            "--preset",
            "go2",
            "--data",
            str(data),
            "--out",
            str(out / "pretrain"),
            "--steps",
            str(steps),
            "--batch-size",
            "32",
            "--no-progress",
        ],
        "pretraining",
    )
    return model


def demo_params(
    out: pathlib.Path, bags: pathlib.Path, episodes: int, overrides: dict
) -> pathlib.Path:
    """config/go2_slope.yaml with `overrides` ({node: {parameter: value}}) and the loop's paths."""

    params = yaml.safe_load(config_path("go2_slope").read_text())
    for node, values in overrides.items():
        params[node]["ros__parameters"].update(values)
    adapter = params["adapter"]["ros__parameters"]
    adapter.update(
        registry_dir=str(out / "registry"),
        bag_dir=str(bags),
        work_dir=str(out / "adapt_work"),
        adapt_every_episodes=episodes,
    )
    path = out / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


class Watcher:
    """Counts finished episodes per phase from the graph's own topics."""

    def __init__(self, node):
        self.phase = "zero_shot"
        self.results: dict[str, list[bool]] = {
            "zero_shot": [],
            "during_adaptation": [],
            "adapted": [],
        }
        self.rounds: list[dict] = []
        self.swapped = False
        self.exit_code: int | None = None
        self._current: int | None = None
        node.create_subscription(String, "/simdist/episode", self._on_episode, 100)
        node.create_subscription(String, "/simdist/adapter/status", self._on_status, 10)

    def _on_episode(self, msg) -> None:
        tick = json.loads(msg.data)
        if tick.get("terminated") or tick.get("truncated"):
            if tick["episode"] != self._current:
                self._current = tick["episode"]
                self.results[self.phase].append(bool(tick.get("success")))
                print(
                    f"[demo] episode {tick['episode']} ({self.phase}, seed {tick['seed']}): "
                    f"{'success' if tick.get('success') else 'failure'}",
                    flush=True,
                )

    def _on_status(self, msg) -> None:
        status = json.loads(msg.data)
        state = status["state"]
        if state == "adapting" and self.phase == "zero_shot":
            self.phase = "during_adaptation"
            print(
                f"[demo] adaptation round started on {status.get('episodes')} episodes", flush=True
            )
        elif state in ("deployed", "refused", "failed"):
            self.rounds.append(status)
            print(f"[demo] adaptation: {status.get('reason', status.get('error'))}", flush=True)
            if state != "deployed" and not self.swapped:
                self.phase = (
                    "zero_shot"  # the pretrained model stays deployed; a later round may pass
                )
        elif state == "swapped":
            self.phase = "adapted"
            self.swapped = True
            print(f"[demo] planner hot-swapped to {status.get('deployed')}", flush=True)


def run_graph(
    out: pathlib.Path,
    checkpoint: pathlib.Path,
    episodes: int,
    timeout_s: float,
    overrides: dict = DEMO_PARAMS,
    domain: str | None = None,
) -> Watcher:
    """Run the loop until `episodes` adapted episodes finished (or the time limit)."""

    bags = out / "bags"
    domain = domain or str(random.Random(os.getpid()).randint(101, 200))
    os.environ["ROS_DOMAIN_ID"] = domain
    params = demo_params(out, bags, episodes, overrides)
    cmd = [
        str(BIN / "simdist"),
        "launch",
        "go2_slope",
        "robot:=sim",
        "variant:=real",
        f"checkpoint:={checkpoint}",
        "record:=true",
        f"bag_dir:={bags}",
        "adapt:=true",
        f"domain:={domain}",
        f"params_file:={params}",
    ]
    print(f"[demo] starting the graph (log: {out / 'graph.log'}): {' '.join(cmd)}", flush=True)
    log = open(out / "graph.log", "w")
    graph = subprocess.Popen(cmd, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    rclpy.init()
    node = rclpy.create_node("demo_watcher")
    watcher = Watcher(node)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and graph.poll() is None:
            rclpy.spin_once(node, timeout_sec=0.2)
            if len(watcher.results["adapted"]) >= episodes:
                break
    finally:
        if graph.poll() is None:
            os.killpg(graph.pid, signal.SIGINT)
            try:
                graph.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(graph.pid, signal.SIGKILL)
        node.destroy_node()
        rclpy.try_shutdown()
        log.close()
    watcher.exit_code = graph.returncode
    if time.monotonic() >= deadline:
        print(f"[demo] time limit of {timeout_s:.0f} s reached", flush=True)
    return watcher


def plot(out: pathlib.Path, watcher: Watcher) -> pathlib.Path:
    import matplotlib  # noqa: PLC0415 - plots only; matplotlib is heavy to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - plots only; matplotlib is heavy to import

    fig, ax = plt.subplots(figsize=(7, 3))
    x = 0
    for i, (phase, outcomes) in enumerate(watcher.results.items()):
        ax.scatter(range(x, x + len(outcomes)), outcomes, label=phase, color=f"C{i}")
        x += len(outcomes)
    ax.set(
        xlabel="episode",
        ylabel="success",
        yticks=[0, 1],
        title="Slippery Slope: zero-shot -> adapted",
    )
    ax.legend()
    path = out / "demo_episodes.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="simdist-demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=str(ROOT / "artifacts" / "demo"))
    p.add_argument(
        "--episodes", type=int, default=4, help="zero-shot episodes, then as many adapted ones"
    )
    p.add_argument(
        "--sim-episodes", type=int, default=60, help="simulation episodes for pretraining"
    )
    p.add_argument("--pretrain-steps", type=int, default=600)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds the graph may run")
    a = p.parse_args(argv)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("bags", "registry", "adapt_work"):  # each demo run starts a fresh loop
        path = out / name
        if path.exists():
            subprocess.run(["rm", "-rf", str(path)], check=True)
    start = time.perf_counter()
    checkpoint = pretrained_checkpoint(out, a.sim_episodes, a.pretrain_steps)
    watcher = run_graph(out, checkpoint, a.episodes, a.timeout)
    r = watcher.results
    rate = lambda xs: f"{sum(xs)}/{len(xs)}" if xs else "n/a"  # noqa: E731
    print("\n== SimDist-ROS demo: Slippery Slope (MuJoCo 'real' stand-in) ==")
    print(f"zero-shot success        {rate(r['zero_shot'])}")
    print(f"during adaptation        {rate(r['during_adaptation'])}")
    print(f"adapted success          {rate(r['adapted'])}")
    for rd in watcher.rounds:
        if "heldout_deployed" in rd:
            print(
                f"held-out latent loss     {rd['heldout_deployed']:.4f} -> "
                f"{rd['heldout_candidate']:.4f} "
                f"({'deployed ' + rd['version'] if rd['deployed'] else 'refused by the gate'})"
            )
    print(f"episode bags             {out / 'bags'}")
    print(f"model registry           {out / 'registry'} (history.json lists every version)")
    print(f"plot                     {plot(out, watcher)}")
    print(f"total time               {time.perf_counter() - start:.0f} s")
    (out / "demo_results.json").write_text(
        json.dumps({"results": r, "rounds": watcher.rounds}, indent=1, default=str)
    )
    ok = bool(r["zero_shot"]) and bool(watcher.rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
