"""Adapter node over real DDS: adapt on request, hot-swap the real planner node, roll back.

Adaptation runs in a worker process.
"""

import json
import subprocess
import sys
import threading
import time

import pytest
import rclpy
import torch
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from std_msgs.msg import String
from std_srvs.srv import Trigger

from simdist_adapter.adapter_node import STATUS_TOPIC, AdapterNode
from simdist_adapter.registry import ModelRegistry
from simdist_planner.model.checkpoint import save_checkpoint, weight_tensors
from simdist_planner.ros.planner_node import PlannerNode
from test_adapter import small_model, write_episode_bag


def _weights_equal(a, b) -> bool:
    wa, wb = weight_tensors(a), weight_tensors(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.timeout(300)
def test_adapt_service_deploys_and_hot_swaps_then_rolls_back(tmp_path, ros_domain):
    registry = ModelRegistry(tmp_path / "registry")
    save_checkpoint(small_model(), tmp_path / "pretrained")
    for i in range(4):
        write_episode_bag(tmp_path / "bags" / f"ep{i}", seed=i)

    rclpy.init()
    try:
        planner = PlannerNode(
            parameter_overrides=[
                Parameter("checkpoint", value=str(tmp_path / "pretrained")),
                Parameter("horizon", value=3),
                Parameter("num_samples", value=16),
                Parameter("num_elites", value=4),
                Parameter("iterations", value=1),
            ]
        )
        adapter = AdapterNode(
            parameter_overrides=[
                Parameter("robot", value="go2"),
                Parameter("registry_dir", value=str(registry.root)),
                Parameter("checkpoint", value=str(tmp_path / "pretrained")),
                Parameter("bag_dir", value=str(tmp_path / "bags")),
                Parameter("work_dir", value=str(tmp_path / "work")),
                Parameter("adapt_every_episodes", value=0),
                Parameter("batch_size", value=16),
                Parameter("lr", value=3e-3),
                Parameter("max_steps", value=40),
                Parameter("warmup_steps", value=4),
                Parameter("holdout", value=0.25),
                Parameter("poll_period_s", value=0.2),
            ]
        )
        v0 = registry.load_deployed()  # the adapter seeded the registry from the pretrained model
        refused = adapter.set_parameters([Parameter("sim_replay", value=0.5)])[0]
        assert not refused.successful and "needs sim_data" in refused.reason
        refused = adapter.set_parameters([Parameter("sim_data", value=str(tmp_path / "missing"))])[
            0
        ]
        assert not refused.successful and "no such file" in refused.reason
        client_node = rclpy.create_node("adapter_test_client")
        statuses: list[dict] = []
        client_node.create_subscription(
            String, STATUS_TOPIC, lambda m: statuses.append(json.loads(m.data)), 10
        )
        adapt = client_node.create_client(Trigger, "/adapter/adapt")
        rollback = client_node.create_client(Trigger, "/adapter/rollback")
        executor = MultiThreadedExecutor(num_threads=4)
        for n in (planner, adapter, client_node):
            executor.add_node(n)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()

        def call(client) -> Trigger.Response:
            assert client.wait_for_service(timeout_sec=10.0)
            future = client.call_async(Trigger.Request())
            deadline = time.monotonic() + 30
            while not future.done() and time.monotonic() < deadline:
                time.sleep(0.05)
            return future.result()

        def wait_for(states, timeout=240) -> dict:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                found = [s for s in statuses if s["state"] in states]
                if found:
                    statuses.clear()
                    return found[-1]
                time.sleep(0.1)
            raise AssertionError(f"no status in {states}; saw {statuses}")

        started = call(adapt)
        assert started.success, started.message
        busy = call(adapt)
        assert not busy.success and "still running" in busy.message
        assert planner.core.loaded is not None and _weights_equal(planner.core.loaded.model, v0)
        swapped = wait_for({"swapped", "swap_failed", "refused", "failed"})
        assert swapped["state"] == "swapped", swapped
        assert registry.deployed_version == "v0001"
        assert _weights_equal(planner.core.loaded.model, registry.load_deployed())
        assert not _weights_equal(planner.core.loaded.model, v0)
        assert planner.get_parameter("checkpoint").value == str(registry.link)

        rolled = call(rollback)
        assert rolled.success and "v0000" in rolled.message
        assert wait_for({"swapped", "swap_failed"})["state"] == "swapped"
        assert _weights_equal(planner.core.loaded.model, v0)
        executor.shutdown()
        for n in (planner, adapter, client_node):
            n.destroy_node()
    finally:
        rclpy.try_shutdown()


_PRIORITY = """
import os, pathlib
from simdist_adapter.adapter_node import WORKER_NICENESS, lower_cpu_priority
lower_cpu_priority()
group = pathlib.Path("/proc/self/autogroup")
print(os.nice(0), WORKER_NICENESS, group.read_text().split()[-1] if group.exists() else "none")
"""


def test_adaptation_runs_at_the_lowest_cpu_priority_in_its_own_session():
    """A fine-tuning round must not deschedule the planner: the adapter (and the worker it
    starts) take niceness 19, also as their session's autogroup where the kernel groups
    sessions (the launchers start each node in a session of its own)."""
    out = subprocess.run(
        [sys.executable, "-c", _PRIORITY],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        start_new_session=True,
    ).stdout.split()
    nice, wanted, group = int(out[0]), int(out[1]), out[2]
    assert nice == wanted == 19
    assert group in ("19", "none")
