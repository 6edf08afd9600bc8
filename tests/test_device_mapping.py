"""Rank to GPU: one pure function (fastloader.distributed.local_gpu) of the local rank, the local
world size, the GPUs a process sees and output.device, checked against every launcher's way of
showing GPUs to its ranks. No GPU is needed: the GPUs a process sees are an argument."""
from __future__ import annotations

import pytest

from fastloader.distributed import detect_ranks, local_gpu
from fastloader.errors import ConfigError

CUDA_N_SHARED = "all 8 ranks of this node put their batches on that one GPU; set output.device: cuda"
TOO_MANY = ("has no GPU of its own: 8 ranks on this node, but torch sees 4 GPUs. Launch at most 4 processes per "
            "node (torchrun --nproc_per_node=4, srun --ntasks-per-node=4), or give each rank its own GPUs (srun "
            "--gpus-per-task=1) and set output.device: cuda:0 where each rank sees several")
ONE_GPU = "sees one GPU, cuda:0: its own where the launcher gives each rank one (SLURM --gpus-per-task=1"

# (launcher, local rank, local world size, GPUs the process sees, output.device) -> GPU index, or an error / a
# log line (a regular expression of what the log or the error says)
TABLE = [
    ("torchrun, 8 GPUs, 8 ranks: rank 0", 0, 8, 8, "auto", 0, "local rank 0 of 8: cuda:0 of the 8 GPUs"),
    ("torchrun, 8 GPUs, 8 ranks: rank 5", 5, 8, 8, "cuda", 5, "local rank 5 of 8: cuda:5"),
    ("SLURM without GPU binding: SLURM_LOCALID 7 sees all 8", 7, 8, 8, "auto", 7, "cuda:7 of the 8 GPUs"),
    ("SLURM --gpus-per-task=1: SLURM_LOCALID 0 sees its own", 0, 8, 1, "auto", 0, ONE_GPU),
    ("SLURM --gpus-per-task=1: SLURM_LOCALID 3 sees its own", 3, 8, 1, "auto", 0, ONE_GPU),
    ("SLURM --gpus-per-task=1: SLURM_LOCALID 7 sees its own", 7, 8, 1, "cuda", 0, ONE_GPU),
    ("per-rank CUDA_VISIBLE_DEVICES, local world unknown", 6, 1, 1, "auto", 0, ONE_GPU),
    ("Kubernetes, one GPU per pod, one process", 0, 1, 1, "auto", 0, ""),
    ("one process, 8 GPUs", 0, 1, 8, "auto", 0, ""),
    ("output.device: cuda:3, one process", 0, 1, 8, "cuda:3", 3, ""),
    ("output.device: cuda:3, 8 ranks share it", 2, 8, 8, "cuda:3", 3, CUDA_N_SHARED),
    ("output.device: cpu, on a GPU node", 3, 8, 8, "cpu", None, ""),
    ("output.device: auto, no GPU", 0, 1, 0, "auto", None, ""),
    ("more ranks than GPUs: 8 ranks, 4 GPUs, rank 0", 0, 8, 4, "auto", ConfigError, TOO_MANY),
    ("more ranks than GPUs: 8 ranks, 4 GPUs, rank 7", 7, 8, 4, "cuda", ConfigError, TOO_MANY),
    ("output.device: cuda, no GPU", 0, 1, 0, "cuda", ConfigError, "torch sees 0 CUDA GPUs; set output.device: auto"),
    ("output.device: cuda:8 of 8 GPUs", 0, 1, 8, "cuda:8", ConfigError, "set output.device to cuda:0 to cuda:7"),
    ("output.device: cuda:1 where each rank sees one", 1, 8, 1, "cuda:1", ConfigError, "set output.device to cuda:0,"),
]


@pytest.mark.parametrize("launcher, local_rank, local_world, visible, wanted, expected, says", TABLE,
                         ids=[row[0] for row in TABLE])
def test_each_launcher_gets_the_gpu_of_its_rank(launcher, local_rank, local_world, visible, wanted, expected, says):
    if expected is ConfigError:
        with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
            local_gpu(local_rank, local_world, visible, wanted)
        return
    choice = local_gpu(local_rank, local_world, visible, wanted)
    assert choice.index == expected
    assert (says in choice.reason) if says else choice.reason == ""
    assert choice.warning == (says == CUDA_N_SHARED)


def test_the_error_names_where_the_value_came_from_and_what_limits_the_gpus():
    with pytest.raises(ConfigError) as error:
        local_gpu(0, 1, 2, "cuda:2", origin="override 'output.device'", visible_env="0,1")
    assert str(error.value) == ("override 'output.device': output.device: cuda:2, but torch sees 2 CUDA GPUs "
                                "(CUDA_VISIBLE_DEVICES='0,1' limits them); set output.device to cuda:0 to cuda:1, cuda "
                                "(the local rank's GPU) or auto")
    with pytest.raises(ConfigError, match=r"^local rank 5 of 8 \(from slurm\) has no GPU of its own: 8 ranks on this "
                                          r"node, but torch sees 2 GPUs \(CUDA_VISIBLE_DEVICES='0,1'\)"):
        local_gpu(5, 8, 2, "auto", ranks_from="slurm", visible_env="0,1")


LAUNCHERS = {
    "torchrun --nproc_per_node=8, rank 13": (
        {"RANK": "13", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}, 8, 5),
    "srun --ntasks-per-node=8 --gpus-per-task=1, task 13": (
        {"SLURM_PROCID": "13", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5", "SLURM_NTASKS_PER_NODE": "8",
         "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_NODEID": "1"}, 1, 0),
    "srun --ntasks-per-node=8 --gpus-per-node=8, task 13": (
        {"SLURM_PROCID": "13", "SLURM_NTASKS": "16", "SLURM_LOCALID": "5", "SLURM_NTASKS_PER_NODE": "8"}, 8, 5),
    "srun -n 12 over a node of 8 and one of 4 (no --ntasks-per-node), task 10": (
        {"SLURM_PROCID": "10", "SLURM_NTASKS": "12", "SLURM_LOCALID": "2", "SLURM_TASKS_PER_NODE": "8,4",
         "SLURM_NODEID": "1"}, 4, 2),
    "Kubernetes PyTorchJob, one GPU per pod, pod 3": ({"RANK": "3", "WORLD_SIZE": "4"}, 1, 0),
    "torchrun inside an sbatch step of one task per node": (
        {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8", "SLURM_PROCID": "1",
         "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1"}, 8, 1),
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_the_launchers_variables_and_gpus_give_each_rank_its_gpu(monkeypatch, launcher):
    """From the variables each launcher sets (detect_ranks) and the GPUs it shows a rank, to its GPU."""
    variables, visible, expected = LAUNCHERS[launcher]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    ranks = detect_ranks()
    assert local_gpu(ranks.local_rank, ranks.local_world_size, visible, "auto").index == expected


@pytest.mark.parametrize("tasks, node, expected", [("8(x3),4", "3", 4), ("8(x3),4", "0", 8), ("2,1", "1", 1),
                                                   ("4(x2)", None, 4)])
def test_slurm_tasks_per_node_is_read_for_this_node(monkeypatch, tasks, node, expected):
    """Without --ntasks-per-node, SLURM lists each node's task count; each rank reads its node's."""
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "28")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", tasks)
    if node is not None:
        monkeypatch.setenv("SLURM_NODEID", node)
    assert detect_ranks().local_world_size == expected


def test_local_rank_zero_from_torchrun_is_not_replaced_by_slurms(monkeypatch):
    """torchrun's LOCAL_RANK=0 wins over SLURM_LOCALID under a process group (0 is a value, not unset)."""
    import torch.distributed as dist
    for name, value in {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "SLURM_LOCALID": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29531", "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert (detect_ranks().local_rank, detect_ranks().source) == (0, "torch.distributed")
    finally:
        dist.destroy_process_group()
