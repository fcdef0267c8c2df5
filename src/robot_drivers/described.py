"""One description per tunable setting: `Param` (name, default, doc, range, choices, flag, ...).

A node's own setting is a `Param` in its parameter list; a setting of a typed config (SafetyConfig,
AdaptConfig, PlannerConfig) is described once in its dataclass field's metadata (`setting(...)`)
and read back as a `Param` by `settings(config)`. A node's ROS parameters
(`node_params.NodeParams`), the docs' parameter tables (`node_params.docs_table`) and the
commands' flags come from these Params, not from a restatement beside them. Imports nothing from
ROS: the cores that own the configs use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


@dataclass(frozen=True)
class Param:
    """One tunable: its default, description, inclusive range for numbers or choices for a
    string, and where it comes from or goes."""

    name: str
    default: Any  # a config field's: the instance's value (None: a required field)
    doc: str
    low: float | None = None  # with `high`: the ROS parameter's range (rqt_reconfigure sliders)
    high: float | None = None
    read_only: bool = False  # structural settings (robot, cameras) fixed at start-up
    choices: tuple = ()  # the allowed values of a string parameter
    group: str = ""  # which settings a node declares together; "": every node taking the config
    flag: str = ""  # the commands' flag (--flag-name); "": no flag
    type: type | None = None  # a config field's value type (its annotation); None: the default's


def setting(
    doc: str,
    *,
    low: float | None = None,
    high: float | None = None,
    choices: tuple = (),
    group: str = "",
    flag: str = "",
    type_: type | None = None,
) -> dict[str, Any]:
    """The metadata that makes a config field a described setting.

    Args:
        doc: what the setting does (the ROS parameter's description, the docs' text, the help).
        low: the smallest value of a number (with `high`: the ROS parameter's range).
        high: the largest value of a number.
        choices: the allowed values of a string.
        group: which settings a node declares together (e.g. the limits of one command kind);
            "" for every node that takes the config.
        flag: the commands' flag (`--flag-name`, dashes for underscores); "": none.
        type_: the value type, where the field's annotation is not a plain int, float, bool or
            str.

    Returns:
        The `metadata` of `dataclasses.field`.
    """
    meta: dict[str, Any] = {
        "doc": doc, "low": low, "high": high, "choices": tuple(choices), "group": group,
        "flag": flag,
    }  # fmt: skip
    if type_ is not None:
        meta["type"] = type_
    return meta


def settings(config: Any) -> tuple[Param, ...]:
    """The described fields of a config, in field order.

    Args:
        config: a dataclass instance (its values are the defaults) or class (its field
            defaults; None for a required field) whose described fields carry `setting(...)`
            metadata.

    Returns:
        One Param per described field (fields without a `doc` are internal, left out).
    """

    def default(f: dataclasses.Field) -> Any:
        if not isinstance(config, type):
            return getattr(config, f.name)
        return None if f.default is dataclasses.MISSING else f.default

    return tuple(
        Param(
            f.name,
            default(f),
            f.metadata["doc"],
            f.metadata["low"],
            f.metadata["high"],
            choices=f.metadata["choices"],
            group=f.metadata["group"],
            flag=f.metadata.get("flag", ""),
            type=f.metadata.get("type") or _TYPES.get(str(f.type)),
        )
        for f in dataclasses.fields(config)
        if "doc" in f.metadata
    )
