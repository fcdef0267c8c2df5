"""`simdist-adapt-experiment`: Algorithm 1's real-world loop on a "real" stand-in task, measured.

For each method: zero-shot success of the pretrained model, then J rounds of (M planner episodes
added to D_real, one adaptation round on f behind the validation gate, N seeded evaluation
episodes). Methods: `simdist` (only f), the paper's two ablations `unfreeze_encoder` and
`unfreeze_value`, and `base_policy` (pi alone; adaptation never touches pi, so it is evaluated
once). Runs without ROS (episodes in this process or in `--workers` processes) so the figures
measure the method, not the middleware; `make demo` runs the same loop through the ROS graph.
Output: a table, `results.json` with every figure, and PNG plots (success vs real episodes,
held-out latent loss before/after each round, predicted value over a successful and a failed
episode, and predicted vs real joint trajectory through a linear latent probe before/after
fine-tuning, our analogue of the paper's Fig. 8).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from robot_drivers.registry import make_task, task_list
from robot_drivers.tasks.base import Task
from simdist_adapter.adapter import adapt_on_dataset
from simdist_adapter.episodes import (
    COLLECT_SEED,
    EVAL_SEED,
    GATE_EPISODES,
    Episode,
    EpisodeJob,
    EpisodePool,
    EpisodeStore,
    check_seeds,
    checkpoint_digest,
    course,
    resolved_planner,
)
from simdist_adapter.finetune import AdaptConfig, real_windows, window_batch
from simdist_adapter.registry import ModelRegistry, load_delta, save_delta
from simdist_adapter.results import format_table, read_rounds, write_json
from simdist_planner.cli.common import (
    add_planner_arguments,
    add_task_option_arguments,
    checked_task_options,
    planner_overrides,
)
from simdist_planner.data.schema import StepLayout, shard_name
from simdist_planner.data.writer import ShardWriter, episode_record
from simdist_planner.evaluation.evaluate import task_overrides
from simdist_planner.model.checkpoint import load_checkpoint

METHODS: dict[str, dict[str, Any] | None] = {  # AdaptConfig overrides; None: not adapted
    "simdist": {},
    "unfreeze_encoder": {"train_encoder": True},
    "unfreeze_value": {"train_value": True},
    "base_policy": None,
}


def _score(episodes: list[Episode], dt: float, limit: int) -> dict:
    """Success, return, distance, falls, errors and throughput (successes per minute of robot
    time, the paper's Fig. 6) of one evaluation's episodes, whose step limit is `limit`.

    A fall is an episode that ended before its limit without success or error: the tasks end
    early only on success or failure (the Go2 fell; the UR5e dropped its object or diverged).
    An episode ends at its first fall, so its length is the time to that fall."""
    dist = [e.distance for e in episodes if not math.isnan(e.distance)]
    minutes = sum(e.steps for e in episodes) * dt / 60.0
    successes = sum(e.success for e in episodes)
    falls = [e.steps * dt for e in episodes if not (e.success or e.error) and e.steps < limit]
    return {
        "success_rate": float(np.mean([e.success for e in episodes])),
        "successes": int(successes),
        "episodes": len(episodes),
        "mean_return": float(np.mean([e.episode_return for e in episodes])),
        "mean_distance": float(np.mean(dist)) if dist else None,
        "falls": len(falls),
        "mean_time_to_fall_s": float(np.mean(falls)) if falls else None,
        "errors": sum(bool(e.error) for e in episodes),
        "robot_minutes": minutes,
        "successes_per_minute": successes / minutes if minutes > 0 else 0.0,
    }


def _figure(score: dict, key: str) -> float:
    """One figure of a score for a plot: NaN where it is undefined (no distance on the UR5e, no
    time to a fall without falls) or absent (a score written before the figure existed)."""
    value = score.get(key)
    return math.nan if value is None else float(value)


@dataclass
class ExperimentConfig:
    task: str = "slippery_slope"
    region: str | None = None  # UR5e start region (None: wide); the Go2 tasks have none
    checkpoint: str = ""
    out: str = "artifacts/adapt_experiment"
    methods: tuple[str, ...] = ("simdist", "unfreeze_encoder", "unfreeze_value", "base_policy")
    rounds: int = 3  # J
    episodes_per_round: int = 10  # M
    eval_episodes: int = 20
    # The gate's held-out episodes: the first `gate_episodes` collected in round 1 (seeds
    # COLLECT_SEED, ...), held out in every round and never trained on.
    gate_episodes: int = GATE_EPISODES
    max_steps: int | None = None  # episode length override (None: the task's)
    # Go2 task options (robot_drivers.tasks.go2_tasks): the commanded speed of collection and of
    # the headline evaluation, and the Slippery Slope stand-in's panel friction (None: the task's)
    speed: float | None = None
    panel_friction: float | None = None
    other_speeds: tuple[float, ...] = ()  # further speeds evaluated (at other_speeds_at)
    other_eval_episodes: int = 5  # evaluation episodes at each of other_speeds
    # The evaluation points with other_speeds: 0 = zero-shot, j = after round j, -1 = after the
    # last round; () = every point.
    other_speeds_at: tuple[int, ...] = ()
    device: str = "cpu"
    workers: int = 1  # processes running episodes side by side (each: one task + one model copy)
    planner: dict = field(default_factory=dict)  # PlannerConfig overrides (num_samples, ...)
    adapt: AdaptConfig = field(default_factory=AdaptConfig)

    def __post_init__(self):
        unknown = sorted(set(self.methods) - set(METHODS))
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; choose from {sorted(METHODS)}")
        if min(self.rounds, self.episodes_per_round, self.eval_episodes, self.workers) < 1:
            raise ValueError("rounds, episodes_per_round, eval_episodes and workers must be >= 1")
        if self.other_speeds and self.other_eval_episodes < 1:
            raise ValueError("other_eval_episodes must be >= 1 when other_speeds are given")
        if any(not -1 <= p <= self.rounds for p in self.other_speeds_at):
            raise ValueError(
                f"other_speeds_at takes points 0..{self.rounds} (rounds) or -1 (the last), "
                f"got {self.other_speeds_at}"
            )
        if not 1 <= self.gate_episodes < self.episodes_per_round:
            raise ValueError(
                f"gate_episodes must be in [1, episodes_per_round - 1] (round 1 trains on the "
                f"rest), got {self.gate_episodes} of {self.episodes_per_round}"
            )
        evaluated = max(self.eval_episodes, self.other_eval_episodes if self.other_speeds else 0)
        check_seeds("evaluation", evaluated, "--eval-episodes / --other-eval-episodes")
        check_seeds(
            "collection",
            self.rounds * self.episodes_per_round,
            "--rounds x --episodes-per-round",
        )

    @property
    def gate_seeds(self) -> list[int]:
        return list(range(COLLECT_SEED, COLLECT_SEED + self.gate_episodes))


# What a run folder keeps out of git: the registries' checkpoints (rebuilt from the pretrained
# model and `<method>/versions/`), D_real (rebuilt from the stored episodes every round) and the
# temporary files of atomic writes.
RUN_GITIGNORE = "*/registry/\n*/d_real/\n.*\n!.gitignore\n"


class Experiment:
    """Algorithm 1 measured; everything it finishes is kept in `out`, so a killed run resumes,
    also from a fresh clone of a repository that holds `out` (the same command continues it).

    Kept, all of it small enough for git: `config.json` (the command, the resolved planner and
    the pretrained checkpoint's digest; a run refuses another checkpoint), every episode
    (`episodes/`, by everything it depends on), each method's rounds (`<method>/rounds.json`,
    written when a round's adaptation ends and again when its evaluation ends) and its deployed
    versions as deltas against the pretrained weights (`<method>/versions/`, registry.save_delta).
    The registries (`<method>/registry/`) are rebuilt from those. A round whose adaptation was not
    recorded is re-run from its start (its episodes come from the store); a version it deployed
    before the kill is rolled back first.
    """

    def __init__(self, config: ExperimentConfig, command: str = ""):
        self.cfg = config
        self.out = pathlib.Path(config.out)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / ".gitignore").write_text(RUN_GITIGNORE)
        self.pretrained = load_checkpoint(config.checkpoint, device=config.device)
        self._record_config(command)
        overrides = task_overrides(config.task, config.region, config.max_steps, self.pretrained)
        self.course = course(speed=config.speed, panel_friction=config.panel_friction)
        self._overrides = overrides
        self._limits: dict[float | None, int] = {}  # speed -> the episode's step limit
        self.spec = self._probe(config.speed).spec
        self.layout = StepLayout.from_spec(self.spec)
        self.pool = EpisodePool(
            config.task,
            overrides,
            config.device,
            config.planner,
            config.workers,
            EpisodeStore(self.out / "episodes"),
        )
        self._t0 = time.perf_counter()

    def _record_config(self, command: str) -> None:
        """config.json: what this run is (its last invocation). A folder started on another
        pretrained model is refused: its episodes and versions belong to that model."""
        digest = checkpoint_digest(self.cfg.checkpoint)
        file = self.out / "config.json"
        if file.is_file():
            earlier = json.loads(file.read_text())
            if earlier["checkpoint_digest"] != digest:
                raise ValueError(
                    f"{self.out} was run on another pretrained checkpoint (digest "
                    f"{earlier['checkpoint_digest'][:12]}, given {self.cfg.checkpoint}: "
                    f"{digest[:12]}); pass the checkpoint it ran on, or another --out"
                )
        record = {
            "command": command
            or (json.loads(file.read_text())["command"] if file.is_file() else ""),
            "checkpoint_digest": digest,
            "planner": resolved_planner(self.cfg.checkpoint, self.cfg.planner),
            "config": json.loads(json.dumps(dataclasses.asdict(self.cfg), default=str)),
        }
        write_json(file, record)

    def _course(self, speed: float | None) -> tuple:
        return course(**{**dict(self.course), "speed": speed}) if speed else self.course

    def _probe(self, speed: float | None) -> Task:
        """The task at `speed` (closed; its spec and step limit stay), its limit noted."""
        task = make_task(self.cfg.task, "real", **self._overrides, **dict(self._course(speed)))
        task.close()
        self._limits[speed] = task.max_steps
        return task

    def _limit(self, speed: float | None) -> int:
        """The episode's step limit at `speed` (the Go2 tasks' limit follows the speed)."""
        if speed not in self._limits:
            self._probe(speed)
        return self._limits[speed]

    def evaluate(
        self, checkpoint, planner: bool = True, point: int = 0
    ) -> tuple[dict, list[Episode]]:
        """Success over the evaluation seeds at the headline speed, and at each other speed when
        `point` (0 = zero-shot, j = after round j) is one of `other_speeds_at`.

        Episodes are stored by the checkpoint's weights, so an evaluation already run (the shared
        zero-shot one, a round whose candidate was refused) is read back, not run again."""
        cfg = self.cfg
        at = {cfg.rounds if p == -1 else p for p in cfg.other_speeds_at}
        others = cfg.other_speeds if not at or point in at else ()
        speeds = [(cfg.speed, cfg.eval_episodes)] + [(s, cfg.other_eval_episodes) for s in others]
        jobs = [
            EpisodeJob(str(checkpoint), planner, seed, course=self._course(speed))
            for speed, n in speeds
            for seed in range(EVAL_SEED, EVAL_SEED + n)
        ]
        episodes = self.pool.run(jobs)
        dt = 1.0 / self.spec.control_rate_hz
        by_speed, k = {}, 0
        for speed, n in speeds:
            by_speed[speed] = _score(episodes[k : k + n], dt, self._limit(speed))
            k += n
        headline = by_speed.pop(cfg.speed)
        if by_speed:
            headline["other_speeds"] = {f"{s:g}": v for s, v in by_speed.items()}
        return headline, episodes[: cfg.eval_episodes]

    def run_method(self, name: str) -> dict:
        cfg, overrides = self.cfg, METHODS[name]
        self._say(name, f"zero-shot evaluation, {cfg.eval_episodes} episodes")
        if overrides is None:
            score, eps = self.evaluate(cfg.checkpoint, planner=False)
            return {"curve": [{"real_episodes": 0, **score}], "rounds": [], "eval_episodes": eps}
        root = self.out / name
        rounds = read_rounds(root)
        if len(rounds) > cfg.rounds:
            raise ValueError(
                f"{root} holds {len(rounds)} rounds, more than the {cfg.rounds} asked for: "
                "resume with at least as many rounds, or use another --out"
            )
        registry = self._registry(name, root, rounds)
        zero, _ = self.evaluate(cfg.checkpoint)  # the zero-shot figures: shared by all methods
        write_json(self.out / "zero_shot.json", zero)
        adapt_cfg = dataclasses.replace(cfg.adapt, device=cfg.device, **overrides)
        for j in range(cfg.rounds):
            if j < len(rounds) and rounds[j]["score"] is not None:
                continue
            if j == len(rounds):
                rounds.append(self._adapt_round(name, root, registry, adapt_cfg, rounds))
                self._write_rounds(root, rounds)
            score, eps = self.evaluate(registry.deployed_path(), point=j + 1)
            rounds[j]["score"] = score
            self._write_rounds(root, rounds)
            self._say(
                name,
                f"round {j + 1}: {rounds[j]['report']['reason']}; "
                f"success {score['success_rate']:.2f}",
            )
        zero, _ = self.evaluate(cfg.checkpoint)
        _, eps = self.evaluate(registry.deployed_path(), point=len(rounds))  # read back
        return {
            "curve": [{"real_episodes": 0, **zero}]
            + [{"real_episodes": r["collected"], **r["score"]} for r in rounds],
            "rounds": [r["report"] for r in rounds],
            "eval_episodes": eps,
            "registry": str(registry.root.relative_to(self.out)),
            "d_real": str((root / "d_real").relative_to(self.out)),
        }

    def _registry(self, name: str, root: pathlib.Path, rounds: list[dict]) -> ModelRegistry:
        """The method's registry as its recorded rounds left it: the pretrained model as v0000,
        then every recorded deployment, rebuilt from its delta when the registry lacks it (a
        fresh clone); a version deployed by a round killed before its record is rolled back."""
        registry = ModelRegistry(root / "registry")
        if not registry.history():
            registry.init_from(self.cfg.checkpoint)
        recorded = [r["report"] for r in rounds if r["report"]["deployed"]]
        history = [h["version"] for h in registry.history()]
        if history[1 : 1 + len(recorded)] != [r["version"] for r in recorded]:
            while len(registry.history()) > 1:  # rebuild from the records
                registry.rollback()
            for report in recorded:
                self._say(name, f"rebuilding {report['version']} from its recorded delta")
                model = load_delta(
                    self.cfg.checkpoint, root / "versions" / f"{report['version']}.safetensors"
                )
                registry.deploy(model, {"rebuilt_from": "delta"}, version=report["version"])
        while len(registry.history()) > 1 + len(recorded):  # deployed by an unrecorded round
            self._say(name, f"rolling back {registry.deployed_version}: its round is re-run")
            registry.rollback()
        return registry

    def _adapt_round(
        self, name: str, root: pathlib.Path, registry: ModelRegistry, adapt_cfg, rounds: list
    ) -> dict:
        """Collect a round's on-policy episodes, rebuild D_real from every round's, adapt f."""
        cfg, j = self.cfg, len(rounds)
        collect_with = registry.deployed_version
        first = COLLECT_SEED + j * cfg.episodes_per_round
        seeds = list(range(first, first + cfg.episodes_per_round))
        self._say(name, f"round {j + 1}: collecting {len(seeds)} planner episodes")
        collections = [(r["collect_version"], r["seeds"]) for r in rounds]
        collections.append((collect_with, seeds))
        jobs = [
            EpisodeJob(str(registry.version_path(v)), True, seed, record=True, course=self.course)
            for v, round_seeds in collections
            for seed in round_seeds
        ]
        episodes = self.pool.run(jobs)
        shard = root / "d_real" / shard_name(0)
        shard.unlink(missing_ok=True)
        transitions = 0
        with ShardWriter(shard, self.layout, {"task": cfg.task, "config": "{}"}) as w:
            for index, (job, ep) in enumerate(zip(jobs, episodes)):
                if len(ep.actions) >= 1 and len(ep.rows) >= 2:
                    w.append(
                        episode_record(
                            ep.rows,
                            ep.actions[: len(ep.rows) - 1],
                            index,
                            self.layout,
                            job.seed,
                            ep.success,
                            f"{cfg.task} seed {job.seed}",
                        )
                    )
                    transitions += len(ep.rows) - 1
        collected = len(jobs)
        self._say(name, f"round {j + 1}: {collected} real episodes, adapting f")
        try:
            report = adapt_on_dataset(
                registry,
                root / "d_real",
                adapt_cfg,
                episodes=collected,
                transitions=transitions,
                heldout_seeds=cfg.gate_seeds,
            ).to_dict()
            if report["deployed"]:  # recorded before the round is: a fresh clone rebuilds it
                save_delta(
                    registry.deployed_path(),
                    cfg.checkpoint,
                    root / "versions" / f"{report['version']}.safetensors",
                )
        except ValueError as exc:  # e.g. too few windows yet: the deployed model stays
            report = {
                "deployed": False,
                "reason": f"round skipped: {exc}",
                "version": registry.deployed_version,
                "heldout_deployed": None,
                "heldout_candidate": None,
                "sim_deployed": None,
                "sim_candidate": None,
            }
        return {
            "report": report,
            "collected": collected,
            "transitions": transitions,
            "collect_version": collect_with,
            "seeds": seeds,
            "gate_seeds": cfg.gate_seeds,
            "score": None,
        }

    @staticmethod
    def _write_rounds(root: pathlib.Path, rounds: list[dict]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        write_json(root / "rounds.json", rounds)

    def run(self) -> dict:
        """Run the configured methods; results.json keeps the methods that earlier runs into the
        same `out` measured and this one does not (e.g. an ablation run with fewer rounds), each
        method with the config it ran under."""
        start = time.perf_counter()
        config = json.loads(json.dumps(dataclasses.asdict(self.cfg), default=str))
        saved = self.out / "results.json"
        earlier = json.loads(saved.read_text())["methods"] if saved.is_file() else {}
        results = {
            "config": config,
            "methods": {k: v for k, v in earlier.items() if k not in self.cfg.methods},
        }
        episodes = {}
        try:
            for name in self.cfg.methods:
                r = self.run_method(name)
                episodes[name] = r.pop("eval_episodes")
                results["methods"][name] = {**r, "config": config}
                results["seconds"] = time.perf_counter() - start
                self._write(results)  # a long run that is cut short keeps every finished method
                simdist = results["methods"].get("simdist")
                if simdist and any(rd["heldout_candidate"] is not None for rd in simdist["rounds"]):
                    results["probe_trajectory"] = self.probe_trajectory(simdist)
                results["plots"] = self.plot(results, episodes)
                self._write(results)
        finally:
            self.pool.close()
        return results

    def _say(self, method: str, text: str) -> None:
        print(f"[{time.perf_counter() - self._t0:7.1f} s] [{method}] {text}", flush=True)

    def _write(self, results: dict) -> None:
        (self.out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    # -- plots
    def plot(self, results: dict, episodes: dict) -> list[str]:
        import matplotlib  # noqa: PLC0415 - plots only; matplotlib is heavy to import

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - plots only; matplotlib is heavy to import

        files = []
        rounds_x = [
            c["real_episodes"] for c in results["methods"].get("simdist", {}).get("curve", [])
        ]
        headline = "" if self.cfg.speed is None else f" at {self.cfg.speed:g} m/s"
        for file, key, ylabel, title in (
            ("success_vs_episodes.png", "success_rate", "success rate", "success vs real data"),
            (
                "successes_per_minute.png",
                "successes_per_minute",
                "successes per minute of robot time",
                "throughput (paper Fig. 6)",
            ),
            ("return_vs_episodes.png", "mean_return", "mean return", "return vs real data"),
            ("distance_vs_episodes.png", "mean_distance", "mean distance (m)", "distance"),
            ("falls_vs_episodes.png", "falls", "episodes that fell", "falls vs real data"),
            (
                "time_to_fall_vs_episodes.png",
                "mean_time_to_fall_s",
                "mean time to the fall (s)",
                "time to the first fall",
            ),
        ):
            fig, ax = plt.subplots(figsize=(6, 4))
            for m, (name, r) in enumerate(results["methods"].items()):
                xs = [c["real_episodes"] for c in r["curve"]]
                ys = [_figure(c, key) for c in r["curve"]]
                if name == "base_policy" and rounds_x:  # pi never changes: flat over the rounds
                    xs, ys = rounds_x, ys * len(rounds_x)
                ax.plot(xs, ys, marker="o", color=f"C{m}", label=f"{name}{headline}")
                for k, speed in enumerate(r["curve"][0].get("other_speeds", {})):
                    points = [c for c in r["curve"] if speed in c.get("other_speeds", {})]
                    other_x = [c["real_episodes"] for c in points]
                    other = [_figure(c["other_speeds"][speed], key) for c in points]
                    if name == "base_policy" and rounds_x:
                        other_x, other = rounds_x, other * len(rounds_x)
                    style = ("--", ":", "-.")[k % 3]
                    ax.plot(
                        other_x,
                        other,
                        style,
                        marker=".",
                        color=f"C{m}",
                        label=f"{name} {speed} m/s",
                    )
            ax.set(xlabel="real episodes", ylabel=ylabel, title=f"{self.cfg.task}: {title}")
            if key == "success_rate":
                ax.set_ylim(-0.05, 1.05)
            ax.legend(fontsize="small")
            files.append(self._save(fig, file))

        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in results["methods"].items():
            for j, rd in enumerate(r["rounds"]):
                if rd["heldout_candidate"] is None:
                    continue
                ax.plot(
                    [2 * j, 2 * j + 1],
                    [rd["heldout_deployed"], rd["heldout_candidate"]],
                    marker="o",
                    color=f"C{list(METHODS).index(name)}",
                    label=name if j == 0 else None,
                )
        ax.set(
            xlabel="round (before -> after)",
            ylabel="held-out latent loss",
            yscale="log",
            title="held-out latent dynamics loss",
        )
        ax.legend()
        files.append(self._save(fig, "heldout_latent_loss.png"))

        eps = [e for e in episodes.get("simdist", []) if e.values]
        ok = next((e for e in eps if e.success), None)
        bad = next((e for e in eps if not e.success), None)
        if ok or bad:
            fig, ax = plt.subplots(figsize=(6, 4))
            for e, label in ((ok, "successful"), (bad, "failed")):
                if e is not None:
                    ax.plot(e.values, label=f"{label} episode")
            ax.set(
                xlabel="control step",
                ylabel="predicted value v^",
                title="predicted value over time",
            )
            ax.legend()
            files.append(self._save(fig, "predicted_value.png"))
        if results.get("probe_trajectory"):
            files.append(self._probe_plot(plt, results["probe_trajectory"]))
        return files

    def probe_trajectory(self, method: dict) -> dict:
        """Predicted vs real joint trajectory of a held-out window, decoded from the predicted
        latents by a ridge probe fitted on E's latents: the pretrained and the deployed f."""
        adapted = ModelRegistry(self.out / method["registry"]).load_deployed(self.cfg.device)
        pre = self.pretrained
        h, t = pre.config.history, pre.config.horizon
        _, held = real_windows(
            self.out / method["d_real"],
            h,
            t,
            self.cfg.adapt.holdout,
            self.cfg.adapt.seed,
            self.cfg.gate_seeds,
        )
        batch = window_batch([held[i] for i in range(min(len(held), 64))])
        on_device = {k: v.to(self.cfg.device) for k, v in batch.items()}
        offset = 0
        for term in self.spec.proprio_terms:
            if term.name == "joint_pos":
                break
            offset += term.dim
        joint = offset + min(2, self.spec.action_dim - 1)
        with torch.no_grad():
            obs = {
                k: on_device[k]
                for k in ("proprio", "images", "height_map", "command")
                if k in batch
            }
            z_all = pre.encode({k: v.flatten(0, 1) for k, v in obs.items()}).cpu().numpy()
            y_all = batch["proprio"].flatten(0, 1)[:, joint].numpy()
            w = np.linalg.solve(
                np.c_[z_all, np.ones(len(z_all))].T @ np.c_[z_all, np.ones(len(z_all))]
                + 1e-3 * np.eye(z_all.shape[1] + 1),
                np.c_[z_all, np.ones(len(z_all))].T @ y_all,
            )
            preds = {
                name: m.predict_window(on_device)["latents"].cpu()
                for name, m in (("pretrained", pre), ("adapted", adapted))
            }
        decoded = {}
        for name, lat in preds.items():
            z = lat[0].cpu().numpy()
            decoded[name] = (np.c_[z, np.ones(len(z))] @ w).tolist()
        return {
            "label": f"joint_pos[{joint - offset}] (proprio[{joint}])",
            "real": batch["proprio"][0, h + 1 :, joint].numpy().tolist(),
            "predicted": decoded,
        }

    def _probe_plot(self, plt, trajectory: dict) -> str:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(trajectory["real"], "k-", label="real")
        for name, values in trajectory["predicted"].items():
            ax.plot(values, "--", marker="o", label=f"predicted ({name})")
        ax.set(
            xlabel="step into the future",
            ylabel=trajectory["label"],
            title="predicted vs real joint trajectory (held-out episode)",
        )
        ax.legend()
        return self._save(fig, "predicted_vs_real_trajectory.png")

    def _save(self, fig, name: str) -> str:
        """Save a plot into `out`; returns its name there."""
        fig.tight_layout()
        fig.savefig(self.out / name, dpi=100)
        import matplotlib.pyplot as plt  # noqa: PLC0415 - plots only; matplotlib is heavy to import

        plt.close(fig)
        return name


def parse_args(argv=None) -> ExperimentConfig:
    p = argparse.ArgumentParser(
        prog="simdist-adapt-experiment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--task",
        default="slippery_slope",
        help=f"a task with a real variant: {task_list()} (default slippery_slope)",
    )
    p.add_argument(
        "--checkpoint", required=True, help="pretrained world-model checkpoint (simdist-pretrain)"
    )
    p.add_argument("--out", default="artifacts/adapt_experiment")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--episodes-per-round", type=int, default=10)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument(
        "--gate-episodes",
        type=int,
        default=ExperimentConfig.gate_episodes,
        help="the gate's held-out episodes: the first this many collected in round 1, held out "
        "in every round and never trained on",
    )
    add_task_option_arguments(p)
    p.add_argument(
        "--other-speeds",
        default="",
        help="Go2: comma list of further commanded speeds (m/s) evaluated after every round",
    )
    p.add_argument(
        "--other-eval-episodes",
        type=int,
        default=5,
        help="evaluation episodes at each of --other-speeds",
    )
    p.add_argument(
        "--other-speeds-at",
        default="",
        help="comma list of the evaluation points with --other-speeds: 0 = zero-shot, j = after "
        "round j, -1 = after the last round (default: every point)",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workers", type=int, default=1, help="processes running episodes side by side")
    add_planner_arguments(p)
    p.add_argument(
        "--adapt-steps", type=int, default=2000, help="optimiser steps per adaptation round"
    )
    p.add_argument("--adapt-lr", type=float, default=2e-4)
    p.add_argument(
        "--adapt-warmup", type=int, default=AdaptConfig.warmup_steps, help="linear warm-up steps"
    )
    p.add_argument(
        "--sim-data", default="", help="simulation shards for the forgetting guard (and replay)"
    )
    p.add_argument(
        "--sim-replay", type=float, default=0.0, help="fraction of each batch from --sim-data"
    )
    p.add_argument(
        "--max-sim-loss-increase",
        type=float,
        default=AdaptConfig.max_sim_loss_increase,
        help="gate: refuse a candidate whose sim latent loss rose by more (relative)",
    )
    a = p.parse_args(argv)
    checked_task_options(p, a, a.task, "real")
    return ExperimentConfig(
        task=a.task,
        region=a.region,
        checkpoint=a.checkpoint,
        out=a.out,
        methods=tuple(a.methods.split(",")),
        rounds=a.rounds,
        episodes_per_round=a.episodes_per_round,
        eval_episodes=a.eval_episodes,
        gate_episodes=a.gate_episodes,
        max_steps=a.max_steps,
        speed=a.speed,
        panel_friction=a.friction,
        other_speeds=tuple(float(x) for x in a.other_speeds.split(",") if x),
        other_eval_episodes=a.other_eval_episodes,
        other_speeds_at=tuple(int(x) for x in a.other_speeds_at.split(",") if x),
        device=a.device,
        workers=a.workers,
        planner=planner_overrides(a),
        adapt=AdaptConfig(
            max_steps=a.adapt_steps,
            lr=a.adapt_lr,
            warmup_steps=a.adapt_warmup,
            sim_data=a.sim_data,
            sim_replay=a.sim_replay,
            max_sim_loss_increase=a.max_sim_loss_increase,
        ),
    )


def main(argv=None) -> int:
    cfg = parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    command = shlex.join(["simdist-adapt-experiment", *(sys.argv[1:] if argv is None else argv)])
    results = Experiment(cfg, command).run()
    print(format_table(results))
    print(f"results: {cfg.out}/results.json; plots in {cfg.out}: {', '.join(results['plots'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
