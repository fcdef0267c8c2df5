"""How every node of the stack spins until it is stopped.

rclpy's signal handler shuts the context down on SIGINT / SIGTERM from its own thread, while the
executor may be inside a callback. A callback that publishes at that moment raises RCLError
("publisher's context is invalid"), which `rclpy.spin` re-raises: a traceback on every tenth
Ctrl-C of a loaded machine, though nothing went wrong. `spin_until_shutdown` treats an error
raised after the context stopped being valid as the shutdown it is; an error while the context is
still valid is a fault and propagates.
"""

from __future__ import annotations

from collections.abc import Callable

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node


def spin_until_shutdown(
    node: Node,
    spin: Callable[[], object] | None = None,
    on_exit: Callable[[], None] | None = None,
) -> None:
    """Run `spin` (default `rclpy.spin(node)`) until shutdown, then `on_exit`, then destroy the
    node. Returns quietly on Ctrl-C, SIGTERM, an external `rclpy.shutdown` and an error raised by
    a callback the shutdown cut short; any other error propagates (after the clean-up)."""
    try:
        if spin is None:
            rclpy.spin(node)
        else:
            spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:
        if node.context.ok():
            raise
    finally:
        try:
            if on_exit is not None:
                on_exit()
        finally:
            node.destroy_node()
