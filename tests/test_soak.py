"""A 3-minute soak of the Go2 sim graph in real time, recorder and adapter on (slow).

`benchmarks/soak.py` samples each node's RSS and open fds, the episode bags and the command age
every 10 s and holds them to `SoakBounds` (docs/safety.md, "Soak"); it exits 1 on a violated
bound. The 10-minute and longer runs are the benchmark's, by hand.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NODES = {"mujoco_driver", "ingestion", "safety_supervisor", "planner", "recorder", "adapter"}


@pytest.mark.slow
def test_a_three_minute_real_time_soak_stays_within_its_bounds(tmp_path, ros_domain):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--graph", "go2_flat",
         "--minutes", "3", "--sample-s", "10", "--samples", "16", "--iterations", "1",
         "--domain", str(ros_domain), "--json", str(out)],
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
