"""Task options: what an episode of a task takes besides the task's name and variant (an episode
length, the Go2's commanded speed and panel friction, the UR5e's start region, ...).

Each task family lists its options once, as the fields of a frozen `TaskOptions` dataclass whose
metadata (`option(...)`, a `described.setting` with more) describes each as an `Option` (a
`described.Param`): its doc, what holds when it is not set, its range or choices, the tasks it
applies to, and the names it has outside Python (a command-line flag, a launch argument). That
dataclass is the one validator: building it checks every value, and `check(task, variant)` checks
that each option set applies to the task. Everything else is built from it: the task registry's
`make_task` and `episode_overrides` (robot_drivers.registry), the MuJoCo driver's parameters
(robot_drivers.mujoco_driver_node), the launch arguments (simdist_planner.ros.launch_description)
and the commands' flags (simdist_planner.cli.common), so a bad option gets the same error whichever
way it comes in. Imports nothing heavy: the launcher and the commands read the descriptions without
loading a simulator.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from robot_drivers.described import Param, setting

UNSET = {float: 0.0, int: 0, str: ""}  # a scalar option's "not set" where None cannot be said


def option(
    doc: str,
    *,
    kind: type,
    unset: str,
    low: float | None = None,
    above: float | None = None,
    high: float | None = None,
    choices: tuple[str, ...] = (),
    size: int = 0,
    only: tuple[tuple[str, str], ...] = (),
    flag: str = "",
    launch: bool = False,
) -> Any:
    """A described task option: a dataclass field defaulting to None (not set).

    Args:
        doc: what the option sets (the flag's help, the parameter's and argument's description).
        kind: the type of its value (float, int, str), or of each item of a tuple (`size` > 0).
        unset: what holds when it is not set (e.g. "the task's own, 0.5").
        low: the smallest value a number takes (inclusive).
        above: a bound a number must exceed (exclusive).
        high: the largest value a number takes (inclusive).
        choices: the values a string takes.
        size: the length of a tuple value (0: a scalar; -1: a tuple of any length).
        only: the (task, variant) pairs it applies to; (): every task of its family.
        flag: its name as a command-line flag (`--{flag}`, dashes for underscores) and launch
            argument; "": not a flag.
        launch: whether the robot's launch graphs take it as the argument `{flag}:=`.

    Returns:
        The dataclass field.
    """
    meta = setting(doc, low=low, high=high, choices=choices, flag=flag, type_=kind)
    meta.update(unset=unset, above=above, size=size, only=tuple(only), launch=launch)
    return field(default=None, metadata=meta)


@dataclass(frozen=True)
class Option(Param):
    """The description of one task option: a Param (its `type` the value's, or each item's, type;
    default None: not set) with what an option adds."""

    unset: str = ""  # what holds when it is not set
    above: float | None = None  # a bound a number must exceed (exclusive)
    size: int = 0  # a tuple value's length (0: a scalar; -1: any length)
    only: tuple[tuple[str, str], ...] = ()  # the (task, variant) pairs it applies to; (): all
    launch: bool = False  # the robot's launch graphs take it as `{flag}:=`

    @property
    def kind(self) -> type:
        """The type of its value (of each item of a tuple)."""
        assert self.type is not None  # option() always records it
        return self.type

    @property
    def scalar(self) -> bool:
        """Whether its value is one number or string (a ROS parameter of its own)."""
        return self.size == 0

    @property
    def unset_value(self) -> Any:
        """The value that says "not set" where None cannot (a ROS parameter, an argument)."""
        return UNSET[self.kind]

    def span(self) -> str:
        """Its range or choices in words.

        Returns:
            E.g. "> 0 and <= 2" or "one of narrow, wide"; "" when unbounded.
        """
        if self.choices:
            return "one of " + ", ".join(self.choices)
        bounds = (("> ", self.above), (">= ", self.low), ("<= ", self.high))
        return " and ".join(f"{word}{_number(b)}" for word, b in bounds if b is not None)

    def problem(self, value: Any) -> str | None:
        """What is wrong with a value set for this option.

        Args:
            value: the value given (not None).

        Returns:
            The reason it is refused, naming the option and the value; None when it is fine.
        """
        items = (value,) if self.scalar else value
        if not self.scalar and (
            not isinstance(value, tuple) or (self.size > 0 and len(value) != self.size)
        ):
            count = f"{self.size} " if self.size > 0 else ""
            return f"{self.name} must be a tuple of {count}{self.kind.__name__}, got {value!r}"
        for item in items:
            number = self.kind in (int, float)
            if number and (isinstance(item, bool) or not isinstance(item, (int, float))):
                return f"{self.name} must be a number, got {value!r}"
            if self.kind is int and number and item != int(item):
                return f"{self.name} must be an integer, got {value!r}"
            if self.kind is str and not isinstance(item, str):
                return f"{self.name} must be a string, got {value!r}"
            outside = (
                (self.choices and item not in self.choices)
                or (number and not math.isfinite(item))
                or (self.above is not None and not item > self.above)
                or (self.low is not None and not item >= self.low)
                or (self.high is not None and not item <= self.high)
            )
            if outside:
                return f"{self.name} must be {self.span() or 'finite'}, got {value!r}"
        return None


@dataclass(frozen=True)
class TaskOptions:
    """The options of one task family; a field per option, None when not set. Building an
    instance validates every value set (ValueError naming the option, its range and the value);
    `check(task, variant)` refuses an option set for a task it does not apply to."""

    family: ClassVar[str] = ""  # the tasks it serves, in words (error messages)

    max_steps: int | None = option(
        "episode length in control steps (a shortened episode still ends the task's own way: "
        "truncation, survival success)",
        kind=int,
        unset="the task's own limit",
        low=1,
        high=1_000_000,
        flag="max_steps",
    )

    def __post_init__(self) -> None:
        for o in self.described():
            value = getattr(self, o.name)
            if value is None:
                continue
            if not o.scalar and isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, o.name, value)
            reason = o.problem(value)
            if reason:
                raise ValueError(reason)
            if o.kind in (int, float) and o.scalar:
                object.__setattr__(self, o.name, o.kind(value))

    @classmethod
    def described(cls) -> tuple[Option, ...]:
        """Its options' descriptions.

        Returns:
            One Option per described field, in field order.
        """
        return tuple(
            Option(
                f.name,
                None,
                m["doc"],
                m["low"],
                m["high"],
                choices=m["choices"],
                flag=m["flag"],
                type=m["type"],
                unset=m["unset"],
                above=m["above"],
                size=m["size"],
                only=m["only"],
                launch=m["launch"],
            )
            for f in dataclasses.fields(cls)
            if "doc" in (m := f.metadata)
        )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Its options' names.

        Returns:
            The field names, in field order.
        """
        return tuple(o.name for o in cls.described())

    @classmethod
    def of(
        cls, task: str, variant: str | None = None, *, unset_values: bool = False, **given: Any
    ) -> TaskOptions:
        """The options of one episode of `task`, validated: the one place an option is checked.

        Args:
            task: the task's name (for the messages and `check`).
            variant: its variant; None: checked for values only (the variant comes later).
            unset_values: whether a scalar option's "not set" value (0, "": what a ROS
                parameter or launch argument says for None) leaves it unset.
            **given: option values; None leaves an option unset.

        Returns:
            The options instance; ValueError naming the first bad option: one the family lacks,
            a value outside its range or choices, or one that does not apply to (task, variant).
        """
        known = cls.names()
        given = {k: v for k, v in given.items() if v is not None}
        foreign = [k for k in given if k not in known]
        if foreign:
            raise ValueError(
                f"{', '.join(foreign)}: not an option of task {task!r}; its options: {list(known)}"
            )
        by_name = {o.name: o for o in cls.described()}
        values = {
            k: v
            for k, v in given.items()
            if not (unset_values and by_name[k].scalar and _is_unset(by_name[k], v))
        }
        options = cls(**values)
        if variant is not None:
            options.check(task, variant)
        return options

    def check(self, task: str, variant: str) -> None:
        """Refuse an option set for a task or variant it does not apply to.

        Args:
            task: the task's name.
            variant: "sim" or "real".

        Returns:
            None; ValueError naming the option, the task and variant it applies to, and these.
        """
        for o in self.described():
            if getattr(self, o.name) is not None and o.only and (task, variant) not in o.only:
                where = " or ".join(f"{t} variant {v!r}" for t, v in o.only)
                raise ValueError(
                    f"{o.name} applies to {where} only ({o.doc}), not to {task} variant {variant!r}"
                )

    def given(self) -> dict[str, Any]:
        """The options set.

        Returns:
            Name -> value of each option not None (what `make_task` takes as keywords).
        """
        return {n: getattr(self, n) for n in self.names() if getattr(self, n) is not None}


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _is_unset(o: Option, value: Any) -> bool:
    return type(value) is not bool and value == o.unset_value


@dataclass(frozen=True)
class Go2Options(TaskOptions):
    """The options of a Go2 task (robot_drivers.tasks.go2_tasks): the two settings the paper
    varies between real-world trials."""

    family: ClassVar[str] = "Go2"

    speed: float | None = option(
        "Go2: commanded forward speed vx in m/s; a course's episode limit follows it (2.5 x its "
        "length / speed)",
        kind=float,
        unset="the task's own, 0.5",
        above=0.0,
        high=2.0,
        flag="speed",
        launch=True,
    )
    panel_friction: float | None = option(
        "the Slippery Slope stand-in's PTFE panels' friction (slippery_slope, variant real)",
        kind=float,
        unset="the stand-in's own, 0.15",
        above=0.0,
        high=2.0,
        only=(("slippery_slope", "real"),),
        flag="friction",
        launch=True,
    )


@dataclass(frozen=True)
class Ur5eOptions(TaskOptions):
    """The options of a UR5e insertion task (robot_drivers.tasks.ur5e_tasks)."""

    family: ClassVar[str] = "UR5e"

    region: str | None = option(
        "UR5e start region of the object",
        kind=str,
        unset="wide",
        choices=("narrow", "wide"),
        flag="region",
    )
    image_size: tuple[int, int] | None = option(
        "UR5e rendered image size (height, width) in pixels",
        kind=int,
        unset="the scene's own",
        low=8,
        high=1024,
        size=2,
    )
    cameras: tuple[str, ...] | None = option(
        "UR5e cameras rendered", kind=str, unset="the scene's own", size=-1
    )


__all__ = ["UNSET", "Go2Options", "Option", "TaskOptions", "Ur5eOptions", "option"]
