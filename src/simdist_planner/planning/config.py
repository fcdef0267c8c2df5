"""The planner's settings: PlannerConfig, the description of each tunable planner parameter
(PLANNER_PARAMS, built from PlannerConfig's fields) and the presets (PLANNER_PRESETS).

One description per parameter (name, type, default, range, choices, doc, CLI flag): the planner
node declares its ROS parameters from PLANNER_PARAMS (with their ranges, for rqt_reconfigure) and
the commands' planner flags are built from it (cli/common.py), so a new setting is one field here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from robot_drivers.described import Param, setting, settings
from simdist_planner.model.official import is_official

WARM_STARTS = ("roll", "shift", "policy")
EVALUATORS = ("fast", "eager")
PRECISIONS = ("float32", "bfloat16")


@dataclass(frozen=True)
class PlannerConfig:
    """MPPI settings. Field defaults are the official controller's (simdist
    config/control/mppi.yaml and control/mppi.py), the `official` preset; the other presets
    (PLANNER_PRESETS) set what differs. A field with `setting` metadata is a tunable planner
    parameter: its description (doc, range, choices, CLI flag; robot_drivers.described.setting)
    is the one the planner node's ROS
    parameters and the command-line flags are built from (PLANNER_PARAMS)."""

    horizon: int = field(
        metadata=setting(
            "planning horizon T in control steps (must equal the model's T)",
            low=1,
            high=256,
            type_=int,
        )
    )
    action_low: tuple[float, ...]  # per action dimension, raw units (RobotSpec.action_low)
    action_high: tuple[float, ...]
    num_samples: int = field(
        default=450,
        metadata=setting(
            "MPPI Gaussian candidates per iteration", low=1, high=16384, flag="samples"
        ),
    )
    mixture_coef: float = field(
        default=0.05,
        metadata=setting(
            "base-policy candidates = num_samples x mixture_coef",
            low=0.0,
            high=1.0,
            flag="mixture_coef",
        ),
    )
    policy_noise_std: float = field(
        default=0.05,
        metadata=setting(
            "std of the noise on base-policy candidates, drawn once per step (UR5e: in half action "
            "ranges)",
            low=0.0,
            high=10.0,
            flag="policy_noise",
        ),
    )
    iterations: int = field(
        default=8,
        metadata=setting("MPPI iterations per control step", low=1, high=64, flag="iterations"),
    )
    num_elites: int = field(
        default=64,
        metadata=setting(
            "elite candidates refitting the mean and std", low=1, high=16384, flag="elites"
        ),
    )
    temperature: float = field(
        default=0.25,
        metadata=setting(
            "MPPI weight exp(temperature * (R - R_max))", low=0.001, high=100.0, flag="temperature"
        ),
    )
    init_std: float = field(
        default=2.0,
        metadata=setting(
            "sampling std at the start of every step (UR5e: in half action ranges)",
            low=0.001,
            high=10.0,
            flag="init_std",
        ),
    )
    min_std: float = field(
        default=0.05,
        metadata=setting(
            "lower bound of the sampling std (UR5e: in half action ranges)", low=0.0001, high=10.0
        ),
    )
    momentum: float = field(
        default=0.0,
        metadata=setting(
            "weight of the previous mean in each iteration's update", low=0.0, high=0.99
        ),
    )
    discount: float = field(
        default=0.99, metadata=setting("discount gamma of the planned return", low=0.5, high=1.0)
    )
    delay: int = 1  # warm start: shift of the previous mean, in control steps
    # Plan every `replan_period` control steps and execute the plan's next actions in between
    # (open loop within the chunk). 1 = the paper's (a new plan every step). A period k divides
    # the planning cost by k; the next plan's warm start shifts by the k steps executed
    # (delay + k - 1). Sized for CPU experiments in docs/adaptation.md.
    replan_period: int = field(
        default=1,
        metadata=setting(
            "plan every this many control steps, executing the plan's next actions between "
            "plans; 1 = the paper's",
            low=1,
            high=256,
            flag="replan_period",
        ),
    )
    # Where each step's Gaussian mean starts. "roll" (official MppiController): the previous mean
    # rolled forward by `delay` (its last `delay` rows come first) and zero after them. "shift"
    # (TD-MPC): the previous mean advanced by `delay`, zero tail. "policy": pi's chunk, so that a
    # drift the objective prefers cannot build up over steps (it did on the peg,
    # docs/notebook/peg_wide.md).
    warm_start: str = field(
        default="roll",
        metadata=setting(
            "where each step's mean starts: roll (the previous mean, official), shift (TD-MPC) or "
            "policy (pi's chunk)",
            choices=WARM_STARTS,
            flag="warm_start",
        ),
    )
    # The value of the last predicted latent is weighted discount^(horizon + value_discount_offset)
    # in the return; the official controller uses 1 (gamma^(T+1)).
    value_discount_offset: int = field(
        default=1,
        metadata=setting(
            "the last value is weighted discount^(horizon + this); 1 = official", low=0, high=1
        ),
    )
    # The official controller does not clamp (its actions are raw policy units with no bounds).
    clamp_actions: bool = field(
        default=False, metadata=setting("clamp candidates into the action bounds (official: no)")
    )
    # Ranking cost of a candidate's distance from pi's chunk: policy_prior x the squared
    # deviation in std_scale units, summed over action dimensions, averaged over the horizon.
    # 0 = official. Ours: on the peg the objective scored chunks that drifted off pi's path
    # above pi's own and the plan followed them (docs/notebook/peg_wide.md).
    policy_prior: float = field(
        default=0.0,
        metadata=setting(
            "ranking cost of a candidate's squared distance from pi's chunk (std units); "
            "0 = official",
            low=0.0,
            high=1000.0,
            flag="policy_prior",
        ),
    )
    seed: int = field(
        default=42,
        metadata=setting(
            "planner RNG seed (re-applied at every episode start)", low=0, high=2**31 - 1
        ),
    )
    max_nonfinite_candidates: int = 0  # per step; more raises PlannerError (0 = any NaN raises)
    # Per action dimension, the unit of init_std, min_std and policy_noise_std; () = raw action
    # units (Go2: mppi.yaml is in raw policy-action units). UR5e: half the action range, so its
    # settings act on actions normalised to [-1, 1] (ur5e_planner_config).
    std_scale: tuple[float, ...] = ()
    # How candidates are scored. "fast": planning.fast_objective (the same f, R and V arranged for
    # throughput; used when the model is a WorldModel, otherwise the eager path runs). "eager":
    # the model's own dynamics / reward / value calls, the reference the fast path is tested
    # against (docs/planner.md).
    evaluator: str = field(
        default="fast",
        metadata=setting(
            "how candidates are scored: fast (planning.fast_objective) or eager (the reference)",
            choices=EVALUATORS,
            flag="evaluator",
        ),
    )
    # The fast evaluator's compute dtype. "float32": the eager reference's precision (its returns
    # agree with it to float rounding). "bfloat16": f, R and V with bfloat16 weights and
    # activations (returns in float32), for CPUs with bf16 instructions (AVX512-BF16, AMX) and
    # GPUs; its bound against the reference and its closed-loop check are in docs/planner.md.
    precision: str = field(
        default="float32",
        metadata=setting(
            "fast evaluator's compute dtype: float32 or bfloat16 "
            "(CPUs with bf16 instructions, GPUs)",
            choices=PRECISIONS,
            flag="precision",
        ),
    )

    def __post_init__(self) -> None:
        problems = []
        if self.horizon < 1:
            problems.append(f"horizon must be >= 1, got {self.horizon}")
        if len(self.action_low) != len(self.action_high) or not self.action_low:
            problems.append(
                f"action_low/high must be non-empty and equally long, got "
                f"{len(self.action_low)} and {len(self.action_high)}"
            )
        elif not all(lo < hi for lo, hi in zip(self.action_low, self.action_high)):
            problems.append(
                f"need action_low < action_high, got {self.action_low} / {self.action_high}"
            )
        if self.num_samples < 1:
            problems.append(f"num_samples must be >= 1, got {self.num_samples}")
        if not 0.0 <= self.mixture_coef <= 1.0:
            problems.append(f"mixture_coef must be in [0, 1], got {self.mixture_coef}")
        if self.iterations < 1:
            problems.append(f"iterations must be >= 1, got {self.iterations}")
        if not 1 <= self.num_elites <= self.num_candidates:
            problems.append(
                f"num_elites must be in [1, {self.num_candidates}] (candidates), "
                f"got {self.num_elites}"
            )
        for name in ("temperature", "init_std", "min_std"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("policy_noise_std", "policy_prior"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.momentum < 1.0:
            problems.append(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0.0 < self.discount <= 1.0:
            problems.append(f"discount must be in (0, 1], got {self.discount}")
        if not 1 <= self.delay <= self.horizon:
            problems.append(f"delay must be in [1, horizon={self.horizon}], got {self.delay}")
        if not 1 <= self.replan_period <= self.horizon:
            problems.append(
                f"replan_period must be in [1, horizon={self.horizon}], got {self.replan_period}"
            )
        elif self.delay + self.replan_period - 1 > self.horizon:
            problems.append(
                f"delay + replan_period - 1 must be <= horizon={self.horizon} (the warm start's "
                f"shift), got {self.delay} + {self.replan_period} - 1"
            )
        if not 0 <= self.value_discount_offset <= 1:
            problems.append(
                f"value_discount_offset must be 0 or 1, got {self.value_discount_offset}"
            )
        if self.evaluator not in EVALUATORS:
            problems.append(f"evaluator must be one of {EVALUATORS}, got {self.evaluator!r}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        elif self.precision != "float32" and self.evaluator != "fast":
            problems.append(f"precision {self.precision} needs evaluator 'fast'")
        if self.warm_start not in WARM_STARTS:
            problems.append(f"warm_start must be one of {WARM_STARTS}, got {self.warm_start!r}")
        if self.std_scale and (
            len(self.std_scale) != len(self.action_low) or not all(u > 0 for u in self.std_scale)
        ):
            problems.append(
                f"std_scale must be empty or {len(self.action_low)} positive values, "
                f"got {self.std_scale}"
            )
        if self.max_nonfinite_candidates < 0:
            problems.append(
                f"max_nonfinite_candidates must be >= 0, got {self.max_nonfinite_candidates}"
            )
        if problems:
            raise ValueError("invalid PlannerConfig: " + "; ".join(problems))

    @property
    def action_dim(self) -> int:
        return len(self.action_low)

    @property
    def warm_start_shift(self) -> int:
        """Control steps the warm start shifts the previous mean by: the delay plus the plan's
        actions executed after its first (replan_period - 1)."""
        return self.delay + self.replan_period - 1

    @property
    def num_policy_samples(self) -> int:
        return int(self.num_samples * self.mixture_coef)

    @property
    def num_candidates(self) -> int:
        return self.num_samples + self.num_policy_samples


# Go2 rewards are IsaacLab-scaled (x 0.02 s per step) and V^e is in the same units (~3.4), so the
# returns of one step's candidates differ by ~1. At the official temperature 0.25 the elite
# weights are then nearly uniform (e^(0.25 * 1) = 1.3): the mean averaged 6 base-policy chunks
# with 26 random ones and the robot fell within 2 s on the sim slope. Measured on go2_slope sim
# (docs/planner.md): 0.25 / 2 / 5 / 10 / 30 / 100 / 300 -> 30 and 100 best (4 of 5 crossings).
GO2_TEMPERATURE = 30.0


# What the presets of the self-pretrained models change from the official controller: the
# TD-MPC warm start, gamma^T on the value and candidates clamped into the action bounds. They are
# the settings those models were measured with (docs/planner.md).
PROJECT_RETURN: dict[str, Any] = dict(
    warm_start="shift", value_discount_offset=0, clamp_actions=True
)


def official_planner_config(action_low, action_high, **overrides) -> PlannerConfig:
    """The official SimDist controller on the Go2 (mppi.yaml and MppiController as released):
    450 + 22 candidates, 8 iterations, 64 elites, temperature 0.25, H = T = 25, the "roll" warm
    start, gamma^(T+1) on the value, no clamping. For imported official models (model.official)."""
    return replace(
        PlannerConfig(horizon=25, action_low=tuple(action_low), action_high=tuple(action_high)),
        **overrides,
    )


def go2_planner_config(action_low, action_high, **overrides) -> PlannerConfig:
    """Go2 MPPI for self-pretrained models: the official sample, elite and iteration counts with
    the project's return (PROJECT_RETURN) and a temperature that fits their reward units
    (GO2_TEMPERATURE)."""
    return replace(
        PlannerConfig(
            horizon=25,
            action_low=tuple(action_low),
            action_high=tuple(action_high),
            temperature=GO2_TEMPERATURE,
            **PROJECT_RETURN,
        ),
        **overrides,
    )


def ur5e_planner_config(action_low, action_high, **overrides) -> PlannerConfig:
    """UR5e MPPI: init std 1.0, policy noise 0.1, temperature 0.4, T = 5 (METHOD_NOTES).

    The stds are in units of half the action range (`std_scale`): on the raw bounds (+-5 cm,
    +-0.5 rad per step) a std of 1.0 would put nearly every sample on a bound and the policy
    noise of 0.1 would drown pi's 1-2 cm steps. The official release ships one MPPI file (Go2);
    the sample, elite and iteration counts not fixed by the notes are taken from it unchanged
    (450 + 22 candidates, 64 elites, 8 iterations), with the project's return (PROJECT_RETURN).
    """
    half = tuple((hi - lo) / 2.0 for lo, hi in zip(action_low, action_high))
    return replace(
        PlannerConfig(
            horizon=5,
            action_low=tuple(action_low),
            action_high=tuple(action_high),
            init_std=1.0,
            policy_noise_std=0.1,
            temperature=0.4,
            std_scale=half,
            **PROJECT_RETURN,
        ),
        **overrides,
    )


# The one source of the planner's defaults: a preset per robot (its self-pretrained models) and
# the official controller's (Go2). The planner node's parameter defaults are these factories'
# values; the `planner:` sections of config/*.yaml name a preset and hold no value of their own.
PLANNER_CONFIGS = {"go2": go2_planner_config, "ur5e": ur5e_planner_config}
OFFICIAL_PRESET = "official"
PLANNER_PRESETS = {**PLANNER_CONFIGS, OFFICIAL_PRESET: official_planner_config}
PRESET_ROBOT = {"go2": "go2", "ur5e": "ur5e", OFFICIAL_PRESET: "go2"}  # the robot of each preset


def default_preset(robot: str, model_config=None) -> str:
    """The preset a model plans with unless one is named: the official controller's for an
    imported official model (model.official.is_official), else its robot's."""
    if model_config is not None and is_official(model_config):
        return OFFICIAL_PRESET
    return robot


def planner_config_for(spec, preset: str = "", **overrides) -> PlannerConfig:
    """A preset's PlannerConfig (default: the robot's own) with the action bounds of the robot's
    RobotSpec; `overrides` replace fields by name."""
    preset = preset or spec.name
    if preset not in PLANNER_PRESETS:
        raise ValueError(f"unknown planner preset {preset!r}; known: {sorted(PLANNER_PRESETS)}")
    if PRESET_ROBOT[preset] != spec.name:
        raise ValueError(
            f"planner preset {preset!r} is for the {PRESET_ROBOT[preset]}, not the {spec.name}"
        )
    return PLANNER_PRESETS[preset](spec.action_low, spec.action_high, **overrides)


# Every tunable planner parameter, in PlannerConfig's field order.
PLANNER_PARAMS: tuple[Param, ...] = settings(PlannerConfig)
PLANNER_FIELDS = tuple(p.name for p in PLANNER_PARAMS)
