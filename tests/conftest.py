"""Test-wide setup: offline model paths, headless rendering, an isolated ROS domain per run."""

import fcntl
import os
import pathlib
import random
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

os.environ.setdefault("MENAGERIE_ROOT", str(SHARED / "menagerie"))
os.environ.setdefault("SIMDIST_GO2_EXPERTS", str(SHARED / "simdist_go2_experts"))
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
os.environ.setdefault("ROS_LOCALHOST_ONLY", "1")

_LOCKS = pathlib.Path(tempfile.gettempdir()) / "simdist_ros_domains"


def claim_domain(low: int, high: int):
    """An unused DDS domain id in [low, high], held through an flock until the file is closed.

    Every test run on this machine (other checkouts, CI, a second pytest) claims through the same
    lock files, so two live graphs never share a domain and never cross-talk.
    """
    _LOCKS.mkdir(exist_ok=True)
    ids = list(range(low, high + 1))
    random.Random(os.getpid()).shuffle(ids)
    for domain in ids:
        handle = open(_LOCKS / f"{domain}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return domain, handle
        except BlockingIOError:
            handle.close()
    raise RuntimeError(f"every ROS domain id in [{low}, {high}] is held by another test run")


# The session's own domain, held for the whole session: unless the caller chose one, every test
# process claims its own. pytest-xdist workers inherit the controller's environment, so a
# domain this conftest claimed in the controller (marked by SIMDIST_TEST_DOMAIN_OF) is not theirs.
if "ROS_DOMAIN_ID" not in os.environ or (
    os.environ.get("SIMDIST_TEST_DOMAIN_OF") not in (None, str(os.getpid()))
):
    _SESSION_DOMAIN, _SESSION_LOCK = claim_domain(1, 100)
    os.environ["ROS_DOMAIN_ID"] = str(_SESSION_DOMAIN)
    os.environ["SIMDIST_TEST_DOMAIN_OF"] = str(os.getpid())

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # tests share 2 cores with the ROS node processes they start


@pytest.fixture
def ros_domain(monkeypatch):
    """A fresh, exclusively held ROS_DOMAIN_ID for tests that start a graph in subprocesses."""
    domain, handle = claim_domain(101, 200)
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    yield domain
    handle.close()
