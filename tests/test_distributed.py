"""Ranks from torchrun, SLURM or the config, and sharding checked across real processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
from conftest import NATIVE_ABORT, REPO, env_without, write_numbered_dataset
from test_resume import BACKENDS

from fastloader.distributed import detect_ranks
from fastloader.errors import ConfigError


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
    info = detect_ranks(rank=0, world_size=3, local_rank=0)
    assert (info.rank, info.world_size, info.source) == (0, 3, "config")
    with pytest.raises(ConfigError, match=r"rank 4 is not in \[0, world_size=3\) \(from config\)"):
        detect_ranks(rank=4, world_size=3)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="environment variable WORLD_SIZE='two' is not an integer"):
        detect_ranks()


RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, "tests")
    import torch.distributed as dist
    import fastloader
    from conftest import identities
    config = json.loads(sys.argv[1])
    if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: a real process group, as a DDP job has
        dist.init_process_group("gloo")
    result = {}
    for split in ("val", "train"):
        with fastloader.build_loader(config, split) as loader:  # workers stop before the process group does
            batches = [[identities(x), y.tolist()] for x, y in loader]
            result[split] = {"len": len(loader), "source": loader.ranks.source, "batches": batches}
    if dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, result)
        if dist.get_rank() == 0:
            print(json.dumps(everyone))
        dist.barrier()  # leave together: gloo may abort a rank whose peers already closed their sockets
        dist.destroy_process_group()
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)  # past torch's teardown at interpreter exit, which aborts now and then (NATIVE_ABORT)
    else:
        print(json.dumps([result]))
""")


def run_ranks(config: dict, world: int, launcher: str, tmp_path) -> list[dict]:
    """One real process per rank: started by torchrun (with a gloo process group), or with the
    variables srun sets. Returns each rank's {split: {len, source, batches}}."""
    if launcher == "torchrun":
        script = tmp_path / "rank.py"
        script.write_text(RANK_SCRIPT)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                   str(script), json.dumps(config)]
        env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a native abort prints every thread's Python stack
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 and NATIVE_ABORT in proc.stderr:
            warnings.warn(f"a rank aborted in native code ({NATIVE_ABORT!r}); launched again:\n{proc.stderr[-3000:]}")
            proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])
    procs = []
    for rank in range(world):
        env = env_without("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")
        env.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(world), SLURM_LOCALID=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, json.dumps(config)], env=env,
                                      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results += json.loads(out)
    return results


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_ranks_in_separate_processes_shard_101_samples(tmp_path, launcher, backend):
    # 101 images in 3 classes (34, 34, 33): not divisible by 3 ranks x batch 8. Each image is one
    # colour of its own, so every output image names its file, whatever crop the backend drew.
    root = write_numbered_dataset(tmp_path / "d", per_class=34, splits=("val",))
    os.remove(root / "val" / "c_blue" / "n_33.png")
    # Three ranks on the CPU (gloo), whatever GPUs the machine has: one GPU cannot serve three local ranks.
    config = {"backend": backend, "seed": 3, "dataset": {"root": str(root)}, "workers": {"num_workers": 0},
              "output": {"device": "cpu"},
              "val": {"batch_size": 8, "transform": {"size": 8}},
              "train": {"folder": "val", "batch_size": 8, "transform": {"size": 8}}}
    ranks = run_ranks(config, 3, launcher, tmp_path)
    expected_source = "torch.distributed" if launcher == "torchrun" else "slurm"
    assert [r["val"]["source"] for r in ranks] == [expected_source] * 3

    evals = [r["val"] for r in ranks]
    samples = [(tuple(image), label) for r in evals for images, labels in r["batches"]
               for image, label in zip(images, labels)]
    assert len(samples) == len(set(samples)) == 101  # every sample exactly once over the ranks
    assert sorted(label for _, label in samples) == [0] * 34 + [1] * 34 + [2] * 33
    assert [r["len"] for r in evals] == [5, 5, 5] and [len(r["batches"]) for r in evals] == [5, 5, 5]

    trains = [r["train"] for r in ranks]
    assert [r["len"] for r in trains] == [4, 4, 4]  # 101 // 24 = 4 global batches on every rank
    assert [[len(labels) for _, labels in r["batches"]] for r in trains] == [[8] * 4] * 3
    seen = [tuple(image) for r in trains for images, _ in r["batches"] for image in images]
    assert len(seen) == len(set(seen)) == 96  # disjoint across ranks; 101 - 96 < 3 x 8 dropped
    assert set(seen) <= {image for image, _ in samples}
