"""How every node of the stack spins until it is stopped.

rclpy's signal handler shuts the context down on SIGINT / SIGTERM from its own thread, while the
executor may be inside a callback. A callback that publishes at that moment raises RCLError
("publisher's context is invalid"), which `rclpy.spin` re-raises: a traceback on every tenth
Ctrl-C of a loaded machine, though nothing went wrong; an executor spinning in a node's own
thread can likewise find the context gone between its check and building its wait set.
`spin_quietly` (and `spin_until_shutdown`, which uses it) treats an error raised after the context
stopped being valid as the shutdown it is; an error while the context is still valid is a fault
and propagates.
"""

from __future__ import annotations

from collections.abc import Callable

import rclpy
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node


def spin_quietly(spin: Callable[[], object], context: Context) -> None:
    """Run `spin` until shutdown. Returns quietly on Ctrl-C, SIGTERM, an external shutdown and an
    error raised once `context` is no longer valid (a publish or a wait set the shutdown cut
    short, also in a node's own executor thread); an error while the context is valid propagates."""
    try:
        spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:
        if context.ok():
            raise


def spin_until_shutdown(
    node: Node,
    spin: Callable[[], object] | None = None,
    on_exit: Callable[[], object] | None = None,
) -> None:
    """Run `spin` (default `rclpy.spin(node)`) until shutdown (`spin_quietly`), then `on_exit`,
    then destroy the node; an error that is not the shutdown propagates after the clean-up."""
    try:
        spin_quietly(spin or (lambda: rclpy.spin(node)), node.context)
    finally:
        try:
            if on_exit is not None:
                on_exit()
        finally:
            node.destroy_node()
