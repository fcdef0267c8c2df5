"""A small real task for dataset tests: a 2-D point mass that must reach a goal.

Pure numpy, a few microseconds a step, with every observation term the real robots have
(proprio, one rendered camera, a height map, a command), a PD expert, a ladder of degraded
checkpoints and a privileged value. Registered only inside tests by monkeypatching TASKS.
"""

from __future__ import annotations

import numpy as np

from robot_drivers import registry
from robot_drivers.interface import (
    Command,
    CommandKind,
    Observation,
    ProprioTerm,
    RobotBackend,
    RobotSpec,
)
from robot_drivers.tasks.base import StepResult, Task
from simdist_planner.evaluation import datagen
from simdist_planner.evaluation.datagen import NoiseConfig, RobotDataConfig

ENTRY = registry.TaskEntry("toy", "toy_task:make_toy_task")  # robot_drivers.registry.TASKS["toy"]
DT = 0.1


class ToyBackend(RobotBackend):
    """Point mass in the unit square: acceleration commands, rendered top view."""

    def __init__(self, image_size: int = 12, cameras: tuple[str, ...] = ("top",)):
        self.spec = RobotSpec(
            name="toy",
            action_dim=2,
            control_rate_hz=1 / DT,
            proprio_terms=(ProprioTerm("pos", 2), ProprioTerm("vel", 2)),
            cameras=cameras,
            image_shape=(image_size, image_size),
            height_map_shape=(21, 15),
            command_dim=3,
            action_low=(-1.0, -1.0),
            action_high=(1.0, 1.0),
        )
        self.pos = np.zeros(2)
        self.vel = np.zeros(2)
        self.goal = np.zeros(2)
        self.accel = np.zeros(2)
        self.time = 0.0

    def reset(self, seed=None):
        rng = np.random.default_rng(seed)
        self.pos = rng.uniform(0.1, 0.9, 2)
        self.goal = rng.uniform(0.1, 0.9, 2)
        self.vel = np.zeros(2)
        self.accel = np.zeros(2)
        self.time = 0.0
        return self.observe()

    def act(self, command: Command) -> None:
        self.accel = np.clip(np.asarray(command.values, float), -1.0, 1.0)

    def step(self):
        self.vel = 0.9 * self.vel + DT * self.accel
        self.pos = np.clip(self.pos + DT * self.vel, 0.0, 1.0)
        self.time += DT
        return self.observe()

    def faults(self):
        return []

    def observe(self) -> Observation:
        n = self.spec.image_shape[0]
        images = {}
        for k, cam in enumerate(self.spec.cameras):
            img = np.full((n, n, 3), 40 * k, np.uint8)
            i, j = (np.clip(self.pos, 0, 0.999) * n).astype(int)
            gi, gj = (np.clip(self.goal, 0, 0.999) * n).astype(int)
            img[gi, gj] = (0, 255, 0)
            img[i, j] = (255, 0, 0)
            images[cam] = img
        ys, xs = np.meshgrid(np.linspace(0, 1, 21), np.linspace(0, 1, 15), indexing="ij")
        height = np.exp(-((ys - self.goal[0]) ** 2 + (xs - self.goal[1]) ** 2) * 10)
        return Observation(
            stamp=self.time,
            proprio=np.concatenate([self.pos, self.vel]).astype(np.float32),
            images=images,
            height_map=(height - self.pos[0]).astype(np.float32),
            command=np.array([*self.goal, 0.0], np.float32),
            privileged={"pos": self.pos.copy(), "vel": self.vel.copy(), "goal": self.goal.copy()},
        )


class ToyTask(Task):
    state_terms = (("goal_offset", 2),)

    def __init__(self, name, variant, max_steps=30, terminate_on_success=True, **backend_kw):
        self.name, self.variant, self.max_steps = name, variant, max_steps
        self.terminate_on_success = terminate_on_success
        self.backend = ToyBackend(**backend_kw)
        self._t = 0

    def reset(self, seed=None):
        self._t = 0
        return self.backend.reset(seed)

    def privileged_state(self, obs):
        return (obs.privileged["goal"] - obs.privileged["pos"]).astype(np.float32)

    def step(self, action):
        self.backend.act(Command(CommandKind.EE_DELTA, np.asarray(action, np.float32)))
        obs = self.backend.step()
        self._t += 1
        dist = float(np.linalg.norm(obs.privileged["pos"] - obs.privileged["goal"]))
        success = dist < 0.05
        return StepResult(
            obs=obs,
            reward=-dist,
            terminated=success and self.terminate_on_success,
            truncated=self._t >= self.max_steps,
            success=success,
        )


def make_toy_task(name, variant, options=None, **overrides):
    """The registry's factory signature: the entry's options (TaskOptions: max_steps), then
    the toy's own settings."""
    if options is not None and options.max_steps is not None:
        overrides["max_steps"] = options.max_steps
    return ToyTask(name, variant, **overrides)


class PDPolicy:
    """PD toward the goal; the sub-optimal rungs lower the gain and add a bias."""

    def __init__(self, gain: float, bias: float, name: str):
        self.gain, self.bias, self.name = gain, bias, name

    def reset(self, seed=None):
        pass

    def act(self, obs: Observation) -> np.ndarray:
        p = obs.privileged
        a = self.gain * (p["goal"] - p["pos"]) - 2.0 * p["vel"] + self.bias
        return np.clip(a, -1.0, 1.0).astype(np.float32)


def expert_ladder(task):
    return [
        PDPolicy(8.0, 0.0, "expert"),
        PDPolicy(3.0, 0.2, "ckpt_mid"),
        PDPolicy(0.5, 0.5, "ckpt_early"),
    ]


def expert_value(task):
    def value(obs: Observation) -> float:
        p = obs.privileged
        return -5.0 * float(np.linalg.norm(p["goal"] - p["pos"]))

    return value


def robot_data_config(spec):
    """Generation settings for the toy robot (the bursts of the UR5e, two action dims)."""

    return RobotDataConfig(
        noise=NoiseConfig(
            sigma_min=(0.05, 0.1), sigma_max=(0.4, 0.8), burst_steps=(1, 5), clean_steps=(5, 10)
        ),
        obs_noise={"pos": 0.01, "vel": 0.02, "height_map": 0.02},
        default_episodes=6,
    )


def register():
    """For subprocesses that run the CLI on the toy task (tests use monkeypatch instead)."""

    registry.TASKS["toy"] = ENTRY
    datagen.ROBOT_DATA_CONFIGS["toy"] = robot_data_config
