"""Table I ablations at our scale: one command, one table, the paper's figures beside ours.

    simdist-ablation --small [--workdir DIR] [--device cpu]

Rows (SimDist Table I): full data, 50% data, 10% data, expert-only data of equal volume, MLP
reward/value heads, + reconstruction loss. Columns: Peg and Table Leg success rate (UR5e,
planner, sim) and the quadruped's mean episode reward (Go2 flat, planner). Our quadruped reward
is the MuJoCo task's privileged reward, so its scale differs from the paper's IsaacLab figure.

Pipeline per task: generate the mixed dataset and a clean expert-only dataset once
(`simdist_planner.evaluation.datagen`), pretrain one model per row on its selection of that data
(`simdist_planner.training`; the 50% / 10% selections nest, expert-only is cut to the mixed
volume by `ShardedDataset(max_steps=...)`), then evaluate the SimDist planner on seeded episodes.
Every stage writes under --workdir and is skipped when its output exists, so an interrupted run
resumes where it stopped; results.json holds every figure measured so far.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from dataclasses import asdict, dataclass, field

from robot_drivers import registry
from robot_drivers.registry import make_task
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.evaluation import datagen
from simdist_planner.evaluation.agents import build_agents
from simdist_planner.evaluation.evaluate import evaluate, task_overrides
from simdist_planner.model.checkpoint import load_checkpoint
from simdist_planner.training.config import PRETRAIN_PRESETS, PretrainConfig
from simdist_planner.training.loop import pretrain

COLUMNS = ("peg", "table_leg", "go2_flat")  # Table I: Peg, Table Leg, quadruped
COLUMN_TITLES = {"peg": "Peg", "table_leg": "Table Leg", "go2_flat": "Quadruped"}


@dataclass(frozen=True)
class AblationRow:
    """One Table I row: how its training data is selected and how its model differs."""

    name: str
    paper: tuple[float, float, float]  # Peg success, Table Leg success, quadruped reward
    fraction: float = 1.0
    expert_only: bool = False
    head_kind: str = "transformer"
    reconstruction: float = 0.0  # weight of the observation-reconstruction loss


ROWS = (
    AblationRow("full data", (0.90, 0.85, 22.78)),
    AblationRow("50% data", (0.72, 0.61, 22.73), fraction=0.5),
    AblationRow("10% data", (0.06, 0.02, 19.38), fraction=0.1),
    AblationRow("expert-only data", (0.10, 0.05, 16.68), expert_only=True),
    AblationRow("MLP reward/value", (0.82, 0.60, 19.47), head_kind="mlp"),
    AblationRow("+ reconstruction", (0.32, 0.21, 23.34), reconstruction=1.0),
)


@dataclass(frozen=True)
class AblationScale:
    """How big every stage is. `small` finishes in about 15 minutes on two CPU cores."""

    name: str
    tasks: tuple[str, ...]
    episodes: dict[str, int]  # mixed-dataset episodes per task
    max_steps: dict[str, int]  # episode length cap for generation and evaluation
    train_steps: int
    batch_size: int
    eval_episodes: int
    planner: dict = field(default_factory=dict)  # PlannerConfig overrides for evaluation
    model: dict = field(default_factory=dict)  # WorldModelConfig overrides (per robot keys below)
    image_size: tuple[int, int] = (64, 64)  # UR5e cameras, rendered and encoded at this size


SMALL = AblationScale(
    name="small",
    tasks=("peg", "go2_flat"),
    episodes={"peg": 24, "go2_flat": 6},
    max_steps={"peg": 60, "go2_flat": 150},
    train_steps=150,
    batch_size=32,
    eval_episodes=4,
    planner={"num_samples": 64, "num_elites": 16, "iterations": 3},
    model={"latent_dim": 32},
    image_size=(48, 48),
)
FULL = AblationScale(
    name="full",
    tasks=COLUMNS,
    episodes={"peg": 2000, "table_leg": 2000, "go2_flat": 400},
    max_steps={"peg": 150, "table_leg": 200, "go2_flat": 1000},
    train_steps=20000,
    batch_size=128,
    eval_episodes=50,
)


# ------------------------------------------------------------------------------- data
def generate_data(
    task: str, scale: AblationScale, workdir: pathlib.Path, workers: int = 1
) -> tuple[pathlib.Path, pathlib.Path]:
    """The mixed dataset and an expert-only dataset holding at least as many rows."""
    images = "image_size" in registry.task_options(task)
    overrides = registry.episode_overrides(task, image_size=scale.image_size if images else None)
    probe = make_task(task, **overrides)
    robot = datagen.robot_data_config(probe.spec)
    probe.close()
    mixed, expert = workdir / "data" / task / "mixed", workdir / "data" / task / "expert"

    def run(out, episodes, expert_only, resume):
        cfg = datagen.GenerateConfig(
            task=task,
            robot=robot,
            episodes=episodes,
            seed=0,
            expert_only=expert_only,
            max_steps=scale.max_steps[task],
            task_overrides=overrides,
        )
        datagen.generate(cfg, out, workers=min(workers, episodes), resume=resume, progress=True)

    if not _complete(mixed):
        run(mixed, scale.episodes[task], False, mixed.exists())
        _mark_complete(mixed)
    target = ShardedDataset(mixed).num_steps
    if not _complete(expert):
        episodes = scale.episodes[task]
        run(expert, episodes, True, expert.exists())
        while ShardedDataset(expert, expert_only=True).num_steps < target:
            episodes = int(math.ceil(episodes * 1.5))
            run(expert, episodes, True, True)
        _mark_complete(expert)
    return mixed, expert


def _complete(path: pathlib.Path) -> bool:
    return (path / "COMPLETE").is_file()


def _mark_complete(path: pathlib.Path) -> None:
    (path / "COMPLETE").write_text("")


def pretrain_config(
    row: AblationRow, task: str, mixed: pathlib.Path, expert: pathlib.Path, scale: AblationScale
):
    """The row's pretraining run: the robot's small preset, this row's data and model changes."""

    overrides = dict(scale.model)
    if row.head_kind != "transformer":
        overrides["head_kind"] = row.head_kind
    if row.reconstruction > 0:
        overrides["loss"] = {"reconstruction": row.reconstruction}
    if row.expert_only:  # clean expert episodes, cut to the mixed dataset's volume
        data = dict(
            data=(str(expert),), expert_only=True, max_data_steps=ShardedDataset(mixed).num_steps
        )
    else:
        data = dict(data=(str(mixed),), fraction=row.fraction)
    preset = PRETRAIN_PRESETS[registry.entry(task).pretrain_preset]
    # one checkpoint, the last step's: the rows compare recipes, not checkpoint selections
    return PretrainConfig.from_flat(
        {
            **preset,
            "steps": scale.train_steps,
            "batch_size": scale.batch_size,
            "warmup_steps": max(1, scale.train_steps // 20),
            "checkpoint_every": scale.train_steps,
            "checkpoint_selection": None,
            "model_overrides": overrides,
            **data,
        }
    )


def selected_dataset(cfg) -> ShardedDataset:
    """The episodes a PretrainConfig trains on (what pretrain's window source selects)."""
    return ShardedDataset(
        list(cfg.data.paths),
        fraction=cfg.data.fraction,
        expert_only=cfg.data.expert_only,
        max_steps=cfg.data.max_data_steps or None,
        selection_seed=cfg.data.selection_seed,
    )


# ------------------------------------------------------------------------------- evaluation
def evaluate_checkpoint(
    task: str, checkpoint: pathlib.Path, scale: AblationScale, device: str
) -> float:
    """The planner's Table I figure on `task`: its registry headline (UR5e: success rate, Go2:
    mean episode reward)."""
    model = load_checkpoint(checkpoint, device=device)
    overrides = task_overrides(task, max_steps=scale.max_steps[task], model=model)
    env = make_task(task, **overrides)
    try:
        agents = build_agents(("planner",), env, model, device, **scale.planner)
        (summary,) = evaluate(env, agents, scale.eval_episodes, seed=10_000, progress=True)
    finally:
        env.close()
    return float(getattr(summary, registry.entry(task).headline))


def format_ablation_table(
    results: dict[str, dict[str, float]], tasks: tuple[str, ...], title: str
) -> str:
    """Rows of Table I; each cell 'ours (paper)'; '-' where a task was not run."""
    width = 20
    header = f"{'row':20}" + "".join(
        f"{COLUMN_TITLES[c] + ' ours (paper)':>{width + 4}}" for c in COLUMNS
    )
    lines = [title, header, "-" * len(header)]
    for row in ROWS:
        cells = []
        for col, paper in zip(COLUMNS, row.paper):
            ours = results.get(row.name, {}).get(col)
            text = "-" if col not in tasks or ours is None else f"{ours:.2f}"
            cells.append(f"{text + f' ({paper:.2f})':>{width + 4}}")
        lines.append(f"{row.name:20}" + "".join(cells))
    return "\n".join(lines)


def _load_results(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_results(path: pathlib.Path, results: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2, sort_keys=True))
    tmp.replace(path)


# ------------------------------------------------------------------------------- driver
def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def run_ablation(small: bool, workdir=None, device: str = "cpu", progress: bool = True) -> int:
    """Every stage resumable, one table at the end (`simdist-ablation`)."""
    scale = SMALL if small else FULL
    workdir = pathlib.Path(workdir or f"runs/ablation-{scale.name}")
    workdir.mkdir(parents=True, exist_ok=True)
    results_path = workdir / "results.json"
    results = _load_results(results_path)
    start = time.perf_counter()
    for task in scale.tasks:
        mixed, expert = generate_data(task, scale, workdir)
        for row in ROWS:
            if task in results.get(row.name, {}):
                continue
            run_dir = workdir / "pretrain" / task / _slug(row.name)
            checkpoint = run_dir / "model"
            if not (checkpoint / "config.json").is_file():
                pretrain(
                    pretrain_config(row, task, mixed, expert, scale), run_dir, device, progress
                )
            results.setdefault(row.name, {})[task] = evaluate_checkpoint(
                task, checkpoint, scale, device
            )
            _save_results(results_path, results)
    minutes = (time.perf_counter() - start) / 60
    title = (
        f"Table I ablation ({scale.name}: {scale.eval_episodes} planner episodes per cell, "
        f"{scale.train_steps} training steps per model, this run {minutes:.1f} min; "
        f"UR5e: success rate, quadruped: mean episode reward; paper in parentheses)"
    )
    print(format_ablation_table(results, scale.tasks, title))
    print(f"results: {results_path}  settings: {json.dumps(asdict(scale))}")
    return 0
