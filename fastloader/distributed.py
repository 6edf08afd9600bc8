"""Who am I in the job: rank, world size and local rank, from the config, torch.distributed,
torchrun's variables or SLURM's. We shard for torch.distributed; we never start a process group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import ConfigError
from .parallel import available_cores
from .schema import DistributedConfig


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    source: str
    """Where the numbers came from, for logs: config, torch.distributed, torchrun, slurm or single process."""


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value.split("(")[0])  # SLURM_TASKS_PER_NODE may read '4(x2)'
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def detect_ranks(config: DistributedConfig | None = None) -> RankInfo:
    """Explicit config values win; then an initialized process group; then torchrun; then SLURM."""
    config = config or DistributedConfig()
    rank, world, local, local_world, source = 0, 1, 0, 1, "single process"

    import torch.distributed as dist  # torch is a hard dependency; the process group is optional
    if dist.is_available() and dist.is_initialized():
        rank, world, source = dist.get_rank(), dist.get_world_size(), "torch.distributed"
        local = _env_int("LOCAL_RANK") or _env_int("SLURM_LOCALID") or 0
        local_world = _env_int("LOCAL_WORLD_SIZE") or _env_int("SLURM_NTASKS_PER_NODE") or 1
    elif _env_int("WORLD_SIZE") is not None:
        rank, world, source = _env_int("RANK") or 0, _env_int("WORLD_SIZE"), "torchrun"
        local = _env_int("LOCAL_RANK") or 0
        local_world = _env_int("LOCAL_WORLD_SIZE") or 1
    elif _env_int("SLURM_NTASKS") is not None:
        rank, world, source = _env_int("SLURM_PROCID") or 0, _env_int("SLURM_NTASKS"), "slurm"
        local = _env_int("SLURM_LOCALID") or 0
        local_world = _env_int("SLURM_NTASKS_PER_NODE") or _env_int("SLURM_TASKS_PER_NODE") or 1

    if config.rank != "auto":
        rank, source = config.rank, "config"
    if config.world_size != "auto":
        world, source = config.world_size, "config"
    if config.local_rank != "auto":
        local = config.local_rank
    if not 0 <= rank < world:
        raise ConfigError(f"rank {rank} is not in [0, world_size={world}) (from {source}); "
                          f"fix distributed.rank / distributed.world_size or the launcher's variables")
    return RankInfo(rank=rank, world_size=world, local_rank=local, local_world_size=max(1, local_world),
                    source=source)


def cpu_workers_per_rank(ranks: RankInfo, cap: int) -> int:
    """The CPU cores this process may use, shared among the ranks on this node, capped.

    Both backends size their parallelism with it: DataLoader workers for torch, CPU threads for DALI.
    """
    return max(1, min(cap, available_cores() // ranks.local_world_size))
