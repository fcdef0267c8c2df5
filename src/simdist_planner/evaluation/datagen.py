"""Simulation dataset generation (Algorithm 2 of SimDist) (run by `simdist-generate`).

Each episode: with probability `expert_prob` the expert acts, else a sub-optimal checkpoint
drawn uniformly from the rest of `expert_ladder(task)`; a per-episode diagonal action-noise
std sigma ~ U[sigma_min, sigma_max] (per action dimension) is added in bursts that alternate
with clean stretches (lengths uniform over inclusive integer ranges); a small fraction of
episodes is never noised. The expert flag of a step is 1 only when the expert acted without
noise. Rewards come from the task (privileged), values from `expert_value(task)`.

Observations are recorded clean; their randomisation (per-term noise, image appearance) is
applied at training time as augmentation, with the per-term noise stds stored in the shard
(`config.robot.obs_noise`), as the official code does.

With a `learner` (a world-model checkpoint), every episode is driven by the learner's base policy
pi instead, and the expert takes over in stretches (DAgger, Ross et al. 2011): the expert
labels, by acting, the states pi itself leads to, such as a peg lowered a centimetre short of
the hole. Learner steps have expert flag 0, so only the expert's stretches are targets for pi.

Every episode has its own random stream seeded by (seed, episode id), so its content does not
depend on the number of workers or on interruptions; worker k of W writes the episodes with
id % W == k to `shard-{k:05d}.h5`.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import pathlib
import queue as queue_mod
import threading
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import yaml
from tqdm import tqdm

from robot_drivers import registry
from simdist_planner.data.schema import EpisodeRecord, StepLayout, shard_name
from simdist_planner.data.writer import ShardWriter
from simdist_planner.evaluation.agents import check_model_fits, policy_chunk
from simdist_planner.model.checkpoint import load_checkpoint
from simdist_planner.planning.observation import ObservationHistory, observation_to_inputs


@dataclass(frozen=True)
class NoiseConfig:
    """Action-noise bursts of Algorithm 2; ranges of integers are inclusive."""

    sigma_min: tuple[float, ...]  # per action dimension
    sigma_max: tuple[float, ...]
    burst_steps: tuple[int, int]
    clean_steps: tuple[int, int]
    never_noise_prob: float = 0.025  # official: some environments are never noised
    start_noised_prob: float = 0.5  # official: half the environments start in a burst

    def __post_init__(self):
        if len(self.sigma_min) != len(self.sigma_max):
            raise ValueError("sigma_min and sigma_max need one entry per action dimension")
        if any(lo < 0 or hi < lo for lo, hi in zip(self.sigma_min, self.sigma_max)):
            raise ValueError(
                f"need 0 <= sigma_min <= sigma_max, got {self.sigma_min}, {self.sigma_max}"
            )
        for name in ("burst_steps", "clean_steps"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be an inclusive range 1 <= lo <= hi, got {(lo, hi)}")


@dataclass(frozen=True)
class RobotDataConfig:
    """What generation needs to know about a robot, beyond its RobotSpec."""

    noise: NoiseConfig
    obs_noise: dict[str, float]  # std per proprio term name and "height_map"; training-time
    default_episodes: int  # the CLI default: a run of a few minutes on two CPU cores
    task_overrides: dict = field(default_factory=dict)  # domain randomisation of the sim task


@dataclass(frozen=True)
class LearnerConfig:
    """Learner-driven episodes: pi of `checkpoint` drives, the expert takes over in stretches.

    Expert stretches of at least the model's horizon make whole action chunks targets for pi
    (the expert mask is a cumulative product along the chunk)."""

    checkpoint: str
    learner_steps: tuple[int, int] = (3, 12)  # inclusive range per learner stretch
    expert_steps: tuple[int, int] = (5, 10)
    device: str = "cpu"

    def __post_init__(self):
        for name in ("learner_steps", "expert_steps"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be an inclusive range 1 <= lo <= hi, got {(lo, hi)}")


@dataclass(frozen=True)
class GenerateConfig:
    task: str
    robot: RobotDataConfig
    episodes: int
    seed: int = 0
    variant: str = "sim"
    expert_prob: float = 0.5
    expert_only: bool = False  # expert every episode, never noised (Table I "expert-only data")
    max_steps: int | None = None  # cap on transitions per episode; None: the task's max_steps
    task_overrides: dict = field(default_factory=dict)
    learner: LearnerConfig | None = None  # DAgger-style episodes (module docstring)

    def __post_init__(self):
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {self.max_steps}")
        if not 0.0 <= self.expert_prob <= 1.0:
            raise ValueError(f"expert_prob must be in [0, 1], got {self.expert_prob}")

    def task_kwargs(self) -> dict:
        """The robot's randomisation, then this run's own overrides (which win)."""
        return {**self.robot.task_overrides, **self.task_overrides}

    def identity_json(self) -> str:
        """Everything that fixes episode contents (not the episode count): checked on resume."""
        d = dataclasses.asdict(self)
        d.pop("episodes")
        return json.dumps(d, sort_keys=True)


# ------------------------------------------------------------------------ per-robot defaults
GO2_FRICTION_RANGE = (0.2, 1.2)


def go2_data_config() -> RobotDataConfig:
    """Go2: action-noise ranges and observation noise from the official system_go2.yaml."""

    root = os.environ.get("SIMDIST_GO2_EXPERTS")
    if not root:
        raise RuntimeError("set SIMDIST_GO2_EXPERTS to the simdist_go2_experts directory")
    path = pathlib.Path(root) / "system_go2.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; SIMDIST_GO2_EXPERTS points at {root}")
    sys_cfg = yaml.safe_load(path.read_text())
    obs_noise = {t["name"]: float(t["noise"]) for t in sys_cfg["proprio_obs"]["types"]}
    for t in sys_cfg["extero_obs"]["types"]:
        if t["name"] == "height_scan":
            obs_noise["height_map"] = float(t["noise"])
    return RobotDataConfig(
        noise=NoiseConfig(
            sigma_min=tuple(float(a["min_noise"]) for a in sys_cfg["actions"]),
            sigma_max=tuple(float(a["max_noise"]) for a in sys_cfg["actions"]),
            burst_steps=(1, 50),
            clean_steps=(25, 500),
        ),
        obs_noise=obs_noise,
        default_episodes=8,
        # official simdist/rl/go2.py: foot friction U(0.2, 1.2) per environment, so D_sim holds
        # slipping and the experts' low-friction gaits (the expert sees it in material_properties)
        task_overrides={"friction_range": GO2_FRICTION_RANGE},
    )


# UR5e action noise is not fixed by the paper: sigma ranges from 5% to 50% of each dimension's
# half range (the gripper included, so bursts can also open or close it).
UR5E_SIGMA_FRACTION = (0.05, 0.5)
# Training-time proprio noise per term (our choice; the paper randomises but gives no values).
# The peg's hole has 1 mm of clearance per side, so the noise stays well under a millimetre at
# the TCP, as a UR5e's own readings do (joints to ~1e-5 rad, TCP repeatability 0.03 mm); older
# shards carry larger stds (docs/notebook/dataset.md). The gripper gets the Robotiq's 8-bit position
# resolution (1/255 of the range: a uniform error of std 0.0011): its reading tells a grip flat
# on the peg from one caught on its edges by 0.005, which a std of 0.02 would drown.
UR5E_OBS_NOISE = {
    "joint_pos": 0.0003,  # rad: 0.25 mm at the TCP at full reach
    "joint_vel": 0.01,  # rad/s
    "tcp_pos": 0.0002,  # m
    "tcp_rot6d": 0.002,
    "gripper": 0.002,
}


def ur5e_data_config(spec) -> RobotDataConfig:
    if not spec.action_low or not spec.action_high:
        raise ValueError(f"{spec.name}: RobotSpec needs action_low/action_high to scale the noise")
    half = (np.asarray(spec.action_high, float) - np.asarray(spec.action_low, float)) / 2
    lo, hi = UR5E_SIGMA_FRACTION
    return RobotDataConfig(
        noise=NoiseConfig(
            sigma_min=tuple(float(x) for x in lo * half),
            sigma_max=tuple(float(x) for x in hi * half),
            burst_steps=(1, 5),
            clean_steps=(5, 10),
        ),
        obs_noise=dict(UR5E_OBS_NOISE),
        default_episodes=10,
    )


# robot name (RobotSpec.name) -> RobotDataConfig factory taking the spec
ROBOT_DATA_CONFIGS = {
    "go2": lambda spec: go2_data_config(),
    "ur5e": ur5e_data_config,
}


def robot_data_config(spec) -> RobotDataConfig:
    if spec.name not in ROBOT_DATA_CONFIGS:
        raise ValueError(
            f"no data-generation defaults for robot {spec.name!r}; "
            f"known: {sorted(ROBOT_DATA_CONFIGS)}"
        )
    return ROBOT_DATA_CONFIGS[spec.name](spec)


# ------------------------------------------------------------------------------ the mixture
def expected_expert_fraction(cfg: GenerateConfig, n_ladder: int, steps: int) -> float:
    """Exact expected fraction of clean expert actions in episodes of exactly `steps` actions.

    Propagates the distribution of the burst state (noised?, steps left) step by step.
    """
    if cfg.expert_only or n_ladder == 1:
        p_expert = 1.0
    else:
        p_expert = cfg.expert_prob
    if cfg.expert_only:
        return p_expert
    nz = cfg.robot.noise
    lengths = {True: nz.burst_steps, False: nz.clean_steps}
    size = max(nz.burst_steps[1], nz.clean_steps[1]) + 1
    dist = {s: np.zeros(size) for s in (True, False)}  # P(noised=s, timer=k)
    for s, p in ((True, nz.start_noised_prob), (False, 1 - nz.start_noised_prob)):
        lo, hi = lengths[s]
        dist[s][lo : hi + 1] = p / (hi - lo + 1)
    clean = 0.0
    for _ in range(steps):
        clean += dist[False].sum()
        new = {s: np.zeros(size) for s in (True, False)}
        for s in (True, False):
            new[s][:-1] += dist[s][1:]  # timer decrements
            flip = dist[s][1]  # timer reaches 0: switch state, draw a new timer
            lo, hi = lengths[not s]
            new[not s][lo : hi + 1] += flip / (hi - lo + 1)
            new[s][0] = 0.0
        dist = new
    frac_clean = nz.never_noise_prob + (1 - nz.never_noise_prob) * clean / steps
    return p_expert * frac_clean


class _Bursts:
    """The noised / clean alternation of one episode."""

    def __init__(self, noise: NoiseConfig, rng: np.random.Generator, enabled: bool):
        self.noise, self.rng = noise, rng
        self.never = (not enabled) or bool(rng.random() < noise.never_noise_prob)
        self.noised = (not self.never) and bool(rng.random() < noise.start_noised_prob)
        self.timer = self._draw()

    def _draw(self) -> int:
        lo, hi = self.noise.burst_steps if self.noised else self.noise.clean_steps
        return int(self.rng.integers(lo, hi + 1))

    def advance(self) -> None:
        self.timer -= 1
        if self.timer <= 0 and not self.never:
            self.noised = not self.noised
            self.timer = self._draw()


class _Takeovers:
    """The learner / expert alternation of one learner-driven episode; the learner starts."""

    def __init__(self, cfg: LearnerConfig, rng: np.random.Generator):
        self.cfg, self.rng = cfg, rng
        self.learner_drives = True
        self.timer = self._draw()

    def _draw(self) -> int:
        lo, hi = self.cfg.learner_steps if self.learner_drives else self.cfg.expert_steps
        return int(self.rng.integers(lo, hi + 1))

    def advance(self) -> None:
        self.timer -= 1
        if self.timer <= 0:
            self.learner_drives = not self.learner_drives
            self.timer = self._draw()


class _Learner:
    """pi of a world-model checkpoint, conditioned on the EXECUTED actions (its own or the
    expert's), as the dataset windows it was trained on are."""

    def __init__(self, cfg: LearnerConfig, spec):
        self.cfg = cfg
        self._policy_chunk = policy_chunk
        self.device = cfg.device
        self.model = load_checkpoint(cfg.checkpoint, device=cfg.device).eval()
        check_model_fits(self.model, spec)
        self.spec = spec
        self.history = ObservationHistory(spec, self.model.config.history)

    def reset(self, obs) -> None:
        self.history.reset(obs)

    def act(self, obs) -> np.ndarray:
        proprio, actions = self.history.tensors(self.device)
        inputs = observation_to_inputs(obs, self.spec, self.device)
        return self._policy_chunk(self.model, inputs, proprio, actions)[0]

    def push(self, obs, action: np.ndarray) -> None:
        self.history.push(obs, action)


# --------------------------------------------------------------------------------- episodes
class EpisodeGenerator:
    """Builds one task, its expert ladder and value once; then generates episodes by id."""

    def __init__(self, cfg: GenerateConfig):
        self.cfg = cfg
        self.task = registry.make_task(cfg.task, cfg.variant, **cfg.task_kwargs())
        self.ladder = list(registry.expert_ladder(self.task))
        if not self.ladder:
            raise ValueError(f"{cfg.task}: expert_ladder returned no policies")
        self.value_fn = registry.expert_value(self.task)
        self.spec = self.task.spec
        self.layout = StepLayout.from_spec(self.spec, self.task.state_terms)
        a = self.spec.action_dim
        if len(cfg.robot.noise.sigma_min) != a:
            raise ValueError(
                f"{cfg.task}: noise config has {len(cfg.robot.noise.sigma_min)} dimensions, "
                f"the robot's action has {a}"
            )
        bounded = bool(self.spec.action_low)
        self.low = np.asarray(self.spec.action_low, np.float32) if bounded else None
        self.high = np.asarray(self.spec.action_high, np.float32) if bounded else None
        self.max_steps = cfg.max_steps or self.task.max_steps
        self.learner = _Learner(cfg.learner, self.spec) if cfg.learner is not None else None

    def policy_names(self) -> list[str]:
        names = [getattr(p, "name", f"{type(p).__name__}_{i}") for i, p in enumerate(self.ladder)]
        return names + (["learner"] if self.learner is not None else [])

    def episode(self, episode_id: int) -> EpisodeRecord:
        cfg, nz = self.cfg, self.cfg.robot.noise
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, episode_id]))
        seed = int(rng.integers(2**31 - 1))
        learner, takeovers = self.learner, None
        if learner is not None:  # the expert (index 0) labels by acting in its stretches
            takeovers = _Takeovers(learner.cfg, rng)
            policy_idx = 0
        elif cfg.expert_only or len(self.ladder) == 1 or rng.random() < cfg.expert_prob:
            policy_idx = 0
        else:
            policy_idx = 1 + int(rng.integers(len(self.ladder) - 1))
        sigma = rng.uniform(nz.sigma_min, nz.sigma_max).astype(np.float32)
        bursts = _Bursts(nz, rng, enabled=not cfg.expert_only and takeovers is None)
        policy = self.ladder[policy_idx]
        policy.reset(seed)
        obs = self.task.reset(seed)
        if learner is not None:
            learner.reset(obs)
        rows: dict[str, list] = {
            k: [] for k in self.layout.step_shapes() if k not in ("episode", "t")
        }
        for _ in range(self.max_steps):
            # the expert acts every step, also while the learner drives, so its phases follow
            clean = np.asarray(policy.act(obs), np.float32)
            if clean.shape != (self.spec.action_dim,) or not np.all(np.isfinite(clean)):
                raise RuntimeError(
                    f"{cfg.task}: policy {self.policy_names()[policy_idx]} returned "
                    f"{clean!r}; expected {self.spec.action_dim} finite values"
                )
            action = clean
            learner_drives = takeovers is not None and takeovers.learner_drives
            if learner is not None and learner_drives:
                action = learner.act(obs)
            elif bursts.noised:
                action = clean + sigma * rng.standard_normal(clean.shape).astype(np.float32)
            if self.low is not None:
                action = np.clip(action, self.low, self.high)
            expert = policy_idx == 0 and not bursts.noised and not learner_drives
            self._record(rows, obs, action, expert, bursts.noised)
            if learner is not None and takeovers is not None:
                learner.push(obs, action)
                takeovers.advance()
            result = self.task.step(action)
            rows["reward"].append(float(result.reward))
            obs = result.obs
            bursts.advance()
            if result.terminated or result.truncated:
                break
        self._record(rows, obs, np.zeros(self.spec.action_dim, np.float32), False, False)
        rows["reward"].append(0.0)
        shapes = self.layout.step_shapes()
        steps: dict[str, np.ndarray] = {
            k: np.asarray(v, dtype=shapes[k][1]) for k, v in rows.items()
        }
        return EpisodeRecord(
            id=episode_id,
            steps=steps,
            policy=policy_idx if takeovers is None else len(self.ladder),
            seed=seed,
            noise_scale=sigma,
            never_noised=bursts.never,
            success=bool(result.success),
            terminated=bool(result.terminated),
            truncated=not result.terminated,  # the task's time limit or our max_steps cap
            meta={
                "policy_name": "learner"
                if takeovers is not None
                else self.policy_names()[policy_idx]
            },
        )

    def _record(self, rows, obs, action, expert: bool, noised: bool) -> None:
        rows["proprio"].append(obs.proprio)
        for cam in self.layout.cameras:
            rows[f"images/{cam}"].append(obs.images[cam])
        if self.layout.height_map_shape:
            rows["height_map"].append(obs.height_map)
        if self.layout.command_dim:
            rows["command"].append(obs.command)
        if self.layout.state_terms:
            rows["state"].append(self.task.privileged_state(obs))
        rows["action"].append(action)
        rows["value"].append(float(self.value_fn(obs)))
        rows["expert"].append(expert)
        rows["noised"].append(noised)

    def close(self) -> None:
        self.task.close()


# ----------------------------------------------------------------------------------- shards
def shard_episode_ids(episodes: int, shard: int, num_shards: int) -> list[int]:
    return list(range(shard, episodes, num_shards))


def run_shard(
    cfg: GenerateConfig,
    out: str | os.PathLike,
    shard: int,
    num_shards: int,
    resume: bool = False,
    on_episode=None,
    task_entry: registry.TaskEntry | None = None,
) -> pathlib.Path:
    """Generate (or finish) one shard; `on_episode(rows)` is called after each episode."""

    if task_entry is not None:  # a spawned worker: register the parent's entry for this task
        registry.TASKS.setdefault(cfg.task, task_entry)
    gen = EpisodeGenerator(cfg)
    path = pathlib.Path(out) / shard_name(shard)
    attrs: dict[str, str | int | float] = {
        "task": cfg.task,
        "variant": cfg.variant,
        "robot": gen.spec.name,
        "config": cfg.identity_json(),
        "episodes_requested": cfg.episodes,
        "policy_names": json.dumps(gen.policy_names()),
        "shard_index": shard,
        "num_shards": num_shards,
        "generator": "simdist_planner.evaluation.datagen",
    }
    try:
        with ShardWriter(
            path, gen.layout, attrs, resume, mutable_attrs=("episodes_requested",)
        ) as w:
            todo = shard_episode_ids(cfg.episodes, shard, num_shards)
            done = w.episode_ids
            if done != todo[: len(done)]:
                raise RuntimeError(
                    f"{path} holds episodes {done[:5]}... which are not a prefix of this "
                    f"shard's episodes {todo[:5]}...; use a new --out"
                )
            for ep_id in todo[len(done) :]:
                record = gen.episode(ep_id)
                w.append(record)
                if on_episode is not None:
                    on_episode(len(record.steps["reward"]))
    finally:
        gen.close()
    return path


def _warm_up(cfg: GenerateConfig) -> None:
    """Build V^e once before the workers start, so a fitted-and-cached value is fitted once."""

    task = registry.make_task(cfg.task, cfg.variant, **cfg.task_kwargs())
    try:
        registry.expert_value(task)
    finally:
        task.close()


def _exit_with(parent: int) -> None:
    """End this worker once `parent` is gone: killed, the parent cannot stop its workers, which
    would go on writing episodes nobody waits for (a --resume finishes the shard)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _worker(cfg, out, shard, num_shards, resume, task_entry, queue, parent) -> None:
    _exit_with(parent)
    try:
        run_shard(cfg, out, shard, num_shards, resume, lambda n: queue.put(("ep", n)), task_entry)
        queue.put(("done", shard))
    except BaseException:  # report everything, the parent raises it
        queue.put(("error", f"shard {shard}:\n{traceback.format_exc()}"))


def generate(
    cfg: GenerateConfig,
    out: str | os.PathLike,
    workers: int = 1,
    resume: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    progress: bool = True,
) -> list[pathlib.Path]:
    """Generate the dataset; `rank`/`world_size` (torchrun) write only shard `rank`."""

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if world_size is not None and world_size > 1:
        if workers != 1:
            raise ValueError("under torchrun each rank is one worker: use --workers 1")
        if rank is None:
            raise ValueError(f"world_size {world_size} needs this process's rank")
        shards, num_shards = [rank], world_size
    else:
        shards, num_shards = list(range(workers)), workers
    if workers < 1 or num_shards > cfg.episodes:
        raise ValueError(f"need 1 <= shards ({num_shards}) <= episodes ({cfg.episodes})")
    total = sum(len(shard_episode_ids(cfg.episodes, s, num_shards)) for s in shards)
    bar = tqdm(total=total, desc=f"{cfg.task} episodes", unit="ep", disable=not progress)
    rows = [0]
    start = time.perf_counter()

    def tick(n: int) -> None:
        rows[0] += n
        bar.update(1)
        bar.set_postfix(rows=rows[0], rows_per_s=f"{rows[0] / (time.perf_counter() - start):.0f}")

    try:
        if len(shards) == 1:
            return [run_shard(cfg, out, shards[0], num_shards, resume, tick)]
        _warm_up(cfg)
        ctx = mp.get_context("spawn")  # no fork: MuJoCo GL contexts and torch threads
        queue = ctx.Queue()
        entry = registry.TASKS.get(cfg.task)
        procs = [
            ctx.Process(
                target=_worker, args=(cfg, out, s, num_shards, resume, entry, queue, os.getpid())
            )
            for s in shards
        ]
        for p in procs:
            p.start()
        finished, errors = 0, []
        while finished < len(procs):
            try:
                kind, payload = queue.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [s for s, p in zip(shards, procs) if p.exitcode not in (None, 0)]
                if dead and queue.empty():  # died without a report (killed, crashed at import)
                    errors.append(f"worker(s) for shards {dead} exited without a report")
                    break
                continue
            if kind == "ep":
                tick(payload)
            else:
                finished += 1
                if kind == "error":
                    errors.append(payload)
        for p in procs:
            if errors:
                p.terminate()
            p.join()
        if errors:
            raise RuntimeError("generation failed in a worker:\n" + "\n".join(errors))
        return [out / shard_name(s) for s in shards]
    finally:
        bar.close()


# -------------------------------------------------------------------------------------- CLI
