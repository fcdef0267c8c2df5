"""DDP plumbing: process group set-up, a shared wall-clock decision, and the weights check
across ranks."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from simdist_planner.training.config import PretrainConfig


def init_distributed(device: str) -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, 0
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))


def out_of_time(cfg: PretrainConfig, t_start: float, world: int, dev: torch.device) -> bool:
    """Whether this run has used its wall-clock budget; rank 0's clock decides for every rank."""
    if cfg.time_limit_s <= 0:
        return False
    late = time.perf_counter() - t_start >= cfg.time_limit_s
    if world == 1:
        return late
    flag = torch.tensor([float(late)], device=dev)
    dist.broadcast(flag, 0)
    return bool(flag.item())


def gather_digests(digest: str, world: int, dev: torch.device) -> list[str]:
    if world == 1:
        return [digest]
    local = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8, device=dev)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    return [bytes(t.cpu().tolist()).hex() for t in gathered]
