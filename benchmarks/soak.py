"""Soak: run a Go2 sim graph for N minutes and check that nothing grows or stalls.

Starts `simdist launch <graph>` with a random-weight model of the robot's official size (as
`ros_graph.py` does), with the recorder and the adapter on, in real time (`--lockstep` for the
lockstep simulator). Every `--sample-s` seconds it samples each node's resident memory
(/proc/<pid>/status VmRSS) and open file descriptors (/proc/<pid>/fd), the episode bags on disk
(and how many of them are unfinalised) and the command age: the wall time since the newest
`/simdist/safe_command` arrived. It also times each tick's proprio to the safe command carrying
its stamp, counts the ticks no safe command answered, and, in real time (the stamps are the
system clock), the age of each forwarded plan when it arrived.

`check()` holds the result to `SoakBounds` (docs/safety.md, "Soak"): the growth of each node's
RSS and fd count from the first sample after the first minute to the end, the unfinalised bags,
the command age. The CLI prints the figures and the violated bounds, and exits 1 on any.

    python benchmarks/soak.py --minutes 10 --graph go2_slope --samples 64 --iterations 2

`--hang-planner-s T` stops the planner (SIGSTOP) T seconds in: the supervisor's watchdog then
sends HOLD and DAMP, no plan is forwarded, and the soak fails its command-age bound.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.subscription import MessageInfo
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import ros_msgs
from ros_graph import (  # the sibling benchmark (same directory)
    ROOT,
    SIMDIST,
    make_checkpoint,
    preset_config,
)
from simdist_adapter.bags import list_episode_bags, unfinalised_bags
from simdist_planner.ros import launch_description as desc

STARTED = re.compile(r"\[simdist\] started (\w+) \(pid (\d+)\)")
# The listener's queues: deep, so that a listener the 2 cores starve for a moment buffers the
# 50 Hz topics instead of losing them (a depth of 10 lost most ticks under load).
LISTEN_QOS = QoSProfile(
    depth=500,
    history=HistoryPolicy.KEEP_LAST,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)


@dataclass(frozen=True)
class SoakBounds:
    """What a soak may show (docs/safety.md, "Soak")."""

    rss_growth_pct: float = 5.0  # per node, first sample after 1 min -> end
    fd_growth: int = 8  # open fds per node, first sample after 1 min -> end
    # bags other than the newest that are unfinalised at two consecutive samples: the recorder
    # finalises an ended episode's bag grace_s (1 s) after the next starts, far within a sample
    # period, so only a bag it lost track of lingers (short episodes can leave several open at
    # one sample)
    lingering_bags: int = 0
    # The wall time since the newest forwarded plan (a joint_position command on
    # /simdist/safe_command; HOLD and DAMP are the supervisor's own answers), at any sample: a
    # planner that hangs or whose every plan is refused exceeds it.
    command_age_s: float = 1.0
    # Lockstep: ticks no safe command answered (the supervisor's answer_timeout_s answers a
    # tick the planner leaves; a tick without any answer stalls the simulator).
    dropped_ticks: int = 0
    # Real time: the share of the ticks the listener saw that a forwarded plan of their stamp
    # answered. The planner answers the newest observation at control_rate_hz; one that plans
    # slower than the driver ticks skips ticks, and a plan older than max_command_age_s when
    # the supervisor gets it is refused.
    min_planned_share: float = 0.25
    # Real time: forwarded plans' age (system clock) when they reach the listener's DDS reader
    # (the middleware's reception time, ms): the supervisor forwards none older than
    # max_command_age_s (0.06 s in the Go2 graphs) when it gets them; the rest is delivery,
    # which a machine shared with other jobs stalls now and then. The listener's own callback
    # backlog (Python, one thread) is printed apart and not bounded: it is not the graph's.
    plan_age_median_ms: float = 100.0
    plan_age_p99_ms: float = 1000.0
    # The listener's own count of ticks against the driver's (the step numbers of
    # /simdist/episode): below this share, the soak's tick figures are not the graph's.
    min_heard_share: float = 0.95


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


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
    preset = preset_config(robot, planner)  # before the overrides: it validates them together
    planner["num_samples"] = args.samples
    planner["num_elites"] = min(preset.num_elites, args.samples)
    planner["iterations"] = args.iterations
    adapter = params.get("adapter", {}).get("ros__parameters")
    if adapter is not None:  # the adapter's registry and scratch space stay in the temp dir
        adapter["registry_dir"] = str(workdir / "models")
        adapter["work_dir"] = str(workdir / "work")
    realtime_factor = params["mujoco_driver"]["ros__parameters"].get("realtime_factor", 1.0)
    params_file = workdir / "soak.yaml"
    params_file.write_text(yaml.safe_dump(params))
    checkpoint = make_checkpoint(robot, workdir / "ck")
    domain = args.domain if args.domain is not None else random.randint(201, 232)
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    if args.log_dir:  # the nodes' own logs, kept (by default ROS writes them under ~/.ros/log)
        os.environ["ROS_LOG_DIR"] = str(pathlib.Path(args.log_dir).resolve())
    bag_dir = workdir / "bags"
    mode = [f"lockstep:={str(args.lockstep).lower()}", "record:=true", "adapt:=true",
            f"bag_dir:={bag_dir}"]  # fmt: skip
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
    ticks: dict[int, float] = {}  # proprio stamp -> when it arrived
    answers: dict[int, float] = {}  # stamp -> when the first safe command of it arrived
    plans: dict[int, float] = {}  # stamp -> when the first forwarded plan of it arrived
    # The driver's own count: the step of each /simdist/episode message, so that ticks the
    # listener misses still count (episode -> [first, last] step; when the first and last came).
    steps: dict[int, list[int]] = {}
    announced: list[float] = []
    heard: set[tuple[int, int]] = set()  # (episode, step) of the episode messages received
    node.create_subscription(
        JointState,
        "/simdist/robot/proprio",
        lambda m: ticks.setdefault(ros_msgs.stamp_ns(m.header.stamp), time.monotonic()),
        LISTEN_QOS,
    )

    def on_episode(m: String) -> None:
        info = json.loads(m.data)
        episode, step = int(info["episode"]), int(info["step"])
        span = steps.setdefault(episode, [step, step])
        span[0], span[1] = min(span[0], step), max(span[1], step)
        heard.add((episode, step))
        now = time.monotonic()
        announced[:] = [announced[0] if announced else now, now]

    node.create_subscription(String, "/simdist/episode", on_episode, LISTEN_QOS)
    # Real time: forwarded plans' age (system clock) when the supervisor sent them, when the
    # listener's DDS reader received them (the bounded one) and when its callback ran.
    plan_age_ms: list[float] = []
    sent_age_ms: list[float] = []
    callback_age_ms: list[float] = []
    newest_plan = [time.monotonic()]  # when the newest forwarded plan arrived

    def on_safe(m: JointTrajectory, info: MessageInfo) -> None:
        now = time.monotonic()
        stamp = ros_msgs.stamp_ns(m.header.stamp)
        answers.setdefault(stamp, now)
        if m.header.frame_id == "joint_position":  # a plan: HOLD / DAMP are the watchdog's
            newest_plan[0] = now
            plans.setdefault(stamp, now)
            if not args.lockstep:
                plan_age_ms.append((info["received_timestamp"] - stamp) * 1e-6)
                sent_age_ms.append((info["source_timestamp"] - stamp) * 1e-6)
                callback_age_ms.append((time.time_ns() - stamp) * 1e-6)

    node.create_subscription(JointTrajectory, "/simdist/safe_command", on_safe, LISTEN_QOS)
    # Every WARN / ERROR status a node reported, first time each (name, message): what the
    # driver says when it stops ticking (e.g. its short-episode pause), the supervisor's reasons.
    reported: dict[tuple[str, str], float] = {}
    # Every WARN / ERROR status (name, kind), in order: the timeline counts them per sample
    # period, so it says when a problem began and what went on while it lasted.
    events: list[tuple[str, str]] = []
    t0 = time.monotonic()

    def on_diagnostics(m: DiagnosticArray) -> None:
        for st in m.status:
            level = st.level[0] if isinstance(st.level, bytes) else int(st.level)
            if level in (1, 2):
                key = (st.name, re.sub(r"[-\d.]+", "#", st.message))  # one per kind of message
                reported.setdefault(key, time.monotonic() - t0)
                events.append(key)  # list.append: safe beside the main thread's reads

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, LISTEN_QOS)
    # The listener spins in its own thread, not between the samples of the main loop.
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    rss: dict[str, list[tuple[float, float]]] = {}
    fds: dict[str, list[tuple[float, int]]] = {}
    bags: list[tuple[float, int, list[str]]] = []  # (t, bags on disk, unfinalised ones)
    command_age: list[tuple[float, float]] = []
    # per sample: forwarded plans and episodes so far, WARN / ERROR statuses since the previous
    timeline: list[dict] = []
    counted = 0  # events already counted in the timeline
    try:
        deadline = time.monotonic() + 180.0
        while not plans:  # every node up, the chain planning
            time.sleep(0.05)
            if time.monotonic() > deadline or launch.poll() is not None:
                raise RuntimeError(f"the {args.graph} graph never forwarded a plan")
        start = next_sample = time.monotonic()
        hung = False
        while time.monotonic() - start < 60.0 * args.minutes:
            time.sleep(max(0.0, min(next_sample - time.monotonic(), 0.5)))
            since = time.monotonic() - start - args.hang_planner_s
            if args.hang_planner_s and not hung and since >= 0:
                os.kill(pids["planner"], signal.SIGSTOP)  # alive, subscribed, silent: hung
                hung = True
            if hung and args.hang_for_s and since >= args.hang_for_s:
                os.kill(pids["planner"], signal.SIGCONT)  # the planner goes on
                hung, args.hang_planner_s = False, 0.0
            if time.monotonic() >= next_sample:
                t = time.monotonic() - start
                for name, pid in list(pids.items()):
                    mb, n = rss_mb(pid), open_fds(pid)
                    if mb is not None:
                        rss.setdefault(name, []).append((t, mb))
                    if n is not None:
                        fds.setdefault(name, []).append((t, n))
                on_disk = list_episode_bags(bag_dir)
                open_now = [b.name for b in unfinalised_bags(bag_dir)]
                bags.append((t, len(on_disk), open_now))
                command_age.append((t, time.monotonic() - newest_plan[0]))
                upto = len(events)
                since_last = Counter(events[counted:upto])
                counted = upto
                timeline.append({
                    "t": t, "command_age_s": command_age[-1][1], "plans": len(plans),
                    "episodes": len(steps),
                    "reported": {f"{n}: {k}": c for (n, k), c in sorted(since_last.items())},
                })  # fmt: skip
                next_sample += args.sample_s
            if launch.poll() is not None:
                raise RuntimeError(f"the graph stopped after {time.monotonic() - start:.0f} s")
        time.sleep(1.0)
    finally:
        if args.hang_planner_s and "planner" in pids:
            os.kill(pids["planner"], signal.SIGCONT)  # so that it can stop with the graph
        executor.shutdown()
        spinner.join(timeout=10)
        node.destroy_node()
        rclpy.shutdown()
        launch.send_signal(signal.SIGINT)
        launch.wait(timeout=60)
    # a tick is dropped if no safe command carries its stamp (the newest tick may be in flight)
    asked = sorted(ticks)[:-1]
    latency = np.array([(answers[s] - ticks[s]) * 1e3 for s in asked if s in answers])
    driver_ticks = sum(last - first + 1 for first, last in steps.values())
    said = sorted((t, f"{name}: {text}") for (name, text), t in reported.items())
    return {"rss": rss, "fds": fds, "bags": bags, "command_age_s": command_age,
            "ticks": len(asked), "answered": int(np.isin(asked, list(answers)).sum()),
            "planned": int(np.isin(asked, list(plans)).sum()),
            "driver_ticks": driver_ticks, "heard_ticks": len(heard),
            "driver_s": announced[1] - announced[0] if announced else 0.0,
            "nominal_hz": None if args.lockstep else 50.0 * realtime_factor,
            "latency_ms": latency, "plan_age_ms": np.array(plan_age_ms),
            "sent_age_ms": np.array(sent_age_ms), "callback_age_ms": np.array(callback_age_ms),
            "reported": said, "timeline": timeline}  # fmt: skip


def growth(series: list[tuple[float, float]]) -> tuple[float, float]:
    """(value at the first sample after the first minute, value at the end)."""
    after = [v for t, v in series if t >= 60.0] or [series[-1][1]]
    return after[0], series[-1][1]


def summary(result: dict, problems: list[str]) -> dict:
    """The figures of a soak as plain JSON types."""
    lat, age = result["latency_ms"], result["plan_age_ms"]
    return {
        "rss_mb": {n: growth(s) for n, s in result["rss"].items()},
        "fds": {n: growth(s) for n, s in result["fds"].items()},
        "samples": len(result["command_age_s"]),
        "bags": result["bags"][-1][1] if result["bags"] else 0,
        "max_unfinalised_bags": max((len(u) for _, _, u in result["bags"]), default=0),
        "lingering_bags": lingering(result["bags"]),
        "max_command_age_s": max((a for _, a in result["command_age_s"]), default=None),
        "ticks": result["ticks"],
        "answered": result["answered"],
        "planned": result["planned"],
        "driver_ticks": result["driver_ticks"],
        "heard_ticks": result["heard_ticks"],
        "driver_hz": driver_hz(result),
        "latency_ms_p99": float(np.percentile(lat, 99)) if lat.size else None,
        "plan_age_ms_p99": float(np.percentile(age, 99)) if age.size else None,
        **{
            f"plan_{key}_p99": float(np.percentile(result[key], 99)) if result[key].size else None
            for key in ("sent_age_ms", "callback_age_ms")
        },
        "reported": [f"{t:.1f} s {text}" for t, text in result.get("reported", [])],
        "timeline": result.get("timeline", []),
        "problems": problems,
    }


def driver_hz(result: dict) -> float | None:
    """The driver's tick rate by its own step count, over the span the listener heard it."""
    return result["driver_ticks"] / result["driver_s"] if result["driver_s"] > 0 else None


def lingering(bags: list[tuple[float, int, list[str]]]) -> list[str]:
    """Bags unfinalised at two consecutive samples that were not the newest (the episode still
    running) at the first: an ended episode's bag still open a whole sample period later. (A
    bag that was the running episode's at one sample may be in its grace period at the next.)"""
    stuck: set[str] = set()
    for (_, _, before), (_, _, now) in zip(bags, bags[1:]):
        stuck |= (set(before) - {max(before, default="")}) & set(now)
    return sorted(stuck)


def check(result: dict, bounds: SoakBounds = SoakBounds()) -> list[str]:
    """The bounds the soak's result violates, one line each (empty: within every bound)."""
    problems = []
    for name, series in sorted(result["rss"].items()):
        first, last = growth(series)
        pct = 100.0 * (last - first) / first
        if pct >= bounds.rss_growth_pct:
            problems.append(f"{name}: RSS grew {pct:.1f} % ({first:.1f} -> {last:.1f} MB)")
    for name, series in sorted(result["fds"].items()):
        first, last = growth(series)
        if last - first > bounds.fd_growth:
            problems.append(f"{name}: open fds grew by {last - first} ({first} -> {last})")
    stuck = lingering(result["bags"])
    if len(stuck) > bounds.lingering_bags:
        problems.append(f"bags unfinalised at two consecutive samples: {stuck}")
    age = max((a for _, a in result["command_age_s"]), default=float("inf"))
    if age > bounds.command_age_s:
        problems.append(f"no plan forwarded for {age:.2f} s (bound {bounds.command_age_s} s)")
    ticks = result["ticks"]
    if result["nominal_hz"] is None:  # lockstep
        dropped = ticks - result["answered"]
        if dropped > bounds.dropped_ticks:
            problems.append(f"{dropped} of {ticks} ticks dropped (bound {bounds.dropped_ticks})")
    else:
        share = result["planned"] / ticks if ticks else 0.0
        if share < bounds.min_planned_share:
            problems.append(
                f"a forwarded plan answered {result['planned']} of {ticks} ticks "
                f"({share:.2f}, bound {bounds.min_planned_share})"
            )
        age_ms = result["plan_age_ms"]
        p50, p99 = np.percentile(age_ms, [50, 99]) if age_ms.size else (np.inf, np.inf)
        if p50 > bounds.plan_age_median_ms or p99 > bounds.plan_age_p99_ms:
            problems.append(
                f"forwarded plans' age on arrival median {p50:.1f} ms, p99 {p99:.1f} ms "
                f"(bounds {bounds.plan_age_median_ms}, {bounds.plan_age_p99_ms} ms)"
            )
    heard = heard_share(result)
    if heard < bounds.min_heard_share:
        problems.append(
            f"the listener heard {result['heard_ticks']} of the driver's "
            f"{result['driver_ticks']} ticks ({heard:.2f}, bound {bounds.min_heard_share})"
        )
    return problems


def heard_share(result: dict) -> float:
    return result["heard_ticks"] / result["driver_ticks"] if result["driver_ticks"] else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    go2_graphs = sorted(g for g, v in desc.GRAPHS.items() if v.robot == "go2")
    parser.add_argument("--graph", default="go2_slope", choices=go2_graphs)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=10.0, help="sampling period")
    parser.add_argument("--samples", type=int, default=64, help="MPPI samples")
    parser.add_argument("--iterations", type=int, default=2, help="MPPI iterations")
    parser.add_argument("--lockstep", action="store_true", help="lockstep simulator")
    parser.add_argument("--domain", type=int, default=None, help="ROS domain (default: random)")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    parser.add_argument("--log-dir", default="", help="the graph's ROS_LOG_DIR (its node logs)")
    parser.add_argument(
        "--hang-planner-s",
        type=float,
        default=0.0,
        help="fault injection: SIGSTOP the planner this long into the soak (a hung planner; "
        "the soak must then fail); 0 = never",
    )
    parser.add_argument(
        "--hang-for-s",
        type=float,
        default=0.0,
        help="with --hang-planner-s: SIGCONT the planner after this long (0 = never)",
    )
    args = parser.parse_args()
    os.environ.setdefault("MENAGERIE_ROOT", str(ROOT.parent / "shared" / "menagerie"))
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    with tempfile.TemporaryDirectory() as tmp:
        r = soak(args, pathlib.Path(tmp))
    mode = "lockstep" if args.lockstep else "real time"
    print(f"== soak: {args.graph} ({mode}, recorder and adapter on), {args.minutes} min, "
          f"MPPI {args.samples} x {args.iterations} ==")  # fmt: skip
    print(f"{'node':20} {'RSS at 1 min (MB)':>18} {'at end':>8} {'growth':>8} {'fds':>10}")
    for name, series in sorted(r["rss"].items()):
        first, last = growth(series)
        f0, f1 = growth(r["fds"].get(name, [(0.0, 0)]))
        print(f"{name:20} {first:18.1f} {last:8.1f} {100 * (last - first) / first:7.1f}% "
              f"{f0:4d} -> {f1:<4d}")  # fmt: skip
    if r["bags"]:
        _, count, _ = r["bags"][-1]
        worst = max(len(u) for _, _, u in r["bags"])
        print(f"episode bags {count}, unfinalised at one sample at most {worst}, "
              f"lingering {len(lingering(r['bags']))}")  # fmt: skip
    ages = [a for _, a in r["command_age_s"]]
    if ages:
        print(f"command age at the samples: max {max(ages):.3f} s")
    dropped = r["ticks"] - r["answered"]
    hz = driver_hz(r)
    rate = f"{hz:.1f} ticks/s" if hz else "-"
    nominal = f" of {r['nominal_hz']:.0f} nominal" if r["nominal_hz"] else ""
    print(f"driver: {r['driver_ticks']} ticks by its step count ({rate}{nominal}); the listener "
          f"heard {r['heard_ticks']} ({100 * heard_share(r):.1f} %)")  # fmt: skip
    if args.lockstep:
        print(f"ticks {r['ticks']}, answered by a safe command {r['answered']}, dropped {dropped}")
    else:  # the real-time driver applies the newest command: an unanswered tick is no loss
        print(f"ticks seen {r['ticks']}, answered by a forwarded plan of their stamp "
              f"{r['planned']}, by any safe command {r['answered']}")  # fmt: skip
    lat = r["latency_ms"]
    if lat.size:
        p50, p95, p99 = np.percentile(lat, [50, 95, 99])
        print(f"tick -> safe command (ms): median {p50:.1f}, p95 {p95:.1f}, p99 {p99:.1f}, "
              f"max {lat.max():.1f}")  # fmt: skip
    ages = (("plan_age_ms", "on arrival at the listener's reader"), ("sent_age_ms", "when sent"),
            ("callback_age_ms", "in the listener's callback"))  # fmt: skip
    for key, what in ages:
        if r[key].size:
            p50, p99 = np.percentile(r[key], [50, 99])
            print(f"forwarded plans' age {what} (ms): median {p50:.1f}, p99 {p99:.1f}, "
                  f"max {r[key].max():.1f}")  # fmt: skip
    for t, text in r["reported"]:
        print(f"  reported at {t:.1f} s: {text}")
    problems = check(r)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary(r, problems), indent=1))
    if problems:  # when each began: per sample, plans, episodes and the statuses reported since
        print("timeline (s since the first plan: command age, forwarded plans and episodes so "
              "far; WARN / ERROR statuses since the previous sample, counted):")  # fmt: skip
        for row in r["timeline"]:
            said = "; ".join(f"{k} x{c}" for k, c in row["reported"].items()) or "-"
            print(f"  {row['t']:6.1f} s  age {row['command_age_s']:6.2f} s  plans "
                  f"{row['plans']:6d}  episodes {row['episodes']:4d}  {said}")  # fmt: skip
    for line in problems:
        print(f"OUT OF BOUNDS: {line}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
