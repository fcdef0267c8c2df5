"""Agents over robot observations: a world model as a Policy, MPPI or its base policy pi alone."""

from __future__ import annotations

import numpy as np
import torch

from robot_drivers.interface import Observation, RobotSpec
from robot_drivers.registry import expert_ladder
from robot_drivers.tasks.base import Policy, Task
from simdist_planner.planning.config import default_preset, planner_config_for
from simdist_planner.planning.observation import (
    ObservationHistory,
    observation_to_inputs,
)
from simdist_planner.planning.planner import Planner, PlannerError, PlanResult, make_planner

AGENTS = ("expert", "policy", "planner")


class Agent:
    """A world model as a `Policy` over Observations: MPPI (`planner`) or its base policy pi alone.

    Keeps the proprio/action history the model conditions on; the first observation of an
    episode fills it (o_0 repeated, zero actions), as the dataset windows do.
    """

    def __init__(self, model, spec: RobotSpec, planner: Planner | None = None, device="cpu"):
        check_model_fits(model, spec)
        cfg = model.config
        self.model, self.spec, self.planner = model, spec, planner
        self.device = torch.device(device)
        self.history = ObservationHistory(spec, cfg.history)
        self._low, self._high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        self._fresh = True
        # the planner's PlanResult of the latest step (diagnostics)
        self.last_plan: PlanResult | None = None

    def reset(self, seed: int | None = None) -> None:
        if self.planner is not None:
            self.planner.reset(seed)
        self._fresh = True
        self.last_plan = None

    def act(self, obs: Observation) -> np.ndarray:
        if self._fresh:
            self.history.reset(obs)
            self._fresh = False
        inputs = observation_to_inputs(obs, self.spec, self.device)
        proprio, actions = self.history.tensors(self.device)
        if self.planner is not None:
            self.last_plan = self.planner.plan(inputs, proprio, actions)
            action = self.last_plan.action
        else:
            action = self._policy_action(inputs, proprio, actions)
        action = np.clip(action, self._low, self._high).astype(np.float32)
        self.history.push(obs, action)
        return action

    def _policy_action(self, inputs, proprio, actions) -> np.ndarray:
        return policy_chunk(self.model, inputs, proprio, actions)[0]


def check_model_fits(model, spec: RobotSpec) -> None:
    """Raise ValueError unless the world model's inputs and outputs are this robot's."""
    cfg = model.config
    mismatch = [
        f"{name} {mine} != robot {theirs}"
        for name, mine, theirs in (
            ("proprio_dim", cfg.proprio_dim, spec.proprio_dim),
            ("action_dim", cfg.action_dim, spec.action_dim),
            ("command_dim", cfg.command_dim, spec.command_dim),
            ("cameras", tuple(cfg.image.cameras) if cfg.image else (), tuple(spec.cameras)),
        )
        if mine != theirs
    ]
    if mismatch:
        raise ValueError(
            f"model ({cfg.robot}) does not fit robot {spec.name}: " + "; ".join(mismatch)
        )


def policy_chunk(model, inputs, proprio, actions) -> np.ndarray:
    """pi's action chunk (T, A) for model inputs and history tensors (batch 1); never non-finite."""
    with torch.no_grad():
        z = model.encode(inputs)
        history = model.encode_history(proprio, actions)
        chunk = (
            model.policy(z, history, inputs.get("command"), inputs["proprio"])[0]
            .float()
            .cpu()
            .numpy()
        )
    if not np.all(np.isfinite(chunk)):
        raise PlannerError(
            f"base policy produced a non-finite action chunk (first action {chunk[0].tolist()})"
        )
    return chunk


def build_agents(
    names, task: Task, model=None, device="cpu", preset: str = "", **planner_overrides
) -> dict[str, Policy]:
    """Agents by name; `policy` and `planner` need a world model. The planner takes `preset`'s
    settings (default: config.default_preset for the model) with `planner_overrides`."""
    agents: dict[str, Policy] = {}
    for name in names:
        if name not in AGENTS:
            raise ValueError(f"unknown agent {name!r}; choose from {AGENTS}")
        if name == "expert":
            agents[name] = expert_ladder(task)[0]
            continue
        if model is None:
            raise ValueError(f"agent {name!r} needs a world model: pass --checkpoint")
        planner = None
        if name == "planner":
            config = planner_config_for(
                task.spec,
                preset or default_preset(task.spec.name, model.config),
                horizon=model.config.horizon,
                **planner_overrides,
            )
            planner = make_planner(config, model, device)
        agents[name] = Agent(model, task.spec, planner, device)
    return agents
