"""Picks the backend (auto | dali | torch), says why in the log, and builds the loader."""
from __future__ import annotations

import importlib.util
import logging
import os

import torch

from .config import BACKEND_ENV, Config, ConfigError
from .contract import Loader
from .distributed import RankInfo, detect_ranks
from .samples import build_index

log = logging.getLogger("fastloader")


def choose_backend(config: Config) -> tuple[str, str]:
    """(backend, reason). The DALI backend is not built yet: auto picks torch, dali is an error."""
    if config.backend == "torch":
        return "torch", f"backend: torch ({_origin(config)})"
    if config.backend == "dali":
        raise ConfigError(f"{config.source}: backend: dali: this version of fastloader has no DALI backend yet "
                          f"(it is the next milestone); set backend: torch or auto, or {BACKEND_ENV}=torch")
    if not torch.cuda.is_available():
        return "torch", "backend: auto and no CUDA GPU is available"
    if not _dali_installed():
        return "torch", "backend: auto and NVIDIA DALI is not installed (pip install nvidia-dali-cuda120)"
    return "torch", "backend: auto; the DALI backend is not built yet in this version"


def _dali_installed() -> bool:
    """Whether `nvidia.dali` can be found, without importing it (a broken install counts as absent)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def _origin(config: Config) -> str:
    return f"forced by {BACKEND_ENV}" if os.environ.get(BACKEND_ENV) else f"from {config.source}"


def choose_device(config: Config, ranks: RankInfo) -> torch.device:
    wanted = config.output.device
    if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"{config.source}: output.device: cuda, but torch sees no CUDA GPU; "
                          f"set output.device: auto or cpu")
    count = torch.cuda.device_count()
    if ranks.local_rank >= count:
        raise ConfigError(f"local rank {ranks.local_rank} (from {ranks.source}) has no GPU: this node has {count}; "
                          f"launch at most {count} processes per node")
    return torch.device("cuda", ranks.local_rank)


def create_loader(config: Config, split_name: str) -> Loader:
    split = config.split(split_name)
    backend, reason = choose_backend(config)
    ranks = detect_ranks(config.distributed)
    device = choose_device(config, ranks)
    log.info("backend %s for split '%s': %s", backend, split_name, reason)
    index = build_index(config, split)
    from torch_loader.loader import TorchLoader  # imported here: backends load only when chosen
    return TorchLoader(config, split, index, ranks, device)
