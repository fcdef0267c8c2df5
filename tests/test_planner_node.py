"""Planner node over real DDS: parameters set as rqt does, hot swap without a dropped tick, NaN
guard, parameter defaults per robot.

The node runs as its own process (lockstep: one tick per observation) with a small randomly
initialised UR5e world model; the test plays ingestion, publishing observations and reading
the node's action, plan, values and diagnostics.
"""

import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
import rclpy
import torch
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.node import Node
from rclpy.parameter import Parameter as NodeParameter
from sensor_msgs.msg import Image, JointState
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from checkpoint_helpers import make_checkpoint
from robot_drivers import ros_msgs
from robot_drivers.interface import Observation
from robot_drivers.specs import robot_spec
from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.config import AttentionConfig, go2_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning.config import GO2_TEMPERATURE, PLANNER_FIELDS, planner_config_for
from simdist_planner.planning.planner import bf16_supported
from simdist_planner.ros.planner_core import load_world_model, resolve_robot
from simdist_planner.ros.planner_node import QOS, PlannerNode, node_params

PLANNER = str(pathlib.Path(sys.executable).parent / "planner_node")
SPEC = robot_spec("ur5e")
BF16_CPU = bf16_supported(torch.device("cpu"))


class Ingestion:
    """The test's stand-in for ingestion: publishes complete observations, collects outputs."""

    def __init__(self):
        rclpy.init()
        self.node = Node("planner_test")
        self.rng = np.random.default_rng(0)
        self.images = {
            c: self.node.create_publisher(Image, f"/simdist/observation/image/{c}", QOS)
            for c in SPEC.cameras
        }
        self.proprio = self.node.create_publisher(JointState, "/simdist/observation/proprio", QOS)
        self.actions, self.plans, self.values, self.diags = {}, {}, {}, []
        n = self.node
        n.create_subscription(
            JointTrajectory, "/simdist/action", lambda m: self._keep(self.actions, m), QOS
        )
        n.create_subscription(
            JointTrajectory, "/simdist/plan", lambda m: self._keep(self.plans, m), QOS
        )
        n.create_subscription(
            JointTrajectory, "/simdist/values", lambda m: self._keep(self.values, m), QOS
        )
        n.create_subscription(DiagnosticArray, "/diagnostics", self.diags.append, QOS)
        self.set_params = n.create_client(SetParameters, "/planner/set_parameters")
        self.load_model = n.create_client(Trigger, "/planner/load_model")
        self.stamp = 1_000_000_000
        self.realtime = False

    @staticmethod
    def _keep(store, msg):
        store[ros_msgs.stamp_ns(msg.header.stamp)] = msg

    def spin(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            rclpy.spin_once(self.node, timeout_sec=0.02)

    def wait(self, predicate, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            rclpy.spin_once(self.node, timeout_sec=0.02)
        return False

    def publish(self) -> int:
        """One observation (a new tick) once the planner listens; returns its stamp."""
        pubs = [self.proprio, *self.images.values()]
        assert self.wait(lambda: all(p.get_subscription_count() > 0 for p in pubs), 60.0), (
            "planner never subscribed"
        )
        now = self.node.get_clock().now().nanoseconds
        self.stamp = (
            now if self.realtime else self.stamp + 200_000_000
        )  # wall clock / lockstep ticks
        obs = Observation(
            stamp=0.0, proprio=self.rng.normal(size=SPEC.proprio_dim).astype(np.float32)
        )
        for cam, pub in self.images.items():
            pub.publish(
                ros_msgs.image_to_msg(
                    self.rng.integers(0, 255, (*SPEC.image_shape, 3), dtype=np.uint8),
                    self.stamp,
                    cam,
                )
            )
        self.proprio.publish(ros_msgs.proprio_to_msg(obs, SPEC, self.stamp))
        return self.stamp

    def tick(self, timeout=20.0) -> bool:
        """Publish an observation and wait for its action; False if none came."""
        stamp = self.publish()
        return self.wait(lambda: stamp in self.actions, timeout)

    def call(self, client, request, timeout=60.0):
        assert client.wait_for_service(timeout_sec=30.0), f"{client.srv_name} not available"
        future = client.call_async(request)
        assert self.wait(future.done, timeout), f"{client.srv_name} did not answer"
        return future.result()

    def set(self, **values):
        """SetParameters exactly as rqt_reconfigure sends it."""
        request = SetParameters.Request()
        for name, value in values.items():
            if isinstance(value, bool):
                pv = ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=value)
            elif isinstance(value, int):
                pv = ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=value)
            elif isinstance(value, float):
                pv = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=value)
            else:
                pv = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=value)
            request.parameters.append(Parameter(name=name, value=pv))
        return self.call(self.set_params, request).results

    def planning_status(self, since: int = 0):
        """Key-values of the newest 'planning' diagnostic (after index `since`)."""
        for array in reversed(self.diags[since:]):
            for status in array.status:
                if status.name == "planner: planning":
                    return status, {kv.key: kv.value for kv in status.values}
        return None, {}

    def close(self):
        self.node.destroy_node()
        rclpy.shutdown()


@pytest.fixture
def planner(tmp_path, ros_domain):
    procs = []

    def start(checkpoint, *params):
        cmd = [PLANNER, "--ros-args", "-r", "__node:=planner", "-p", f"checkpoint:={checkpoint}",
               "-p", "lockstep:=true", "-p", "num_samples:=32", "-p", "num_elites:=8",
               "-p", "iterations:=2"]  # fmt: skip
        for p in params:
            cmd += ["-p", p]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        return proc

    ingestion = Ingestion()
    yield start, ingestion
    ingestion.close()
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def test_set_parameters_applied_or_rejected_with_reason_and_used_next_tick(tmp_path, planner):
    start, ing = planner
    start(make_checkpoint(tmp_path / "ck"))
    assert ing.tick(60.0), "no action for the first observation"
    stamp = max(ing.actions)
    assert ing.wait(lambda: stamp in ing.plans and stamp in ing.values)
    assert len(ing.plans[stamp].points) == 5 and len(ing.values[stamp].points) == 5
    assert ing.actions[stamp].header.frame_id == "ee_delta"

    (ok,) = ing.set(num_samples=48)
    assert ok.successful
    (bad,) = ing.set(temperature=500.0)  # outside the declared range
    assert not bad.successful and "temperature" in bad.reason
    (bad_combo,) = ing.set(num_elites=100)  # in range, but more elites than candidates
    assert not bad_combo.successful and "num_elites" in bad_combo.reason
    (bad_horizon,) = ing.set(horizon=7)
    assert not bad_horizon.successful and "must equal the model's horizon T=5" in bad_horizon.reason
    (bad_start,) = ing.set(warm_start="previous")
    assert not bad_start.successful and "warm_start must be one of" in bad_start.reason
    (ok_start,) = ing.set(warm_start="policy")
    assert ok_start.successful
    (bad_prior,) = ing.set(policy_prior=-1.0)
    assert not bad_prior.successful and "policy_prior" in bad_prior.reason
    (ok_prior,) = ing.set(policy_prior=20.0)
    assert ok_prior.successful
    (bad_precision,) = ing.set(precision="float16")
    assert not bad_precision.successful and "precision" in bad_precision.reason
    (bf16,) = ing.set(precision="bfloat16")  # checked against this machine's CPU
    assert bf16.successful == BF16_CPU
    assert bf16.successful or "cpu has no bf16 arithmetic" in bf16.reason

    mark = len(ing.diags)
    assert ing.tick()
    assert ing.wait(lambda: ing.planning_status(mark)[1].get("last_stamp") == str(ing.stamp))
    _, values = ing.planning_status(mark)
    assert values["num_samples"] == "48"  # the tick after the set planned with the new value
    assert values["warm_start"] == "policy" and values["policy_prior"] == "20.0"
    assert values["precision"] == ("bfloat16" if BF16_CPU else "float32")
    assert (
        values["temperature"] == "0.4" and values["num_elites"] == "8"
    )  # rejected sets changed nothing


def test_hot_swap_answers_every_observation(tmp_path, planner):
    start, ing = planner
    start(make_checkpoint(tmp_path / "v1", seed=1))
    assert ing.tick(60.0)
    (ok,) = ing.set(checkpoint=make_checkpoint(tmp_path / "v2", seed=2))
    assert ok.successful
    future = ing.load_model.call_async(Trigger.Request())
    assert ing.load_model.wait_for_service(timeout_sec=10.0)
    stamps = []
    while not future.done() or len(stamps) < 3:
        stamps.append(ing.publish())
        assert ing.wait(lambda: stamps[-1] in ing.actions, 20.0), (
            f"tick {len(stamps)} dropped during the swap"
        )
        assert len(stamps) < 200, "the swap never finished"
    result = future.result()
    assert result.success, result.message
    assert str(tmp_path / "v2") in result.message
    assert ing.wait(lambda: all(s in ing.plans for s in stamps))
    mark = len(ing.diags)
    assert ing.tick()
    assert ing.wait(lambda: ing.planning_status(mark)[1].get("checkpoint") == str(tmp_path / "v2"))

    (ok,) = ing.set(checkpoint=str(tmp_path / "missing"))
    assert ok.successful
    refused = ing.call(ing.load_model, Trigger.Request())
    assert (
        not refused.success and "refused checkpoint" in refused.message and "v2" in refused.message
    )
    assert ing.tick(), "the node stopped planning after a refused swap"


def test_nan_model_output_sends_hold_and_reports_an_error(tmp_path, planner):
    start, ing = planner
    start(make_checkpoint(tmp_path / "nan", scale=1e30))
    stamp = ing.publish()
    assert ing.wait(
        lambda: ing.planning_status()[0] is not None and ing.planning_status()[0].level == b"\x02",
        60.0,
    )
    status, values = ing.planning_status()
    assert "HOLD sent" in status.message and "non-finite" in status.message
    assert values["failed_plans"] == "1"
    assert ing.wait(lambda: stamp in ing.actions, 10.0)
    hold = ing.actions[stamp]
    assert (
        hold.header.frame_id == "hold" and list(hold.points[0].positions) == []
    )  # the explicit safe action
    assert not ing.plans  # nothing planned is ever published from a non-finite model


def test_real_time_timer_falls_back_to_the_base_policy_when_mppi_would_miss_the_deadline(
    tmp_path, planner
):
    start, ing = planner
    # 100 Hz with 5% of the period (0.5 ms) for MPPI: the first MPPI tick measures the latency,
    # every later tick must run pi instead (re-probing disabled). This pi also reads o^p_t.
    start(
        make_checkpoint(tmp_path / "ck", policy_proprio_skip=True),
        "lockstep:=false",
        "control_rate_hz:=100.0",
        "deadline_fraction:=0.05",
        "reprobe_ticks:=0",
        "max_observation_age_s:=5.0",
    )  # fmt: skip  (staleness is not under test; a slow first tick must not void the next)
    ing.realtime = True
    for _ in range(4):
        stamp = ing.publish()
        assert ing.wait(lambda: stamp in ing.actions and stamp in ing.plans, 30.0)
    ing.spin(0.3)
    stamps = sorted(ing.actions)
    assert len(stamps) == 4
    assert stamps[0] in ing.values and not any(
        s in ing.values for s in stamps[1:]
    )  # pi has no values
    assert all(len(ing.plans[s].points) == 5 for s in stamps)
    assert ing.wait(lambda: ing.planning_status()[1].get("policy_fallbacks") == "3")
    status, values = ing.planning_status()
    assert "base policy" in status.message and values["mppi_ticks"] == "1"


def test_planning_goes_warn_when_it_answers_too_few_observations(tmp_path, planner):
    """Observations at about 20 Hz, a real-time planner ticking at 2 Hz: most are superseded
    before a tick, and the planning diagnostic says so."""
    start, ing = planner
    start(
        make_checkpoint(tmp_path / "ck"),
        "lockstep:=false",
        "control_rate_hz:=2.0",
        "max_observation_age_s:=30.0",
    )
    ing.realtime = True
    assert ing.tick(60.0)
    mark = len(ing.diags)
    for _ in range(30):
        ing.publish()
        ing.spin(0.05)

    def warned():
        status, values = ing.planning_status(mark)
        return status is not None and "min_answer_share 0.9" in status.message

    assert ing.wait(warned, 20.0)
    status, values = ing.planning_status(mark)
    assert status.level == b"\x01" and float(values["answer_share"]) < 0.5


def test_observation_with_a_foreign_proprio_layout_is_rejected_without_acting(tmp_path, planner):
    start, ing = planner
    start(make_checkpoint(tmp_path / "ck"))
    assert ing.tick(60.0)
    good = dict(ing.actions)
    bad = ros_msgs.proprio_to_msg(
        Observation(stamp=0.0, proprio=np.zeros(SPEC.proprio_dim, np.float32)), SPEC, 0
    )
    bad.name = list(reversed(bad.name))  # same size, different layout: must not be planned on
    ing.stamp += 200_000_000
    bad.header.stamp = ros_msgs.stamp_msg(ing.stamp)
    for cam, pub in ing.images.items():
        pub.publish(
            ros_msgs.image_to_msg(np.zeros((*SPEC.image_shape, 3), np.uint8), ing.stamp, cam)
        )
    ing.proprio.publish(bad)

    def rejected():
        return any(s.name == "planner: observation" and s.level == b"\x02"
                   and "layout differs" in s.message
                   for a in ing.diags for s in a.status)  # fmt: skip

    assert ing.wait(rejected, 20.0)
    ing.spin(0.3)
    assert ing.actions == good, "an action was published for a rejected observation"
    assert ing.tick(), "the node stopped planning after a bad message"


def test_parameter_defaults_are_the_planner_config_of_the_robot_the_node_plans_for(
    tmp_path, ros_domain
):
    """The node's MPPI defaults come from the robot's PlannerConfig factory, for the robot named
    by `robot` or else by the start-up checkpoint; a model of another robot is refused."""
    ur5e = make_checkpoint(tmp_path / "ur5e")
    go2_model = WorldModel(
        go2_config(latent_dim=16, history=2, horizon=3, dynamics=AttentionConfig(1, 2),
                   policy=AttentionConfig(1, 2))
    )  # fmt: skip
    save_checkpoint(go2_model, tmp_path / "go2")
    go2 = str(tmp_path / "go2")
    assert resolve_robot("", ur5e) == "ur5e" and resolve_robot("", go2) == "go2"
    assert resolve_robot("ur5e", go2) == "ur5e"  # the parameter names it
    assert resolve_robot("", "") == resolve_robot("", str(tmp_path / "missing")) == "ur5e"
    for robot in ("go2", "ur5e"):
        defaults = {p.name: p.default for p in node_params(robot)}
        factory = planner_config_for(robot_spec(robot))
        assert {f: defaults[f] for f in PLANNER_FIELDS} == {
            f: getattr(factory, f) for f in PLANNER_FIELDS
        }
        assert defaults["control_rate_hz"] == robot_spec(robot).control_rate_hz
    assert {p.name: p.default for p in node_params("go2")}["temperature"] == GO2_TEMPERATURE

    rclpy.init()
    try:
        node = PlannerNode(
            parameter_overrides=[
                NodeParameter("checkpoint", value=go2),  # T = 3: refused by the go2 horizon 25
                NodeParameter("wait_for_checkpoint", value=True),
            ]
        )
        assert node.core.robot == "go2" and node.params["horizon"] == 25
        assert node.params["max_observation_age_s"] == pytest.approx(0.05)
        node.destroy_node()
        mismatch = [
            NodeParameter("checkpoint", value=go2),
            NodeParameter("robot", value="ur5e"),
            NodeParameter("horizon", value=3),
        ]
        with pytest.raises(ValueError, match="cannot load checkpoint.*wait_for_checkpoint"):
            PlannerNode(parameter_overrides=mismatch)  # a start-up error ends the node
        with pytest.raises(ValueError, match="cannot load checkpoint"):
            PlannerNode(parameter_overrides=[NodeParameter("checkpoint", value=str(tmp_path))])
        node = PlannerNode(
            parameter_overrides=[*mismatch, NodeParameter("wait_for_checkpoint", value=True)]
        )
        assert node.core.robot == "ur5e" and node.core.loaded is None  # refused, the node waits
        assert node.params["temperature"] == 0.4
        with pytest.raises(
            ValueError, match="is a go2 model; this planner's parameters are ur5e's"
        ):
            node.core.planner_config(node.params.values, load_world_model(go2, "cpu"), SPEC)
        node.destroy_node()
    finally:
        rclpy.shutdown()
