"""One adaptation round of Algorithm 1: bags -> D_real -> Eq. 3 on f -> validation gate -> deploy.

The gate deploys a candidate only if its held-out latent loss beats the deployed model's on the
same held-out episodes and, with simulation data configured, its latent loss on a fixed sample
of sim windows did not rise by more than `max_sim_loss_increase` (a fine-tune on a few
on-policy episodes can forget the actions they never tried, which the planner then exploits);
otherwise the deployed model stays and the round says why.
"""

from __future__ import annotations

import logging
import math
import pathlib
from collections.abc import Collection
from dataclasses import asdict, dataclass

from robot_drivers.interface import RobotSpec
from simdist_adapter.finetune import AdaptConfig, finetune_dynamics, real_windows
from simdist_adapter.real_data import build_real_dataset
from simdist_adapter.registry import ModelRegistry

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    deployed: bool
    version: str  # the version deployed after the round
    reason: str
    heldout_deployed: float  # held-out latent loss of the model deployed before the round
    heldout_candidate: float
    sim_deployed: float | None  # latent loss on the sim sample (None without sim data)
    sim_candidate: float | None
    train_loss: float
    steps: int
    seconds: float
    episodes: int
    transitions: int
    bags_skipped: dict

    def to_dict(self) -> dict:
        """The report as plain values (JSON).

        Returns:
            Field name -> value.
        """
        return asdict(self)


def gate(
    candidate_loss: float,
    deployed_loss: float,
    sim_candidate: float | None = None,
    sim_deployed: float | None = None,
    max_sim_increase: float = 0.5,
) -> tuple[bool, str]:
    """Deploy only a strict, finite improvement of the held-out latent loss that did not raise the
    sim-sample loss by more than `max_sim_increase` (relative; checked when both sim losses are
    given).

    Args:
        candidate_loss: the fine-tuned model's held-out latent loss.
        deployed_loss: the deployed model's.
        sim_candidate: the fine-tuned model's sim-sample latent loss, or None.
        sim_deployed: the deployed model's, or None.
        max_sim_increase: the largest relative rise of the sim loss allowed.

    Returns:
        (deploy, reason): whether to deploy, and the losses that decided it.
    """
    if not math.isfinite(candidate_loss):
        return False, f"candidate held-out loss is {candidate_loss}"
    if candidate_loss >= deployed_loss:
        return (
            False,
            f"candidate held-out loss {candidate_loss:.5f} "
            f"does not beat deployed {deployed_loss:.5f}",
        )
    real = f"held-out latent loss {deployed_loss:.5f} -> {candidate_loss:.5f}"
    if sim_candidate is None or sim_deployed is None:
        return True, real
    sim = f"sim latent loss {sim_deployed:.5f} -> {sim_candidate:.5f}"
    if not math.isfinite(sim_candidate) or sim_candidate > (1.0 + max_sim_increase) * sim_deployed:
        return False, (
            f"{real}, but {sim} (allowed +{max_sim_increase:.0%}): f forgot dynamics "
            "the planner may still try"
        )
    return True, f"{real}; {sim}"


def adapt_on_dataset(
    registry: ModelRegistry,
    d_real,
    config: AdaptConfig,
    progress=None,
    episodes: int = 0,
    transitions: int = 0,
    bags_skipped: dict | None = None,
    heldout_seeds: Collection[int] | None = None,
) -> RoundReport:
    """Fine-tune f of the deployed model on D_real, gate, and deploy the candidate that passes.

    Args:
        registry: the model registry (its deployed model is fine-tuned; a passing candidate is
            deployed as a new version).
        d_real: the D_real shard directory.
        config: the fine-tuning and gate settings.
        progress: `progress(step, total_steps, loss)` after every optimiser step, or None.
        episodes: D_real's episodes (reported and kept in the version's metadata).
        transitions: D_real's transitions (the same).
        bags_skipped: bag -> why it was left out of D_real (reported).
        heldout_seeds: the gate's held-out episodes by seed (never trained on); None: a
            `config.holdout` share drawn from D_real.

    Returns:
        The round's RoundReport (deployed or not, and why).
    """
    model = registry.load_deployed(config.device)
    train, heldout = real_windows(
        d_real,
        model.config.history,
        model.config.horizon,
        config.holdout,
        config.seed,
        heldout_seeds,
    )
    result = finetune_dynamics(model, train, heldout, config, progress)
    ok, reason = gate(
        result.heldout_after,
        result.heldout_before,
        result.sim_after,
        result.sim_before,
        config.max_sim_loss_increase,
    )
    if ok:
        registry.deploy(
            result.model,
            {
                "heldout_latent_loss": result.heldout_after,
                "heldout_latent_loss_before": result.heldout_before,
                "sim_latent_loss": result.sim_after,
                "sim_latent_loss_before": result.sim_before,
                "train_loss": result.train_loss,
                "steps": result.steps,
                "episodes": episodes,
                "transitions": transitions,
                "adapt_config": result.config,
            },
        )
    log.info("adaptation round: %s", reason)
    return RoundReport(
        ok,
        registry.deployed_version or "",
        reason,
        result.heldout_before,
        result.heldout_after,
        result.sim_before,
        result.sim_after,
        result.train_loss,
        result.steps,
        result.seconds,
        episodes,
        transitions,
        bags_skipped or {},
    )


def adapt_round(
    registry: ModelRegistry,
    bags,
    spec: RobotSpec,
    workdir,
    config: AdaptConfig,
    demos=None,
    progress=None,
) -> RoundReport:
    """Build D_real from the recorded episodes (and demos), then `adapt_on_dataset`.

    Args:
        registry: the model registry.
        bags: episode bags (paths or directories; a corrupt one is skipped and reported).
        spec: the robot's RobotSpec (how the bags' messages unpack).
        workdir: where D_real is written (`workdir/d_real`).
        config: the fine-tuning and gate settings.
        demos: simulation-format shards or directories copied in as further episodes, or None.
        progress: `progress(step, total_steps, loss)` after every optimiser step, or None.

    Returns:
        The round's RoundReport.
    """

    d_real = pathlib.Path(workdir) / "d_real"
    built = build_real_dataset(bags, d_real, spec, demos=demos)
    return adapt_on_dataset(
        registry, d_real, config, progress, built.episodes, built.transitions, built.bags_skipped
    )
