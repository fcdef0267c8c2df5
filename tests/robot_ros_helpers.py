"""In-process ROS harness for the robot-side tests: own context and DDS domain, one executor."""

from __future__ import annotations

import os
import time

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node


class RosHarness:
    """Nodes under test plus a `probe` node that publishes and listens like the rest of a graph."""

    def __init__(self, domain_id: int):
        os.environ["ROS_DOMAIN_ID"] = str(domain_id)
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.probe = Node("probe", context=self.context)
        self.executor.add_node(self.probe)
        self.nodes = [self.probe]

    def add(self, node: Node) -> Node:
        self.executor.add_node(node)
        self.nodes.append(node)
        return node

    def spin_until(self, predicate, timeout_s: float = 5.0) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.02)
            if predicate():
                return True
        return predicate()

    def spin_for(self, seconds: float) -> None:
        self.spin_until(lambda: False, seconds)

    def call(self, client, request, timeout_s: float = 5.0):
        assert client.wait_for_service(timeout_sec=timeout_s), (
            f"service {client.srv_name} not available"
        )
        future = client.call_async(request)
        assert self.spin_until(future.done, timeout_s), f"service {client.srv_name} did not answer"
        return future.result()

    def collect(self, msg_type, topic: str, depth: int = 50) -> list:
        got: list = []
        self.probe.create_subscription(msg_type, topic, got.append, depth)
        return got

    def close(self) -> None:
        for node in reversed(self.nodes):
            self.executor.remove_node(node)
            node.destroy_node()
        self.executor.shutdown()
        rclpy.shutdown(context=self.context)


def diagnostics_text(arrays, node_name: str) -> list[tuple[int, str]]:
    """(level, message) of every status of one node in the received DiagnosticArrays."""
    return [
        (s.level[0] if isinstance(s.level, bytes) else int(s.level), f"{s.name}: {s.message}")
        for a in arrays
        for s in a.status
        if s.name.startswith(node_name + ":")
    ]
