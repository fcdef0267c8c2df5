"""Guided two-stage inference (the paper's Sec. "Inference"), diffusers-style: model + scheduler.

1. sim stage: the student, conditioning OFF, rolls out sim latents from the masked first frame
   (the robot segmented out of the real image) and the actions (N_s Euler steps);
2. real stage: from the real first frame, v = v(g=0) + w (v(g=1) - v(g=0)) with the sim latents
   fixed as the condition (N_r steps). w = 1 runs one (conditioned) pass per step; w = 0 runs one
   unconditioned pass per step and skips the sim stage entirely; w > 1 extrapolates past the
   conditioned velocity, as classifier-free guidance does (two passes per step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sim_video_world_model.backbones.base import VideoAutoencoder, VideoDenoiser
from sim_video_world_model.objective import with_clean_first_frame
from sim_video_world_model.scheduler import FlowMatchScheduler


@dataclass
class PipelineOutput:
    video: torch.Tensor  # (B, 3, T, H, W) in [-1, 1]
    latents: torch.Tensor
    sim_latents: torch.Tensor | None


def mask_frame(frame: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Keep the robot pixels (mask true), paint the rest black (-1), as the sim stream looks."""
    if mask.shape != (frame.shape[0], *frame.shape[-2:]):
        raise ValueError(
            f"mask must be (B, H, W) = {(frame.shape[0], *frame.shape[-2:])}, "
            f"got {tuple(mask.shape)}"
        )
    return torch.where(mask[:, None].bool(), frame, torch.full_like(frame, -1.0))


class SimForcingPipeline:
    def __init__(
        self, autoencoder: VideoAutoencoder, denoiser: VideoDenoiser, scheduler: FlowMatchScheduler
    ):
        self.autoencoder = autoencoder
        self.denoiser = denoiser
        self.scheduler = scheduler

    def guided_velocity(self, x, t, actions, sim_latent, w: float) -> torch.Tensor:
        if w == 0.0 or sim_latent is None:
            if w != 0.0:
                raise ValueError("guidance w > 0 needs sim latents")
            return self.denoiser(x, t, actions)
        ones = torch.ones(x.shape[0], device=x.device)
        v_cond = self.denoiser(x, t, actions, sim_latent=sim_latent, gate=ones)
        if w == 1.0:
            return v_cond
        v_uncond = self.denoiser(x, t, actions)
        return v_uncond + w * (v_cond - v_uncond)

    def sample(
        self,
        first_latent: torch.Tensor,
        actions: torch.Tensor,
        num_latent_frames: int,
        steps: int,
        sim_latent: torch.Tensor | None,
        w: float,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        b, c, _, h, w_ = first_latent.shape
        dev = generator.device if generator is not None else "cpu"
        x = torch.randn((b, c, num_latent_frames, h, w_), generator=generator, device=dev)
        x = with_clean_first_frame(x.to(first_latent), first_latent)
        sigmas = self.scheduler.inference_sigmas(steps)
        for i in range(steps):
            t = torch.full(
                (b,), float(self.scheduler.timesteps_from_sigma(sigmas[i])), device=x.device
            )
            v = self.guided_velocity(x, t, actions, sim_latent, w)
            x = with_clean_first_frame(
                self.scheduler.step(x, v, float(sigmas[i]), float(sigmas[i + 1])), first_latent
            )
        return x

    @torch.no_grad()
    def __call__(
        self,
        first_frame: torch.Tensor,
        actions: torch.Tensor,
        num_frames: int,
        robot_mask: torch.Tensor | None = None,
        sim_steps: int = 1,
        real_steps: int = 10,
        guidance: float = 0.6,
        seed: int | None = 0,
        sim_first_frame: torch.Tensor | None = None,
    ) -> PipelineOutput:
        """first_frame (B, 3, H, W) in [-1, 1]; actions (B, num_frames - 1, A) min-max normalised.

        The sim stage starts from `sim_first_frame` if given, else from first_frame masked by
        robot_mask.
        """
        if not (math.isfinite(guidance) and guidance >= 0.0):
            raise ValueError(f"guidance w must be finite and >= 0, got {guidance}")
        if first_frame.ndim != 4 or first_frame.shape[1] != 3:
            raise ValueError(f"first_frame must be (B, 3, H, W), got {tuple(first_frame.shape)}")
        if actions.ndim != 3 or actions.shape[:2] != (first_frame.shape[0], num_frames - 1):
            raise ValueError(
                f"actions must be ({first_frame.shape[0]}, {num_frames - 1}, A) "
                f"for {num_frames} frames, got {tuple(actions.shape)}"
            )
        self.denoiser.eval()
        self.autoencoder.eval()
        gen = None if seed is None else torch.Generator(device="cpu").manual_seed(seed)
        num_latent = self.autoencoder.latent_frames(num_frames)
        first_latent = self.autoencoder.encode(first_frame[:, :, None])
        sim_latent = None
        if guidance > 0.0:
            if self.denoiser.sim_conditioning is None:
                raise ValueError(
                    "guidance w > 0 needs a student trained with sim conditioning (variant 'full')"
                )
            if sim_first_frame is None:
                if robot_mask is None:
                    raise ValueError(
                        "guidance w > 0 needs robot_mask (or sim_first_frame) for the sim stage"
                    )
                sim_first_frame = mask_frame(first_frame, robot_mask)
            sim_first = self.autoencoder.encode(sim_first_frame[:, :, None])
            sim_latent = self.sample(sim_first, actions, num_latent, sim_steps, None, 0.0, gen)
        latents = self.sample(
            first_latent, actions, num_latent, real_steps, sim_latent, guidance, gen
        )
        return PipelineOutput(
            video=self.autoencoder.decode(latents), latents=latents, sim_latents=sim_latent
        )
