"""spin_until_shutdown, spin_quietly: a spin cut short by a shutdown ends quietly, a fault not."""

import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from std_msgs.msg import String

from robot_drivers.node_spin import spin_quietly, spin_until_shutdown


def _spinning(callback):
    """A node on its own context, its timer running `callback(context, publisher)`; its executor."""
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("spin_probe", context=context)
    pub = node.create_publisher(String, "/spin_probe", 1)
    node.create_timer(0.01, lambda: callback(context, pub))
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    return context, node, executor


def _shut_down_then_publish(context, pub):
    """What a signal does to a publishing callback: the context goes, then publish raises."""
    rclpy.shutdown(context=context)
    pub.publish(String(data="after shutdown"))


def test_the_cut_short_publish_raises_without_the_helper(ros_domain):
    context, node, executor = _spinning(_shut_down_then_publish)
    with pytest.raises(Exception):  # noqa: B017 (rclpy raises RCLError or InvalidHandle)
        executor.spin()
    executor.shutdown()
    node.destroy_node()


def test_a_publish_cut_short_by_shutdown_ends_the_spin_quietly(ros_domain):
    context, node, executor = _spinning(_shut_down_then_publish)
    exited = []
    spin_until_shutdown(node, executor.spin, on_exit=lambda: exited.append(True))
    assert exited == [True] and not context.ok()


def test_a_fault_while_the_context_is_valid_propagates(ros_domain):
    def fault(_context, _pub):
        raise ValueError("a real fault")

    context, node, executor = _spinning(fault)
    try:
        with pytest.raises(ValueError, match="a real fault"):
            spin_until_shutdown(node, executor.spin, on_exit=executor.shutdown)
    finally:
        rclpy.try_shutdown(context=context)


def test_a_wait_set_the_shutdown_cut_short_ends_a_thread_spin_quietly(ros_domain):
    """The race in a node's own executor thread (the planner's model loader): the context passes
    the executor's check, the signal shuts it down, and building the wait set raises."""
    context = rclpy.Context()
    rclpy.init(context=context)

    def cut_short():
        rclpy.shutdown(context=context)
        raise RuntimeError("failed to initialize wait set: the given context is not valid")

    spin_quietly(cut_short, context)  # returns: the error came after the shutdown
    assert not context.ok()
    live = rclpy.Context()
    rclpy.init(context=live)
    try:

        def fault():
            raise RuntimeError("a real fault")

        with pytest.raises(RuntimeError, match="a real fault"):
            spin_quietly(fault, live)
    finally:
        rclpy.try_shutdown(context=live)
