"""Who am I in the job: rank, world size and local rank, from the config, torch.distributed,
torchrun's variables or SLURM's; and which GPU of those this process sees is the local rank's. We
shard for torch.distributed; we never start a process group.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import NamedTuple

from .errors import ConfigError
from .parallel import available_cores


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
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def _first_env_int(*names: str) -> int | None:
    """The first of these variables that is set (0 included, which `or` would skip)."""
    for name in names:
        value = _env_int(name)
        if value is not None:
            return value
    return None


def _slurm_tasks_on_this_node() -> int | None:
    """SLURM_TASKS_PER_NODE's count for this node (SLURM_NODEID): it lists the nodes' counts, each
    repeated as 'count(xN)', e.g. '8(x3),4' for three nodes of 8 tasks and one of 4."""
    value = os.environ.get("SLURM_TASKS_PER_NODE")
    if not value:
        return None
    counts = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ConfigError(f"environment variable SLURM_TASKS_PER_NODE={value!r} is not a list of task counts "
                              f"such as '8(x2),4'")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = _env_int("SLURM_NODEID") or 0
    return counts[node] if node < len(counts) else None


def detect_ranks(rank: int | str = "auto", world_size: int | str = "auto", local_rank: int | str = "auto") -> RankInfo:
    """Explicit values (distributed.rank, world_size, local_rank; "auto": not given) win; then an
    initialized process group; then torchrun; then SLURM."""
    given_rank, given_world, given_local = rank, world_size, local_rank
    rank, world, local, local_world, source = 0, 1, 0, 1, "single process"

    import torch.distributed as dist  # torch is a hard dependency; the process group is optional
    if dist.is_available() and dist.is_initialized():
        rank, world, source = dist.get_rank(), dist.get_world_size(), "torch.distributed"
        local = _first_env_int("LOCAL_RANK", "SLURM_LOCALID") or 0
        local_world = _first_env_int("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE") or _slurm_tasks_on_this_node() or 1
    elif _env_int("WORLD_SIZE") is not None:
        rank, world, source = _env_int("RANK") or 0, _env_int("WORLD_SIZE"), "torchrun"
        local = _env_int("LOCAL_RANK") or 0
        local_world = _env_int("LOCAL_WORLD_SIZE") or 1
    elif _env_int("SLURM_NTASKS") is not None:
        rank, world, source = _env_int("SLURM_PROCID") or 0, _env_int("SLURM_NTASKS"), "slurm"
        local = _env_int("SLURM_LOCALID") or 0
        local_world = _env_int("SLURM_NTASKS_PER_NODE") or _slurm_tasks_on_this_node() or 1

    if given_rank != "auto":
        rank, source = given_rank, "config"
    if given_world != "auto":
        world, source = given_world, "config"
    if given_local != "auto":
        local = given_local
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


class GpuChoice(NamedTuple):
    """Where a process puts its batches, and why (for the log; empty where nothing needs saying)."""
    index: int | None
    """The GPU among those torch sees (cuda:index), or None for the CPU."""
    reason: str = ""
    warning: bool = False
    """The user would not expect it: log it as a warning."""


def local_gpu(local_rank: int, local_world_size: int, visible: int, wanted: str, *,
              origin: str = "the config", ranks_from: str = "", visible_env: str | None = None) -> GpuChoice:
    """Which of the GPUs this process sees gets its batches.

    One function of the local rank, the local world size, the number of GPUs torch sees and
    `output.device` (auto, cpu, cuda, cuda:N), so that it fits every launcher: torchrun and SLURM
    without GPU binding show every rank all the node's GPUs (the local rank picks one); SLURM with
    --gpus-per-task=1, per-rank CUDA_VISIBLE_DEVICES and Kubernetes' device plugin show each rank
    only its own, as cuda:0. A wrong value raises ConfigError naming the fix; `origin` (where
    output.device was set), `ranks_from` and `visible_env` (CUDA_VISIBLE_DEVICES) only word it.
    """
    if wanted == "cpu":
        return GpuChoice(None)
    index = int(wanted.removeprefix("cuda:")) if wanted.startswith("cuda:") else None
    if visible == 0 and wanted == "auto":
        return GpuChoice(None)  # the backend's choice says so
    if visible == 0 or (index is not None and index >= visible):
        limit = f" (CUDA_VISIBLE_DEVICES={visible_env!r} limits them)" if visible_env is not None else ""
        fix = ("set output.device: auto or cpu" if visible == 0 else
               f"set output.device to {'cuda:0' if visible == 1 else f'cuda:0 to cuda:{visible - 1}'}, cuda (the "
               f"local rank's GPU) or auto")
        raise ConfigError(f"{origin}: output.device: {wanted}, but torch sees {visible} CUDA "
                          f"GPU{'' if visible == 1 else 's'}{limit}; {fix}")
    ranks = f"local rank {local_rank} of {local_world_size}" + (f" (from {ranks_from})" if ranks_from else "")
    if index is not None:
        if local_world_size > 1:
            return GpuChoice(index, f"output.device: {wanted} ({origin}): all {local_world_size} ranks of this node "
                                    f"put their batches on that one GPU; set output.device: cuda for one GPU per local "
                                    f"rank", warning=True)
        return GpuChoice(index)
    if visible == 1:
        if local_world_size == 1 and local_rank == 0:
            return GpuChoice(0)
        return GpuChoice(0, f"{ranks} sees one GPU, cuda:0: its own where the launcher gives each rank one (SLURM "
                            f"--gpus-per-task=1, per-rank CUDA_VISIBLE_DEVICES, a Kubernetes device plugin), else "
                            f"one GPU that the {local_world_size} ranks of this node share")
    if local_world_size > visible or local_rank >= visible:
        limit = f" (CUDA_VISIBLE_DEVICES={visible_env!r})" if visible_env is not None else ""
        raise ConfigError(f"{ranks} has no GPU of its own: {max(local_world_size, local_rank + 1)} ranks on this "
                          f"node, but torch sees {visible} GPUs{limit}. Launch at most {visible} processes per node "
                          f"(torchrun --nproc_per_node={visible}, srun --ntasks-per-node={visible}), or give each "
                          f"rank its own GPUs (srun --gpus-per-task=1) and set output.device: cuda:0 where each rank "
                          f"sees several")
    return GpuChoice(local_rank, f"{ranks}: cuda:{local_rank} of the {visible} GPUs it sees" if local_world_size > 1
                     else "")
