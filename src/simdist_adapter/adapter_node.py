"""Adapter node: re-fits the dynamics f from recorded episodes and hot-swaps the planner's model.

Rounds run in a worker PROCESS (the planner's control loop and this node's executor never stall
on training). A round is started by `~/adapt` (std_srvs/Trigger) or automatically once
`adapt_every_episodes` new finished episode bags exist; a deployed candidate is announced to the
planner through its `~/load_model` service (the planner's `checkpoint` parameter points at the
registry's `deployed` link). `~/rollback` re-deploys the previous version. Progress and results
go to `/simdist/adapter/status` (std_msgs/String, JSON) and `/diagnostics`.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import time

import rclpy
import torch
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.client import Client
from rclpy.node import Node
from std_msgs.msg import String
from std_srvs.srv import Trigger

from robot_drivers.described import Param, settings
from robot_drivers.diagnostics import Diagnostics, Level
from robot_drivers.node_params import NodeParams
from robot_drivers.node_spin import spin_until_shutdown
from robot_drivers.specs import robot_spec
from simdist_adapter.adapter import adapt_round
from simdist_adapter.bags import SIDECAR, BagError, EpisodeMeta, list_episode_bags
from simdist_adapter.finetune import AdaptConfig
from simdist_adapter.registry import ModelRegistry, RegistryError

STATUS_TOPIC = "/simdist/adapter/status"

# The round's settings are AdaptConfig's described fields (their doc and range); the node adds
# its own. max_steps: a node's round defaults to a budget (0 = no cap), so that a robot adapts
# between episodes; AdaptConfig's None is "epochs full passes".
ROUND_SETTINGS = tuple(s for s in settings(AdaptConfig()))
NODE_MAX_STEPS = 2000
PARAMS = (
    Param(
        "robot", "ur5e", "robot whose observation layout the bags hold (ur5e | go2)", read_only=True
    ),
    Param("registry_dir", "models", "model registry: versions/, deployed link, history.json"),
    Param("checkpoint", "", "pretrained checkpoint that seeds an empty registry as v0000"),
    Param("bag_dir", "bags", "where the recorder writes episode bags"),
    Param("work_dir", "adapt_work", "scratch space for D_real and round logs"),
    Param("planner_node", "planner", "name of the planner node whose ~/load_model is called"),
    Param(
        "adapt_every_episodes",
        20,
        "automatic round after this many new episodes (0 = only on request)",
        0,
        100000,
    ),
    *ROUND_SETTINGS,
    Param(
        "max_steps",
        NODE_MAX_STEPS,
        "cap on optimiser steps per round (0 = no cap)",
        0,
        10000000,
    ),
    Param(
        "poll_period_s", 1.0, "how often new bags and the worker's progress are checked", 0.05, 60.0
    ),
)


def _check(name: str, value, values: dict) -> str | None:
    """Cross-parameter rules, so a bad setting is refused when set, not when a round starts."""
    if name == "sim_data" and value and not pathlib.Path(value).exists():
        return f"sim_data {value}: no such file or directory"
    if name in ("sim_data", "sim_replay") and values["sim_replay"] > 0 and not values["sim_data"]:
        return "sim_replay > 0 needs sim_data (the simulation shards to replay)"
    return None


# The niceness of the adapter and its fine-tuning worker: a round takes the CPU the control loop
# leaves idle, so the planner's threads are not descheduled in the middle of a plan
# (docs/adaptation.md).
WORKER_NICENESS = 19


def lower_cpu_priority() -> None:
    """This process (and the children it starts) at niceness WORKER_NICENESS. On Linux with
    autogroup scheduling a niceness only orders the tasks of one session, and the launchers start
    every node in a session of its own, so the session's group gets it too."""
    os.nice(WORKER_NICENESS - os.nice(0))
    try:
        pathlib.Path("/proc/self/autogroup").write_text(str(WORKER_NICENESS))
    except OSError:
        pass  # no autogroup (other kernels, containers): the niceness alone orders the tasks


def _start_worker() -> None:
    """The fine-tuning worker process's initializer: lowest CPU priority, one torch thread."""
    lower_cpu_priority()
    torch.set_num_threads(1)


def run_round(args: dict) -> dict:
    """Worker-process entry: one adaptation round; progress lines go to args['progress_file']."""

    progress_file = pathlib.Path(args["progress_file"])

    def progress(step, total, loss):
        if step == 1 or step == total or step % 20 == 0:
            progress_file.write_text(json.dumps({"step": step, "total": total, "loss": loss}))

    report = adapt_round(
        ModelRegistry(args["registry_dir"]),
        args["bags"],
        robot_spec(args["robot"]),
        args["work_dir"],
        AdaptConfig(**args["config"]),
        progress=progress,
    )
    return report.to_dict()


def finished_bags(bag_dir) -> list[str]:
    """Bags of episodes that ended (their sidecar says complete); cheap enough to poll.

    A corrupt bag whose sidecar claims completion is still listed: the round's build step skips
    it with a clear message, so nothing else is lost.
    """
    out = []
    for p in list_episode_bags(bag_dir):
        try:
            if EpisodeMeta.from_json((p / SIDECAR).read_text(), str(p)).complete:
                out.append(str(p))
        except (BagError, OSError):
            continue  # half-written sidecar or foreign directory: not a finished episode
    return out


class AdapterNode(Node):
    def __init__(self, **kwargs):
        super().__init__("adapter", **kwargs)
        self.params = NodeParams(self, PARAMS, _check)
        self.diag = Diagnostics(self, hardware_id="adapter")
        self.registry = ModelRegistry(self.params["registry_dir"])
        if not self.registry.history() and self.params["checkpoint"]:
            self.registry.init_from(self.params["checkpoint"])
        self.status_pub = self.create_publisher(String, STATUS_TOPIC, 10)
        self.create_service(Trigger, "~/adapt", self._on_adapt)
        self.create_service(Trigger, "~/rollback", self._on_rollback)
        planner = self.params["planner_node"]
        self.param_client: Client = self.create_client(SetParameters, f"/{planner}/set_parameters")
        self.load_client: Client = self.create_client(Trigger, f"/{planner}/load_model")
        ctx = multiprocessing.get_context("spawn")
        self.pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=ctx, initializer=_start_worker
        )
        self.future: concurrent.futures.Future | None = None
        self.round = 0
        self.episodes_at_last_round = len(finished_bags(self.params["bag_dir"]))
        self.rounds: list[dict] = []
        self.create_timer(self.params["poll_period_s"], self._poll)
        self._status("idle", deployed=self.registry.deployed_version)
        self.diag.set("adaptation", Level.OK, f"idle; deployed {self.registry.deployed_version}")

    # -- services
    def _on_adapt(self, request, response):
        response.success, response.message = self._start_round("requested")
        return response

    def _on_rollback(self, request, response):
        if self.future is not None:
            response.success, response.message = (
                False,
                "an adaptation round is running; roll back after it",
            )
            return response
        try:
            version = self.registry.rollback()
        except RegistryError as exc:
            response.success, response.message = False, str(exc)
            return response
        self._request_swap()
        response.success, response.message = True, f"rolled back to {version}"
        self._status("rolled_back", deployed=version)
        return response

    # -- rounds
    def _start_round(self, why: str) -> tuple[bool, str]:
        if self.future is not None:
            return False, f"round {self.round} is still running"
        if not self.registry.history():
            return (
                False,
                "registry is empty: set the checkpoint parameter to a pretrained checkpoint",
            )
        bags = finished_bags(self.params["bag_dir"])
        if len(bags) < 2:
            return (
                False,
                f"need at least 2 finished episode bags in {self.params['bag_dir']}, "
                f"found {len(bags)}",
            )
        self.round += 1
        work = pathlib.Path(self.params["work_dir"]) / f"round{self.round:03d}"
        work.mkdir(parents=True, exist_ok=True)
        p = self.params
        config = {s.name: p[s.name] for s in ROUND_SETTINGS}
        config["max_steps"] = p["max_steps"] or None
        self.progress_file = work / "progress.json"
        self.future = self.pool.submit(
            run_round,
            {
                "registry_dir": p["registry_dir"],
                "bags": bags,
                "robot": p["robot"],
                "work_dir": str(work),
                "config": config,
                "progress_file": str(self.progress_file),
            },
        )
        self.episodes_at_last_round = len(bags)
        self.round_started = time.monotonic()
        self._status("adapting", round=self.round, episodes=len(bags), reason=why)
        self.diag.set(
            "adaptation", Level.OK, f"round {self.round} running on {len(bags)} episodes ({why})"
        )
        return True, f"round {self.round} started on {len(bags)} episodes"

    def _poll(self) -> None:
        self.params.apply()
        if self.future is None:
            every = self.params["adapt_every_episodes"]
            if (
                every
                and len(finished_bags(self.params["bag_dir"])) - self.episodes_at_last_round
                >= every
            ):
                self._start_round(f"{every} new episodes")
            return
        if not self.future.done():
            if self.progress_file.exists():
                try:
                    self._status(
                        "adapting", round=self.round, **json.loads(self.progress_file.read_text())
                    )
                except json.JSONDecodeError:
                    pass  # the worker is rewriting it; next poll reads it
            return
        future, self.future = self.future, None
        try:
            report = future.result()
        except Exception as exc:  # noqa: BLE001 - the node survives a failed round and says why
            self.diag.set("adaptation", Level.ERROR, f"round {self.round} failed: {exc}")
            self._status("failed", round=self.round, error=str(exc))
            return
        report["round"] = self.round
        report["seconds_wall"] = time.monotonic() - self.round_started
        self.rounds.append(report)
        if report["deployed"]:
            self._request_swap()
        level = Level.OK if report["deployed"] else Level.WARN
        self.diag.set(
            "adaptation",
            level,
            f"round {self.round}: {report['reason']}",
            deployed=report["version"],
        )
        self._status("deployed" if report["deployed"] else "refused", **report)

    def _request_swap(self) -> None:
        """Point the planner's `checkpoint` at the registry's deployed link, then have it reload."""
        if not (self.param_client.service_is_ready() and self.load_client.service_is_ready()):
            self.diag.set(
                "hot_swap",
                Level.WARN,
                f"{self.load_client.srv_name} not available; the planner "
                f"loads {self.registry.link} when started with checkpoint:={self.registry.link}",
            )
            return
        value = ParameterValue(
            type=ParameterType.PARAMETER_STRING, string_value=str(self.registry.link)
        )
        request = SetParameters.Request(parameters=[Parameter(name="checkpoint", value=value)])
        self.param_client.call_async(request).add_done_callback(self._on_checkpoint_set)

    def _on_checkpoint_set(self, future) -> None:
        result = future.result().results[0]
        if not result.successful:
            self.diag.set(
                "hot_swap",
                Level.ERROR,
                f"planner refused checkpoint {self.registry.link}: {result.reason}",
            )
            self._status(
                "swap_failed", message=result.reason, deployed=self.registry.deployed_version
            )
            return
        self.load_client.call_async(Trigger.Request()).add_done_callback(self._on_swapped)

    def _on_swapped(self, future) -> None:
        result = future.result()
        level = Level.OK if result.success else Level.ERROR
        self.diag.set("hot_swap", level, f"planner load_model: {result.message}")
        self._status(
            "swapped" if result.success else "swap_failed",
            message=result.message,
            deployed=self.registry.deployed_version,
        )

    def _status(self, state: str, **fields) -> None:
        self.status_pub.publish(
            String(data=json.dumps({"state": state, "stamp": time.time(), **fields}, default=str))
        )

    def destroy_node(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.diag.destroy()
        return super().destroy_node()


def main(args=None) -> None:
    # The whole node is background work: at the lowest CPU priority its fine-tuning worker is
    # too from its start (importing torch takes seconds of CPU), not only once it runs rounds.
    lower_cpu_priority()
    with rclpy.init(args=args):
        node = AdapterNode()
        spin_until_shutdown(node)


if __name__ == "__main__":
    main()
