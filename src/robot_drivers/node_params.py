"""Declared, ranged, validated ROS parameters applied between ticks (for the robot-side nodes).

Each node lists its tunables once as `Param`s (robot_drivers.described); `NodeParams` declares
them with a description and a range (rqt_reconfigure shows sliders), rejects bad values at set
time with the reason, and queues accepted ones so the node applies them at the start of its next
tick, never mid-tick.
A value given for a parameter the node does not declare (a misspelt key in a parameter file or a
`-p name:=value`) is an error that names it and the closest declared name: ROS 2 would otherwise
ignore it silently.
"""

from __future__ import annotations

import difflib
import math
import threading
from typing import Any, Callable

from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)

from robot_drivers.described import Param


def ros_default(p: Param) -> Any:
    """A parameter's default as ROS takes it (a tuple as a list)."""
    return list(p.default) if isinstance(p.default, tuple) else p.default


def descriptor(p: Param) -> ParameterDescriptor:
    """The ROS descriptor of a parameter: its description, read-only flag, range and choices.

    Args:
        p: the parameter.

    Returns:
        The ParameterDescriptor; TypeError for a range with one bound or on a bool.
    """
    d = ParameterDescriptor(description=p.doc, read_only=p.read_only)
    if p.choices:
        d.additional_constraints = "one of: " + ", ".join(map(str, p.choices))
    low, high = p.low, p.high
    if (low is None) != (high is None):
        raise TypeError(f"parameter {p.name}: a range takes both low and high")
    if low is not None and isinstance(p.default, bool):
        raise TypeError(f"parameter {p.name}: a bool takes no range")
    if low is not None and high is not None and isinstance(p.default, int):
        d.integer_range = [IntegerRange(from_value=int(low), to_value=int(high), step=1)]
    elif low is not None and high is not None:
        d.floating_point_range = [
            FloatingPointRange(from_value=float(low), to_value=float(high), step=0.0)
        ]
    return d


def docs_table(params: tuple[Param, ...] | list[Param]) -> list[str]:
    """The docs' table of a node's parameters (docs/observation_topics.md, section 7), one row
    per Param: name, default, range (and read-only), description.

    Args:
        params: the node's parameters, in the order the table lists them.

    Returns:
        The Markdown lines, header first.
    """
    rows = ["| parameter | default | range | description |", "|---|---|---|---|"]
    for p in params:
        span = f"[{p.low}, {p.high}]" if p.low is not None else ""
        span = f"{span} read-only".strip() if p.read_only else span
        text = p.doc.replace("|", "\\|")
        rows.append(f"| `{p.name}` | `{ros_default(p)}` | {span} | {text} |")
    return rows


def unknown_parameters(node) -> list[str]:
    """One message per value given to `node` (parameter file, -p, overrides) for a parameter it
    has not declared, naming the closest declared parameter. Call after declaring them all."""
    # rclpy keeps the given values and the declared parameters only in these attributes
    # (rclpy.node.Node); there is no public accessor for either
    given = getattr(node, "_parameter_overrides", {})
    declared = list(getattr(node, "_parameters", {}))
    problems = []
    for name in sorted(given):
        if node.has_parameter(name) or name.startswith("qos_overrides."):
            continue
        close = difflib.get_close_matches(name, declared, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        problems.append(f"unknown parameter {name!r} (not declared by this node){hint}")
    return problems


# check(name, value, all current values) -> None or the reason the value is rejected
Check = Callable[[str, object, dict], "str | None"]


class NodeParams:
    """The node's parameter values; accepted changes wait in `pending` until `apply()`."""

    def __init__(self, node, params: tuple[Param, ...], check: Check | None = None):
        self._node = node
        self._params = {p.name: p for p in params}
        self._check = check
        self._lock = threading.Lock()
        self._pending: dict[str, object] = {}
        self.values: dict[str, Any] = {}  # a parameter's value is any of its ROS types
        for p in params:
            self.values[p.name] = node.declare_parameter(
                p.name, ros_default(p), descriptor(p)
            ).value
        unknown = unknown_parameters(node)
        if unknown:
            raise ValueError(f"{node.get_name()}: " + "; ".join(unknown))
        for name, value in self.values.items():
            reason = self._validate(name, value, self.values)
            if reason:
                raise ValueError(
                    f"{node.get_name()}: parameter {name}={value!r} rejected: {reason}"
                )
        node.add_on_set_parameters_callback(self._on_set)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def _validate(self, name: str, value, values: dict) -> str | None:
        p = self._params.get(name)
        if p is None:
            return None  # not ours (e.g. use_sim_time): rclpy handles it
        if isinstance(value, float) and not math.isfinite(value):
            return f"{name} must be finite, got {value}"
        if isinstance(value, (list, tuple)) and any(
            isinstance(v, float) and not math.isfinite(v) for v in value
        ):
            return f"{name} must hold finite numbers, got {list(value)}"
        if p.low is not None and not (p.low <= value <= p.high):
            return f"{name}={value} outside [{p.low}, {p.high}]"
        if p.choices and value not in p.choices:
            return f"{name} must be one of {p.choices}, got {value!r}"
        return self._check(name, value, values) if self._check else None

    def _on_set(self, parameters) -> SetParametersResult:
        with self._lock:
            proposed = {**self.values, **self._pending}
            proposed.update({p.name: p.value for p in parameters if p.name in self._params})
            for p in parameters:
                reason = self._validate(p.name, p.value, proposed)
                if reason:
                    return SetParametersResult(successful=False, reason=reason)
            for p in parameters:
                if p.name in self._params:
                    self._pending[p.name] = p.value
        return SetParametersResult(successful=True)

    def apply(self) -> dict[str, object]:
        """Move accepted changes into `values` (call at a tick boundary); returns what changed."""
        with self._lock:
            changed, self._pending = self._pending, {}
        self.values.update(changed)
        return changed
