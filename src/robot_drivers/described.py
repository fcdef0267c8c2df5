"""One description per tunable setting of a typed config: its doc, range and choices, kept in the
dataclass field's metadata, so that a node's ROS parameters (`node_params.Param.of`), the docs'
parameter tables (`node_params.docs_table`) and any command-line flags come from the field, not
from a restatement beside it. Imports nothing from ROS: the cores that own the configs use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def setting(
    doc: str,
    *,
    low: float | None = None,
    high: float | None = None,
    choices: tuple = (),
    group: str = "",
) -> dict[str, Any]:
    """The metadata that makes a config field a described setting.

    Args:
        doc: what the setting does (the ROS parameter's description, the docs' text).
        low: the smallest value of a number (with `high`: the ROS parameter's range).
        high: the largest value of a number.
        choices: the allowed values of a string.
        group: which settings a node declares together (e.g. the limits of one command kind);
            "" for every node that takes the config.

    Returns:
        The `metadata` of `dataclasses.field`.
    """
    return {"doc": doc, "low": low, "high": high, "choices": tuple(choices), "group": group}


@dataclass(frozen=True)
class Setting:
    """One described field of a config, with the default of the instance it was read from."""

    name: str
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()
    group: str = ""


def settings(config: Any) -> tuple[Setting, ...]:
    """The described fields of a config instance, in field order, with its values as defaults.

    Args:
        config: a dataclass instance whose described fields carry `setting(...)` metadata.

    Returns:
        One Setting per described field (fields without a `doc` are internal, left out).
    """
    return tuple(
        Setting(
            f.name,
            getattr(config, f.name),
            f.metadata["doc"],
            f.metadata["low"],
            f.metadata["high"],
            f.metadata["choices"],
            f.metadata["group"],
        )
        for f in dataclasses.fields(config)
        if "doc" in f.metadata
    )
