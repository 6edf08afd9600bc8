"""Ranks from torchrun, SLURM or the config, and sharding checked across real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fastloader.config import ConfigError, DistributedConfig
from fastloader.distributed import detect_ranks
from conftest import REPO, env_without, write_textured_dataset


def test_single_process_by_default():
    info = detect_ranks()
    assert (info.rank, info.world_size, info.local_rank, info.source) == (0, 1, 0, "single process")


def test_torchrun_variables(monkeypatch):
    for name, value in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_PROCID", "0")  # torchrun inside an sbatch job: torchrun's numbers win
    monkeypatch.setenv("SLURM_NTASKS", "2")
    info = detect_ranks()
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.source) == (5, 8, 1, 4, "torchrun")


def test_slurm_variables(monkeypatch):
    for name, value in {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                        "SLURM_NTASKS_PER_NODE": "2"}.items():
        monkeypatch.setenv(name, value)
    info = detect_ranks()
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.source) == (3, 4, 1, 2, "slurm")


def test_config_values_win_and_bad_values_are_explained(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    info = detect_ranks(DistributedConfig(rank=0, world_size=3, local_rank=0))
    assert (info.rank, info.world_size, info.source) == (0, 3, "config")
    with pytest.raises(ConfigError, match=r"rank 4 is not in \[0, world_size=3\) \(from config\)"):
        detect_ranks(DistributedConfig(rank=4, world_size=3))
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="environment variable WORLD_SIZE='two' is not an integer"):
        detect_ranks()


RANK_SCRIPT = textwrap.dedent("""
    import json, sys, fastloader
    config, split = json.loads(sys.argv[1]), sys.argv[2]
    loader = fastloader.build_loader(config, split)
    batches = [(x.mean(dim=(1, 2, 3)).tolist(), y.tolist()) for x, y in loader]
    print(json.dumps({"len": len(loader), "batches": batches}))
""")


def run_ranks(config: dict, split: str, world: int, launcher: str) -> list[dict]:
    """Start one real process per rank with the launcher's variables set, as torchrun or srun would."""
    procs = []
    for rank in range(world):
        env = env_without("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")
        if launcher == "torchrun":
            env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        else:
            env.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(world), SLURM_LOCALID=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, json.dumps(config), split], env=env,
                                      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    return results


@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_ranks_in_separate_processes_shard_101_samples(tmp_path, launcher):
    # 101 images in 3 classes (34, 34, 33): not divisible by 3 ranks x batch 8.
    root = write_textured_dataset(tmp_path / "d", per_class=34, splits=("val",))
    os.remove(root / "val" / "c_blue" / "t_33.png")
    config = {"backend": "torch", "seed": 3, "dataset": {"root": str(root)}, "workers": {"num_workers": 0},
              "val": {"batch_size": 8, "transform": {"size": 8}},
              "train": {"folder": "val", "batch_size": 8, "transform": {"size": 8}}}
    evals = run_ranks(config, "val", 3, launcher)
    samples = [(label, round(mean, 5)) for result in evals for means, ys in result["batches"]
               for mean, label in zip(means, ys)]
    assert len(samples) == len(set(samples)) == 101  # every sample once (each image has its own mean)
    assert sorted(label for label, _ in samples) == [0] * 34 + [1] * 34 + [2] * 33
    assert [r["len"] for r in evals] == [5, 5, 5]
    trains = run_ranks(config, "train", 3, launcher)
    assert [r["len"] for r in trains] == [4, 4, 4]  # 101 // 24 = 4 global batches on every rank
    assert [len(r["batches"]) for r in trains] == [4, 4, 4]
    seen = [(y, round(m, 5)) for r in trains for means, ys in r["batches"] for m, y in zip(means, ys)]
    assert len(seen) == len(set(seen)) == 96  # disjoint across ranks; 101 - 96 < 3 x 8 dropped
