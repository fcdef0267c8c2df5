"""Seeded episodes on a "real" stand-in: run in this process or in spawned workers, kept on disk.

An episode depends only on its job and on the code that runs it, never on which worker ran it:
the checkpoint (weights, observation scaler, model config), MPPI with its resolved settings or
pi, the seed, the task and its options, the device, and the torch thread count (float32 sums are
split differently, and a contact-rich episode can amplify the last bits; workers run one thread
each). `EpisodeStore` keeps every finished episode under a key of all of these and of
`EPISODE_PROTOCOL`, so a long experiment that is killed resumes without running them again, and
a run with anything changed runs its episodes anew: the stats as JSON, a recorded episode's
observation rows and actions beside them as `.npz`.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import hashlib
import json
import math
import multiprocessing
import os
import pathlib
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
from safetensors import safe_open

from robot_drivers.registry import make_task
from robot_drivers.specs import robot_spec
from robot_drivers.tasks.base import Task
from simdist_planner.evaluation.agents import Agent, build_agents
from simdist_planner.model.checkpoint import (
    CONFIG,
    SCALER,
    WEIGHTS,
    load_checkpoint,
    read_config,
)
from simdist_planner.planning.config import default_preset, planner_config_for
from simdist_planner.planning.observation import ObservationError, observation_arrays
from simdist_planner.planning.planner import PlannerError

# The version of the episode path (task stepping, agents, planner, what an episode records): part
# of every stored episode's key. Bump it with a change that makes the same job give another
# episode, so that a resumed run re-runs what older code measured instead of mixing the two.
EPISODE_PROTOCOL = 2

# Seed ranges that never overlap: evaluation episodes, on-policy collection (D_real) and the
# selection of a stand-in (simdist-ladder), so no figure is measured on the seeds it was chosen on
# or trained on. `check_seeds` refuses options that would run one range into the next.
EVAL_SEED, COLLECT_SEED, SELECTION_SEED = 0, 100_000, 200_000
SEED_RANGES = {"evaluation": EVAL_SEED, "collection": COLLECT_SEED, "selection": SELECTION_SEED}
# An adaptation experiment's gate set: its first this many collected episodes (seeds COLLECT_SEED,
# ...), held out by every round's gate and never trained on.
GATE_EPISODES = 2


def check_seeds(purpose: str, count: int, why: str) -> None:
    """Raise ValueError if `count` seeds of `purpose` (from its SEED_RANGES start) reach into
    another purpose's range; `why` names the options that ask for them."""
    first = SEED_RANGES[purpose]
    last = first + count - 1
    for other, start in SEED_RANGES.items():
        if other != purpose and first <= start <= last:
            raise ValueError(
                f"{why} needs {purpose} seeds {first}..{last}, which run into the {other} seeds "
                f"(from {start}): a figure would be measured on seeds used for {other}; "
                f"ask for at most {start - first} {purpose} seeds"
            )


@dataclass(frozen=True)
class StandIn:
    """A rung of the Slippery Slope ladder: the panels' friction and the commanded speed."""

    friction: float
    speed: float  # m/s


# The rung `simdist_adapter.ladder.select_friction` chose on the imported official model's
# ladder before any adaptation run (table and commands: docs/adaptation.md); the demo and the
# documented experiment run on it.
CHOSEN_STAND_IN = StandIn(friction=0.13, speed=0.3)


@dataclass
class Episode:
    success: bool
    distance: float
    steps: int
    error: str
    episode_return: float = 0.0  # sum of the task's privileged rewards
    rows: list[dict] = field(default_factory=list)  # observation arrays o_0..o_L (recorded)
    actions: list[np.ndarray] = field(default_factory=list)
    values: list[float] = field(default_factory=list)  # planner's v^_{t+1} per step
    # wall time and CPU time of the process that ran it (what sizes a run on a shared machine,
    # where other processes lengthen the wall time only); not part of its key
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: `course` holds task options on top of the pool's own overrides
    (e.g. (("panel_friction", 0.12), ("speed", 0.3))), sorted by name."""

    checkpoint: str
    planner: bool  # MPPI with the pool's planner settings, else pi alone
    seed: int
    record: bool = False  # keep the observation rows and actions (D_real)
    course: tuple[tuple[str, float], ...] = ()


def course(**options) -> tuple[tuple[str, float], ...]:
    """Task options as an `EpisodeJob.course` (None values left out)."""
    return tuple(sorted((k, float(v)) for k, v in options.items() if v is not None))


def run_episode(task: Task, agent: Agent, seed: int, record: bool) -> Episode:
    """One seeded episode; a planner / observation error ends it as a failure, never acted on."""
    start, cpu = time.perf_counter(), time.process_time()
    obs = task.reset(seed)
    agent.reset(seed)
    ep = Episode(False, math.nan, 0, "")
    try:
        while ep.steps < task.max_steps:
            if record:
                ep.rows.append(observation_arrays(obs, task.spec))
            action = agent.act(obs)
            if agent.last_plan is not None:
                ep.values.append(float(agent.last_plan.values[0]))
            result = task.step(action)
            ep.actions.append(action)
            obs, ep.steps = result.obs, ep.steps + 1
            ep.episode_return += float(result.reward)
            ep.distance = float(result.info.get("distance", math.nan))
            ep.success = bool(result.success)
            if result.terminated or result.truncated:
                break
        if record:
            ep.rows.append(observation_arrays(obs, task.spec))
    except (PlannerError, ObservationError) as err:
        ep.error = str(err)
        ep.rows = ep.rows[: len(ep.actions) + 1]
    ep.seconds = time.perf_counter() - start
    ep.cpu_seconds = time.process_time() - cpu
    return ep


class EpisodeRunner:
    """Seeded episodes of one "real" task, for world models given by checkpoint directory.

    Holds a task per set of task options and the most recent models; `EpisodePool` runs one of
    these per worker process, and with one worker uses one directly, so both paths run the same
    code.
    """

    MAX_MODELS = 2  # the pretrained and the deployed model are enough
    MAX_TASKS = 4  # the task options one experiment interleaves (three speeds)

    def __init__(self, task_name: str, overrides: dict, device: str, planner: dict):
        self.task_name, self.overrides = task_name, dict(overrides)
        self.device, self.planner = device, planner
        self._models: dict[str, object] = {}
        self._tasks: dict[tuple, Task] = {}

    def task(self, options: tuple = ()) -> Task:
        if options not in self._tasks:
            if len(self._tasks) >= self.MAX_TASKS:
                self._tasks.pop(next(iter(self._tasks))).close()
            self._tasks[options] = make_task(
                self.task_name, "real", **{**self.overrides, **dict(options)}
            )
        return self._tasks[options]

    def model(self, checkpoint: str):
        if checkpoint not in self._models:
            if len(self._models) >= self.MAX_MODELS:
                self._models.pop(next(iter(self._models)))
            self._models[checkpoint] = load_checkpoint(checkpoint, device=self.device)
        return self._models[checkpoint]

    def agent(self, task: Task, checkpoint: str, planner: bool) -> Agent:
        name = "planner" if planner else "policy"
        agents = build_agents([name], task, self.model(checkpoint), self.device, **self.planner)
        agent = agents[name]
        assert isinstance(agent, Agent)  # build_agents' "policy" and "planner" are Agents
        return agent

    def episode(self, job: EpisodeJob) -> Episode:
        task = self.task(job.course)
        return run_episode(
            task, self.agent(task, job.checkpoint, job.planner), job.seed, job.record
        )

    def close(self) -> None:
        for task in self._tasks.values():
            task.close()
        self._tasks.clear()


_RUNNER: EpisodeRunner | None = None  # the worker process's runner


def _die_with_parent() -> None:
    """Linux: SIGTERM this worker when the process that spawned it dies. A killed experiment
    then leaves no worker finishing an episode nobody will read (minutes of CPU stolen from the
    resumed run). Elsewhere a worker ends when it next fails to reach its parent."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the request
        os._exit(1)


def _init_worker(task_name: str, overrides: dict, device: str, planner: dict) -> None:
    global _RUNNER
    _die_with_parent()
    torch.set_num_threads(1)  # the workers share the cores
    _RUNNER = EpisodeRunner(task_name, overrides, device, planner)


def _worker_episode(job: EpisodeJob) -> Episode:
    assert _RUNNER is not None  # the pool's initializer (_init_worker) built it
    return _RUNNER.episode(job)


class EpisodeStore:
    """Finished episodes on disk, one `<key>.json` each (plus `<key>.npz` when recorded).

    The JSON is written last, by rename, so an episode is either whole or absent: a kill in the
    middle of a write leaves at most a stray temporary file, never a half episode.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(identity: dict) -> str:
        text = json.dumps(identity, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def load(self, key: str) -> Episode | None:
        meta = self.root / f"{key}.json"
        if not meta.is_file():
            return None
        data = json.loads(meta.read_text())
        ep = Episode(**data["episode"])
        if data["recorded"]:
            with np.load(self.root / f"{key}.npz") as arrays:
                ep.actions = list(arrays["actions"])
                names = [n[len("rows_") :] for n in arrays.files if n.startswith("rows_")]
                rows = {n: arrays[f"rows_{n}"] for n in names}
                count = len(next(iter(rows.values()))) if rows else 0
                ep.rows = [{n: rows[n][i] for n in names} for i in range(count)]
        return ep

    def save(self, key: str, ep: Episode, identity: dict) -> None:
        recorded = bool(ep.rows)
        if recorded:
            arrays = {f"rows_{n}": np.stack([r[n] for r in ep.rows]) for n in ep.rows[0]}
            arrays["actions"] = np.asarray(ep.actions, dtype=np.float32).reshape(
                len(ep.actions), -1
            )
            # ignore: mypy matches a **dict against every keyword of np.savez, allow_pickle included
            self._replace(self.root / f"{key}.npz", lambda f: np.savez_compressed(f, **arrays))  # type: ignore[arg-type]
        stats = {k: v for k, v in asdict(ep).items() if k not in ("rows", "actions")}
        text = json.dumps({"job": identity, "episode": stats, "recorded": recorded}, default=float)
        self._replace(self.root / f"{key}.json", lambda f: f.write(text.encode()))

    @staticmethod
    def _replace(path: pathlib.Path, write) -> None:
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def checkpoint_digest(checkpoint: str | os.PathLike) -> str:
    """SHA-256 of everything a checkpoint's model computes with: its tensors (`weights_digest`),
    its observation scaler and its model config (as values, not file bytes)."""
    path = pathlib.Path(checkpoint)
    scaler = json.loads((path / SCALER).read_text())
    model = read_config(path).to_dict()
    text = json.dumps({"scaler": scaler, "config": model}, sort_keys=True, default=str)
    return hashlib.sha256(f"{weights_digest(path)}|{text}".encode()).hexdigest()


def resolved_planner(checkpoint: str | os.PathLike, overrides: dict) -> dict:
    """The PlannerConfig an agent over `checkpoint` plans with (evaluation.agents.build_agents):
    the preset `overrides["preset"]` names, else the model's default preset, with the other
    overrides, as a JSON-able dict. What an episode's key holds, so that a preset whose defaults
    change, or a flag left at its default, keys the episode by the settings that ran."""
    config = read_config(checkpoint)
    spec = robot_spec(config.robot)
    settings = dict(overrides)
    preset = settings.pop("preset", "") or default_preset(spec.name, config)
    resolved = planner_config_for(spec, preset, horizon=config.horizon, **settings)
    return json.loads(json.dumps(asdict(resolved)))


def weights_digest(checkpoint: str | os.PathLike) -> str:
    """SHA-256 over a checkpoint's tensors (name, dtype, shape, values, in name order): the
    model's identity in an episode's key. The file's bytes would not do: the same weights saved
    twice (a registry's v0000 is the pretrained model saved again) may lay out differently."""
    digest = hashlib.sha256()
    with safe_open(str(pathlib.Path(checkpoint) / WEIGHTS), "pt") as f:
        for name in sorted(f.keys()):
            tensor = f.get_tensor(name).contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class EpisodePool:
    """`run(jobs)` over one runner or a pool of spawned workers, reusing stored episodes."""

    def __init__(
        self,
        task_name: str,
        overrides: dict,
        device: str,
        planner: dict,
        workers: int,
        store: EpisodeStore | None = None,
    ):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        args = (task_name, overrides, device, planner)
        self._identity = {"task": task_name, "overrides": overrides, "device": device}
        self._planner = planner  # the overrides; an episode's key holds the resolved settings
        self.store = store
        self._workers = workers
        self._digests: dict[tuple, tuple[str, dict]] = {}  # checkpoint -> (digest, planner)
        self._local = EpisodeRunner(*args) if workers == 1 else None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if workers > 1:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=args,
            )

    def identity(self, job: EpisodeJob) -> dict:
        """What an episode depends on (its store key): the episode protocol, the task, its
        options and the device, the agent with its resolved planner settings, the checkpoint by
        content (a registry link counts by what it points to), the seed and the thread count."""
        path = pathlib.Path(job.checkpoint).resolve()
        cache = tuple(
            (str(path / name), (path / name).stat().st_mtime_ns, (path / name).stat().st_size)
            for name in (WEIGHTS, SCALER, CONFIG)
        )
        if cache not in self._digests:
            planner = resolved_planner(path, self._planner)
            self._digests[cache] = (checkpoint_digest(path), planner)
        digest, planner = self._digests[cache]
        return {
            **self._identity,
            "protocol": EPISODE_PROTOCOL,
            "planner": planner if job.planner else None,
            "agent": "planner" if job.planner else "policy",
            "checkpoint": digest,
            "seed": job.seed,
            "record": job.record,
            "course": dict(job.course),
            "threads": 1 if self._workers > 1 else torch.get_num_threads(),
        }

    def run(
        self,
        jobs: Sequence[EpisodeJob],
        on_done: Callable[[int, Episode, bool], None] | None = None,
    ) -> list[Episode]:
        """Every job's episode, in order; stored ones are loaded, the rest run and stored as
        each finishes. `on_done(index, episode, stored)` is called once per job."""
        jobs = [replace(j, checkpoint=str(pathlib.Path(j.checkpoint).resolve())) for j in jobs]
        identities = [self.identity(j) for j in jobs]
        keys = [EpisodeStore.key(i) for i in identities]
        out: list[Episode | None] = [None] * len(jobs)
        todo = []
        for i, key in enumerate(keys):
            ep = self.store.load(key) if self.store is not None else None
            if ep is not None:
                out[i] = ep
                if on_done:
                    on_done(i, ep, True)
            else:
                todo.append(i)

        def finish(i: int, ep: Episode) -> None:
            out[i] = ep
            if self.store is not None:
                self.store.save(keys[i], ep, identities[i])
            if on_done:
                on_done(i, ep, False)

        if self._local is not None:
            for i in todo:
                finish(i, self._local.episode(jobs[i]))
        elif self._pool is not None:
            futures = {self._pool.submit(_worker_episode, jobs[i]): i for i in todo}
            for future in concurrent.futures.as_completed(futures):
                finish(futures[future], future.result())
        done = [ep for ep in out if ep is not None]
        assert len(done) == len(jobs)  # every job was loaded or run
        return done

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        if self._local is not None:
            self._local.close()
