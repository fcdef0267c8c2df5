"""A 3-minute soak of the Go2 sim graph in real time, recorder and adapter on (slow).

`benchmarks/soak.py` samples each node's RSS and open fds, the episode bags and the command age
every 10 s and holds them to `SoakBounds` (docs/safety.md, "Soak"); it exits 1 on a violated
bound. The 10-minute and longer runs are the benchmark's, by hand.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import soak  # noqa: E402 - the benchmark script, beside its sibling ros_graph.py

NODES = {"mujoco_driver", "ingestion", "safety_supervisor", "planner", "recorder", "adapter"}


@pytest.mark.slow
@pytest.mark.alone
def test_a_three_minute_real_time_soak_stays_within_its_bounds(tmp_path, ros_domain):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--graph", "go2_flat",
         "--minutes", "3", "--sample-s", "10", "--samples", "16", "--iterations", "1",
         "--domain", str(ros_domain), "--json", str(out), "--log-dir", str(tmp_path / "log")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    log = run.stdout + run.stderr[-3000:]
    assert out.is_file(), log
    figures = json.loads(out.read_text())
    assert run.returncode == 0 and not figures["problems"], log
    assert set(figures["rss_mb"]) >= NODES and set(figures["fds"]) >= NODES, figures
    assert figures["samples"] >= 17  # every 10 s for 3 min
    # the graph ran, planned and recorded
    assert figures["bags"] >= 1 and figures["ticks"] >= 100 and figures["answered"] >= 1, figures


def _result(**over) -> dict:
    """A soak result within every bound: 3 min, samples every 10 s."""
    times = [10.0 * k for k in range(19)]
    base = {
        "rss": {"planner": [(t, 700.0 + 0.01 * t) for t in times]},
        "fds": {"planner": [(t, 18) for t in times]},
        "bags": [(t, k, [f"go2_ep{k:04d}"]) for k, t in enumerate(times)],
        "command_age_s": [(t, 0.02) for t in times],
        "ticks": 100, "answered": 100, "planned": 60,
        "driver_ticks": 9000, "heard_ticks": 9000, "driver_s": 180.0, "nominal_hz": 50.0,
        "latency_ms": np.ones(3), "plan_age_ms": np.full(100, 40.0),
    }  # fmt: skip
    return {**base, **over}


def test_soak_bounds_flag_growth_leaked_fds_lingering_bags_and_a_silent_supervisor():
    assert soak.check(_result()) == []
    times = [10.0 * k for k in range(19)]
    grown = soak.check(_result(rss={"adapter": [(t, 700.0 + 0.5 * t) for t in times]}))
    assert len(grown) == 1 and grown[0].startswith("adapter: RSS grew")
    leaked = soak.check(_result(fds={"recorder": [(t, 18 + int(t // 10)) for t in times]}))
    assert len(leaked) == 1 and "open fds grew by 12" in leaked[0]
    # several bags open at one sample (short episodes) is fine; one left open is not
    burst = [(t, k, [f"go2_ep{k:04d}"]) for k, t in enumerate(times)]
    burst[5] = (50.0, 5, ["go2_ep0003", "go2_ep0004", "go2_ep0005"])
    assert soak.check(_result(bags=burst)) == []
    # the running episode's bag at one sample, in its grace period at the next: fine
    graced = [(t, k, [f"go2_ep{k:04d}"]) for k, t in enumerate(times)]
    graced[6] = (60.0, 6, ["go2_ep0005", "go2_ep0006"])
    assert soak.check(_result(bags=graced)) == []
    left = [(t, k, ["go2_ep0001", f"go2_ep{k:04d}"]) for k, t in enumerate(times)]
    assert soak.check(_result(bags=left)) == [
        "bags unfinalised at two consecutive samples: ['go2_ep0001']"
    ]
    silent = soak.check(_result(command_age_s=[(t, 0.02 if t < 100 else 3.0) for t in times]))
    assert silent == ["no plan forwarded for 3.00 s (bound 1.0 s)"]


def test_soak_bounds_flag_dropped_ticks_unplanned_ticks_old_plans_and_a_deaf_listener():
    lockstep = _result(nominal_hz=None, answered=97)
    assert soak.check(lockstep) == ["3 of 100 ticks dropped (bound 0)"]
    assert soak.check(_result(nominal_hz=None)) == []
    unplanned = soak.check(_result(planned=20))
    assert unplanned == ["a forwarded plan answered 20 of 100 ticks (0.20, bound 0.25)"]
    old = np.concatenate([np.full(95, 40.0), np.full(5, 1500.0)])
    assert soak.check(_result(plan_age_ms=old)) == [
        "forwarded plans' age on arrival median 40.0 ms, p99 1500.0 ms (bounds 100.0, 1000.0 ms)"
    ]
    late = soak.check(_result(plan_age_ms=np.full(100, 150.0)))
    assert late and late[0].startswith("forwarded plans' age on arrival median 150.0 ms")
    assert soak.check(_result(plan_age_ms=np.zeros(0)))[0].startswith("forwarded plans' age")
    deaf = soak.check(_result(heard_ticks=1654))
    assert deaf == ["the listener heard 1654 of the driver's 9000 ticks (0.18, bound 0.95)"]
    assert soak.driver_hz(_result()) == 50.0


@pytest.mark.slow
@pytest.mark.alone
def test_a_soak_with_a_hung_planner_fails(tmp_path, ros_domain):
    """The planner is stopped (SIGSTOP: alive, silent) 30 s into a 1-minute soak. The
    supervisor's watchdog keeps /simdist/safe_command busy with HOLD and DAMP, but no plan is
    forwarded: the soak exits 1 on its command age."""
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--graph", "go2_flat",
         "--minutes", "1", "--sample-s", "5", "--samples", "16", "--iterations", "1",
         "--hang-planner-s", "30", "--domain", str(ros_domain), "--json", str(out),
         "--log-dir", str(tmp_path / "log")],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    log = run.stdout + run.stderr[-3000:]
    assert out.is_file(), log
    figures = json.loads(out.read_text())
    assert run.returncode == 1, log
    assert any(p.startswith("no plan forwarded for") for p in figures["problems"]), figures
    assert figures["max_command_age_s"] > 20.0, figures
    # The timeline says when: plans are forwarded up to the hang and none from a sample after it
    # (the newest plans in flight at the SIGSTOP still arrive), while the watchdog reports.
    rows = figures["timeline"]
    before = [r for r in rows if r["t"] < 30.0]
    after = [r for r in rows if r["t"] >= 35.0]
    assert before and after and before[-1]["plans"] > before[0]["plans"], rows
    assert after[0]["plans"] == after[-1]["plans"] and after[-1]["command_age_s"] > 20.0, rows
    assert any("watchdog: no plan" in k for r in after for k in r["reported"]), rows
    assert any(f.name.endswith(".log") for f in (tmp_path / "log").iterdir()), "no node logs kept"
