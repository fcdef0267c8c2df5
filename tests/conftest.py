"""Test-wide setup: offline model paths, headless rendering, an isolated ROS domain per run."""
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

os.environ.setdefault("MENAGERIE_ROOT", str(SHARED / "menagerie"))
os.environ.setdefault("SIMDIST_GO2_EXPERTS", str(SHARED / "simdist_go2_experts"))
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
# A distinct DDS domain per test run (ids 1..100), so parallel runs never cross-talk.
os.environ.setdefault("ROS_DOMAIN_ID", str(1 + os.getpid() % 100))
os.environ.setdefault("ROS_LOCALHOST_ONLY", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def ros_domain(monkeypatch):
    """A fresh ROS_DOMAIN_ID for tests that start their own graph in subprocesses."""
    import random

    domain = str(random.Random(os.getpid() ^ id(monkeypatch)).randint(101, 200))
    monkeypatch.setenv("ROS_DOMAIN_ID", domain)
    return int(domain)
