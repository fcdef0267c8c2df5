"""One adaptation round of Algorithm 1: bags -> D_real -> Eq. 3 on f -> validation gate -> deploy.

The gate deploys a candidate only if its held-out latent loss beats the deployed model's on the
same held-out episodes; otherwise the deployed model stays and the round says why.
"""
from __future__ import annotations

import logging
import pathlib
from dataclasses import asdict, dataclass

from robot_drivers.interface import RobotSpec
from simdist_adapter.finetune import AdaptConfig, finetune_dynamics, real_windows
from simdist_adapter.registry import ModelRegistry

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    deployed: bool
    version: str  # the version deployed after the round
    reason: str
    heldout_deployed: float  # held-out latent loss of the model deployed before the round
    heldout_candidate: float
    train_loss: float
    steps: int
    seconds: float
    episodes: int
    transitions: int
    bags_skipped: dict

    def to_dict(self) -> dict:
        return asdict(self)


def gate(candidate_loss: float, deployed_loss: float) -> tuple[bool, str]:
    """Deploy only a strict, finite improvement of the held-out latent loss."""
    if candidate_loss != candidate_loss or candidate_loss == float("inf"):
        return False, f"candidate held-out loss is {candidate_loss}"
    if candidate_loss < deployed_loss:
        return True, f"held-out latent loss {deployed_loss:.5f} -> {candidate_loss:.5f}"
    return False, f"candidate held-out loss {candidate_loss:.5f} does not beat deployed {deployed_loss:.5f}"


def adapt_on_dataset(registry: ModelRegistry, d_real, config: AdaptConfig, progress=None,
                     episodes: int = 0, transitions: int = 0, bags_skipped: dict | None = None) -> RoundReport:
    """Fine-tune f of the deployed model on the D_real shards in `d_real`, gate, deploy."""
    model = registry.load_deployed(config.device)
    train, heldout = real_windows(d_real, model.config.history, model.config.horizon,
                                  config.holdout, config.seed)
    result = finetune_dynamics(model, train, heldout, config, progress)
    ok, reason = gate(result.heldout_after, result.heldout_before)
    if ok:
        registry.deploy(result.model, {
            "heldout_latent_loss": result.heldout_after,
            "heldout_latent_loss_before": result.heldout_before,
            "train_loss": result.train_loss, "steps": result.steps,
            "episodes": episodes, "transitions": transitions, "adapt_config": result.config,
        })
    log.info("adaptation round: %s", reason)
    return RoundReport(ok, registry.deployed_version or "", reason, result.heldout_before,
                       result.heldout_after, result.train_loss, result.steps, result.seconds,
                       episodes, transitions, bags_skipped or {})


def adapt_round(registry: ModelRegistry, bags, spec: RobotSpec, workdir, config: AdaptConfig,
                demos=None, progress=None) -> RoundReport:
    """Build D_real from all `bags` (+ demos), then `adapt_on_dataset`."""
    from simdist_adapter.real_data import build_real_dataset  # bags need rclpy; the rest does not

    d_real = pathlib.Path(workdir) / "d_real"
    built = build_real_dataset(bags, d_real, spec, demos=demos)
    return adapt_on_dataset(registry, d_real, config, progress, built.episodes, built.transitions,
                            built.bags_skipped)
