"""Picks the backend (auto | dali | torch), says why in the log, has the split prepared once
(prepared.prepare_split) and builds the loader from it.

The only module of fastloader that names the backends: BACKENDS loads the chosen one by module name,
so that `import fastloader` never imports DALI, and the backends stay out of fastloader's imports.
"""
from __future__ import annotations

import gc
import importlib
import logging
import os
import re
import sys

import torch

from .config_tuned import data_format, warn_if_measured_elsewhere
from .contract import Loader
from .cuda_install import (
    dali_cuda_major_installed,
    driver_cuda_version,
    driver_gpu_count,
    driver_problem,
    torch_cuda_major,
)
from .distributed import RankInfo, detect_ranks, local_gpu
from .errors import ConfigError, error_text
from .hooks import split_hooks
from .prepared import prepare_split, worker_count
from .schema import Config
from .sources.protocol import forget_source
from .sources.stores import release_store

log = logging.getLogger("fastloader")

BACKENDS = {"torch": ("torch_loader.loader", "TorchLoader"), "dali": ("dali_loader.loader", "DaliLoader")}
"""Backend -> (module, Loader class), imported only when the backend is chosen."""

DALI_MIN_VERSION = (2, 0)
"""The oldest DALI whose API the DALI backend's graph uses: fn.filter and fn.equalize out of
fn.experimental (DALI PR #6134, first released in 2.0.0), and exec_dynamic by name (1.44). The
floor in pyproject.toml (tests/test_packaging.py holds them equal)."""


def choose_backend(config: Config, device: torch.device) -> tuple[str, str]:
    """(backend, reason). auto takes DALI where it imports and the output goes to a CUDA GPU, else
    torch: on the CPU the torch backend outruns DALI's CPU flavour (docs/performance.md)."""
    if config.backend == "torch":
        return "torch", f"backend: torch ({_origin(config)})"
    if config.backend == "dali":
        problem = _dali_problem()
        if problem:
            raise ConfigError(f"{config.source}: backend: dali ({_origin(config)}), but {problem}; or set backend: "
                              f"torch")
        return "dali", f"backend: dali ({_origin(config)})"
    if not torch.cuda.is_available():
        return "torch", "backend: auto and no CUDA GPU is available"
    if device.type != "cuda":
        return "torch", (f"backend: auto and output.device: {config.output.device} "
                         "(on the CPU the torch backend is the faster at ImageNet's sizes)")
    problem = _dali_problem()
    if problem:
        return "torch", (f"backend: auto, a CUDA GPU is present, but {problem}; so the torch backend decodes on the "
                         f"CPU")
    return "dali", "backend: auto, a CUDA GPU is present and NVIDIA DALI imports"


def dali_package() -> str:
    """The DALI wheel of torch's CUDA major: nvidia-dali-cuda130 beside PyPI's torch (CUDA 13), what
    pyproject.toml installs; nvidia-dali-cuda120 beside a CUDA 12 build of torch
    (docs/performance.md#the-cuda-stack)."""
    return f"nvidia-dali-cuda{torch_cuda_major() or 13}0"


def _dali_problem() -> str | None:
    """None when `nvidia.dali` imports and is recent enough, else why not and the fix (not
    installed, a broken install, too old)."""
    try:
        import nvidia.dali  # (only here: `import fastloader` must not need DALI)
    except ImportError as error:
        return (f"NVIDIA DALI does not import: {error_text(error)}. Install it with: pip install {dali_package()} "
                f"(Linux x86_64 / aarch64)")
    return dali_version_problem(getattr(nvidia.dali, "__version__", "0"))


def dali_version_problem(version: str) -> str | None:
    """None for a DALI version the DALI backend runs on, else what is wrong and the fix."""
    release = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if release >= DALI_MIN_VERSION:
        return None
    floor = ".".join(map(str, DALI_MIN_VERSION))
    return (f"NVIDIA DALI {version} is older than {floor}, the first with the operators the DALI backend uses "
            f"(fn.filter and fn.equalize out of fn.experimental). Upgrade it: pip install -U "
            f"'{dali_package()}>={floor}'")


def _origin(config: Config) -> str:
    """Where `backend` really came from: the file, an override, the command, FASTLOADER_BACKEND."""
    return f"from {config.origin('backend')}"


def choose_device(config: Config, ranks: RankInfo) -> torch.device:
    """output.device as a torch device, the local rank's GPU by distributed.local_gpu (checked
    against the GPUs torch sees; an error names where the value came from), and why, logged."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0 and config.output.device == "auto" and driver_gpu_count():
        builds = {"torch": torch_cuda_major(), "DALI": dali_cuda_major_installed()}
        problem = driver_problem(driver_cuda_version(), builds)
        if problem:  # a GPU torch cannot use: not a quiet CPU run
            raise ConfigError(f"{config.origin('output.device')}: output.device: auto, but {problem}; or set "
                              f"output.device: cpu to run on the CPU on purpose")
    choice = local_gpu(ranks.local_rank, ranks.local_world_size, visible, config.output.device,
                       origin=config.origin("output.device"), ranks_from=ranks.source,
                       visible_env=os.environ.get("CUDA_VISIBLE_DEVICES"))
    device = torch.device("cpu") if choice.index is None else torch.device("cuda", choice.index)
    if choice.reason:
        log.log(logging.WARNING if choice.warning else logging.INFO, "device %s: %s", device, choice.reason)
    return device


def create_loader(config: Config, split_name: str, source: object | None = None,
                  hooks: dict | None = None) -> Loader:
    """The loader of one split; `source`: an object of the Source protocol to read it from;
    `hooks`: the user's hooks given in code ({kind: function}), in place of the config's."""
    split = config.split(split_name)
    user_hooks = split_hooks(config.hook_settings(split), config.dali.graph_hook_args, **(hooks or {}))
    ranks = detect_ranks(*config.distributed.given())
    warn_if_measured_elsewhere(config.tuned.measured_on, config.tuned.file or config.origin("tuned.measured_on"),
                               ranks.local_world_size, data_format(config.dataset.format, bool(config.dataset.cache)))
    device = choose_device(config, ranks)
    backend, reason = choose_backend(config, device)
    # auto on a GPU with the output there, yet torch: DALI does not import, which the user would not expect
    surprising = config.backend == "auto" and backend == "torch" and device.type == "cuda"
    if backend == "dali" and device.type == "cpu":
        if config.output.device == "cpu":
            reason += f"; output.device: cpu ({config.origin('output.device')}), so DALI runs its CPU flavour"
        else:  # asked for DALI, got no GPU: the user would not expect CPU decoding
            surprising = True
            reason += ("; no CUDA GPU is available, so DALI runs its CPU flavour (decoding on the CPU, not with "
                       "nvJPEG); set backend: torch or run on a GPU to silence this")
    said_before = surprising and reason in _SAID
    _SAID.add(reason)
    log.log(logging.WARNING if surprising and not said_before else logging.INFO, "backend %s for split '%s': %s",
            backend, split_name, reason)
    if backend == "torch" and user_hooks.graph is not None:
        raise ConfigError(f"{user_hooks.graph.label} adds operators to a DALI graph, and split '{split_name}' is read "
                          f"by the torch backend ({reason}): set backend: dali (DALI's CPU flavour runs without a "
                          f"GPU), or give the op as {split_name}.transform.sample_hook, which both backends run")
    loader_class = backend_class(backend)
    workers = worker_count(config, backend, ranks)
    prepared = prepare_split(config, split, workers, ranks, source, user_hooks,
                             held_ahead=loader_class.depth_for(config, workers))
    try:
        return loader_class(config, split, prepared, ranks, device)
    except BaseException:
        release_store(prepared.index.store)  # the loader that would have released its node cache
        forget_source(prepared.index.reader)  # and the user's source
        raise


_SAID: set[str] = set()
"""The surprising backend choices warned of in this process: a second loader (the val split's, the
next run of a notebook) says the same at INFO, not another WARNING."""


def backend_class(backend: str) -> type[Loader]:
    """The backend's Loader class, its module imported on first use. A first import leaves cyclic
    garbage (frames of torch's and DALI's modules) whose frames hold this call's callers, and so the
    loader they build: collected here, at once, rather than by a later collection, which would then
    stop the loader's workers (torch: two 5-s joins) in the middle of whatever the program does."""
    module, name = BACKENDS[backend]
    first = module not in sys.modules
    loader_class = getattr(importlib.import_module(module), name)
    if first:
        gc.collect()
    return loader_class
