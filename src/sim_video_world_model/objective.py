"""The SimForcing training objectives (teacher: sim flow matching; student: the paper's Eq. with
joint flow matching, latent-motion distillation and multi-block dropout conditioning).

    L = lambda_video * 1/2 (lambda_r L_FM^real + lambda_s L_FM^sim)
      + lambda_delta * 1/2 (lambda_r L_motion^(sim->real) + lambda_s L_motion^(sim->sim))

Both domains share ONE noise draw and ONE flow time; the first latent frame is the clean
observation, is never noised and is left out of every loss.
"""

from __future__ import annotations

import torch

from sim_video_world_model.backbones.base import VideoDenoiser
from sim_video_world_model.config import ObjectiveConfig
from sim_video_world_model.scheduler import FlowMatchScheduler


def with_clean_first_frame(noisy: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    return torch.cat([clean[:, :, :1], noisy[:, :, 1:]], dim=2)


def latent_motion(x0_hat: torch.Tensor, first_latent: torch.Tensor) -> torch.Tensor:
    """Adjacent differences m_k = x^_k - x^_{k-1}, k = 1..L-1, x^_0 := the clean observation latent.

    The model's estimate of frame 0 is discarded, so the first frame itself contributes no target.
    """
    if x0_hat.shape[2] < 2:
        raise ValueError(f"latent motion needs at least 2 latent frames, got {x0_hat.shape[2]}")
    x = with_clean_first_frame(x0_hat, first_latent)
    return x[:, :, 1:] - x[:, :, :-1]


def _per_sample_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (pred.float() - target.float()).pow(2).mean(dim=tuple(range(1, pred.ndim)))


def corrupt_sim_latent(
    z: torch.Tensor, cfg: ObjectiveConfig, generator: torch.Generator | None = None
) -> torch.Tensor:
    """With prob corrupt_prob per sample: z' = alpha z + (1 - alpha) sigma_c eta.

    Applies to the conditioning input only.
    """
    b = z.shape[0]
    dev = generator.device if generator is not None else "cpu"

    def uniform(lo, hi):
        return (lo + (hi - lo) * torch.rand(b, generator=generator, device=dev)).to(
            z.device, z.dtype
        )

    hit = (torch.rand(b, generator=generator, device=dev) < cfg.corrupt_prob).to(z.device)
    alpha, sigma = uniform(*cfg.corrupt_alpha), uniform(*cfg.corrupt_sigma)
    eta = torch.randn(z.shape, generator=generator, device=dev).to(z.device, z.dtype)
    shape = (b,) + (1,) * (z.ndim - 1)
    mixed = alpha.view(shape) * z + (1 - alpha.view(shape)) * sigma.view(shape) * eta
    return torch.where(hit.view(shape), mixed, z)


class TeacherObjective:
    """Stage 1: action-conditioned flow matching on sim video latents."""

    def __init__(self, cfg: ObjectiveConfig):
        self.cfg = cfg
        self.scheduler = FlowMatchScheduler(cfg.shift, cfg.num_train_timesteps)

    def __call__(
        self,
        model: VideoDenoiser,
        z: torch.Tensor,
        actions: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        sch = self.scheduler
        dev = generator.device if generator is not None else "cpu"
        noise = torch.randn(z.shape, generator=generator, device=dev).to(z.device, z.dtype)
        sigma = sch.sample_sigma(z.shape[0], z.device, generator)
        x = with_clean_first_frame(sch.add_noise(z, noise, sigma), z)
        v = model(x, sch.timesteps_from_sigma(sigma), actions)
        weight = sch.loss_weight(sigma)
        loss = (
            weight * _per_sample_mse(v[:, :, 1:], sch.velocity_target(z, noise)[:, :, 1:])
        ).mean()
        return loss, {"loss": float(loss.detach()), "fm_sim": float(loss.detach())}


class StudentObjective:
    """Stage 2: the student (initialised from the teacher) on paired sim/real latents."""

    def __init__(self, cfg: ObjectiveConfig):
        self.cfg = cfg
        self.scheduler = FlowMatchScheduler(cfg.shift, cfg.num_train_timesteps)

    def __call__(
        self,
        student: VideoDenoiser,
        teacher: VideoDenoiser | None,
        z_real: torch.Tensor,
        z_sim: torch.Tensor,
        actions: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, sch, variant = self.cfg, self.scheduler, self.cfg.variant
        if variant.motion and teacher is None:
            raise ValueError(
                f"variant {variant.value!r} distils motion and needs the frozen teacher"
            )
        b, dev = z_real.shape[0], (generator.device if generator is not None else "cpu")
        noise = torch.randn(z_real.shape, generator=generator, device=dev).to(
            z_real.device, z_real.dtype
        )
        sigma = sch.sample_sigma(
            b, z_real.device, generator
        )  # SAME noise and flow time for both domains
        t = sch.timesteps_from_sigma(sigma)
        x_real = with_clean_first_frame(sch.add_noise(z_real, noise, sigma), z_real)
        x_sim = with_clean_first_frame(sch.add_noise(z_sim, noise, sigma), z_sim)
        weight = sch.loss_weight(sigma)

        # One student pass over [real; sim]: the sim half runs with gate 0 (no sim conditioning).
        use_sim = variant.joint_fm or variant.motion
        x_in = torch.cat([x_real, x_sim]) if use_sim else x_real
        act_in = torch.cat([actions, actions]) if use_sim else actions
        cond, gate = None, None
        metrics: dict[str, float] = {}
        if variant.sim_conditioning:
            g = (torch.rand(b, generator=generator, device=dev) < cfg.sim_cond_prob).to(
                z_real.device, z_real.dtype
            )
            c = corrupt_sim_latent(z_sim.detach(), cfg, generator)
            cond = torch.cat([c, c]) if use_sim else c
            gate = torch.cat([g, torch.zeros_like(g)]) if use_sim else g
            metrics["frac_cond_on"] = float(g.mean())
        v = student(x_in, torch.cat([t, t]) if use_sim else t, act_in, sim_latent=cond, gate=gate)
        v_real, v_sim = (v[:b], v[b:]) if use_sim else (v, None)

        def fm(pred, z):
            return (
                weight * _per_sample_mse(pred[:, :, 1:], sch.velocity_target(z, noise)[:, :, 1:])
            ).mean()

        zero = v_real.new_zeros(())
        l_fm_real = fm(v_real, z_real)
        l_fm_sim = fm(v_sim, z_sim) if variant.joint_fm else zero
        l_m_real = l_m_sim = zero
        if variant.motion:
            # checked at the top: motion needs the teacher, and it runs the sim half (use_sim)
            assert teacher is not None and v_sim is not None
            with torch.no_grad():
                v_teacher = teacher(x_sim, t, actions)
                m_teacher = latent_motion(
                    sch.x0_from_velocity(x_sim, v_teacher, sigma), z_sim
                ).detach()
            m_real = latent_motion(sch.x0_from_velocity(x_real, v_real, sigma), z_real)
            m_sim = latent_motion(sch.x0_from_velocity(x_sim, v_sim, sigma), z_sim)
            l_m_real = (weight * _per_sample_mse(m_real, m_teacher)).mean()
            l_m_sim = (weight * _per_sample_mse(m_sim, m_teacher)).mean()
        loss = cfg.lambda_video * 0.5 * (
            cfg.lambda_real * l_fm_real + cfg.lambda_sim * l_fm_sim
        ) + cfg.lambda_delta * 0.5 * (cfg.lambda_real * l_m_real + cfg.lambda_sim * l_m_sim)
        metrics.update(
            loss=float(loss.detach()),
            fm_real=float(l_fm_real.detach()),
            fm_sim=float(l_fm_sim.detach()),
            motion_real=float(l_m_real.detach()),
            motion_sim=float(l_m_sim.detach()),
        )
        return loss, metrics
