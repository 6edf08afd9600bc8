"""Resume on both backends: a process killed mid-epoch, restarted from its saved loader state, yields
exactly the batches the uninterrupted run would have; another job size re-shards the rest."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import DEVICES, REPO, base_config, identities, write_numbered_dataset, write_textured_dataset

from fastloader import build_loader

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]

TRAIN_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, torch, fastloader
    mode, config, state_path, stop = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    loader = fastloader.build_loader(config, "train")
    if mode == "resume":
        loader.load_state_dict(torch.load(state_path))
    batches = []
    for _ in range(2):  # two loops: two epochs, or the rest of the saved epoch and the next one
        for step, (images, labels) in enumerate(loader):
            batches.append([labels.tolist(), [round(v, 4) for v in images.float().mean(dim=(1, 2, 3)).tolist()]])
            if mode == "interrupt" and step + 1 == stop:
                torch.save(loader.state_dict(), state_path)
                os.kill(os.getpid(), signal.SIGKILL)  # preempted: no clean shutdown
    print(json.dumps(batches))
""")


def run_train(mode: str, config: dict, state_path, stop: int = 0) -> tuple[int, list]:
    proc = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, mode, json.dumps(config), str(state_path), str(stop)],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else proc.stderr)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_process_resumes_from_its_saved_state_with_the_uninterrupted_runs_batches(tmp_path, backend, device):
    # torch replays even the random crops: textured images show them. DALI replays samples and order
    # (its random operators restart from their seed): images of one solid colour each name their file.
    write = write_textured_dataset if backend == "torch" else write_numbered_dataset
    root = write(tmp_path / "d", per_class=10, splits=("train",))
    config = base_config(root, backend=backend, workers={"num_workers": 2}, train={"batch_size": 4},
                         output={"device": device})
    state = tmp_path / "loader.pt"
    code, reference = run_train("run", config, state)
    assert code == 0, reference
    assert len(reference) == 2 * 7  # 30 images, batch 4, drop_last: 7 batches per epoch
    code, _ = run_train("interrupt", config, state, stop=3)
    assert code == -9 and state.exists()
    assert torch.load(state)["position"] == 12
    code, resumed = run_train("resume", config, state)
    assert code == 0, resumed
    assert resumed == reference[3:]  # the rest of epoch 0, then epoch 1, identical


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("split", ["train", "val"])
def test_a_restart_with_more_ranks_and_another_batch_size_re_shards_the_rest_of_the_epoch(tmp_path, backend, split):
    root = write_numbered_dataset(tmp_path / "d", per_class=12)  # 36 images per split
    config = base_config(root, backend=backend, train={"batch_size": 4, "drop_last": False}, val={"batch_size": 4})

    def rank_loader(rank: int, world: int, batch: int):
        return build_loader({**config, "distributed": {"rank": rank, "world_size": world},
                             split: {**config[split], "batch_size": batch}}, split)

    before, state = [], None
    for rank in range(2):  # 2 ranks x batch 4 consume 2 batches each: 16 samples
        loader = rank_loader(rank, 2, 4)
        for step, (images, _) in enumerate(loader):
            before += identities(images)
            if step == 1:
                state = state or loader.state_dict()  # every rank's state is the same: keep rank 0's
                break
    assert state["position"] == 16 and state["world_size"] == 2
    after = []
    for rank in range(3):  # restarted as 3 ranks x batch 5
        loader = rank_loader(rank, 3, 5)
        loader.load_state_dict(state)
        after.append([identities(images) for images, _ in loader])
    every = [x for x, _ in build_loader({**config, split: {**config[split], "shuffle": False}}, split)]
    all_files = sorted(i for images in every for i in identities(images))
    rest = [i for batches in after for batch in batches for i in batch]
    if split == "val":  # 20 left: ranks take 7, 7, 6; every file exactly once over both jobs
        assert [sum(map(len, batches)) for batches in after] == [7, 7, 6]
        assert sorted(before + rest) == all_files
    else:  # 20 left, padded to 7 per rank so that DDP stays in step; every file delivered
        assert [[len(b) for b in batches] for batches in after] == [[5, 2]] * 3
        assert sorted(set(before + rest)) == all_files and len(before + rest) == 36 + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resume_whose_batch_size_leaves_samples_out_under_drop_last_says_so_naming_the_keys(tmp_path, backend,
                                                                                             caplog):
    """Issue 68.6: 40 images, 3 batches of 4, resumed with batch 8 (drop_last, the train default): the
    28 left make 3 whole batches, and 4 samples no whole batch can read (the saved run would have).
    Silent before; now a warning names the count, the keys and both fixes. drop_last: false reads
    every sample once."""
    import logging
    root = write_numbered_dataset(tmp_path / "d", per_class=14, splits=("train",))
    for path in sorted((root / "train").rglob("*.png"))[:2]:
        path.unlink()  # 40 images
    config = base_config(root, backend=backend, train={"batch_size": 4})

    def consumed(drop_last: bool) -> tuple[list, list]:
        with build_loader({**config, "train": {**config["train"], "drop_last": drop_last}}, "train") as loader:
            before = [i for images, _ in itertools.islice(loader, 3) for i in identities(images)]
            state = loader.state_dict()
        resumed = {**config, "train": {**config["train"], "batch_size": 8, "drop_last": drop_last}}
        with build_loader(resumed, "train") as loader:
            loader.load_state_dict(state)
            return before, [i for images, _ in loader for i in identities(images)]

    with caplog.at_level(logging.WARNING, logger="fastloader"):
        before, rest = consumed(drop_last=True)
    assert len(before) == 12 and len(rest) == 24 and len(set(before + rest)) == 36
    assert ("split 'train': resuming epoch 0 at sample 12 of 40 with 1 rank x batch 8 leaves out 4 samples that the "
            "state's 1 rank x batch 4 would read: train.drop_last: true takes whole steps only (a batch on every "
            "rank), and the 28 samples left do not fill them. To read them, finish the epoch with train.batch_size: 4 "
            "on 1 rank, or set train.drop_last: false (a last, smaller batch)") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        before, rest = consumed(drop_last=False)
    assert len(before + rest) == len(set(before + rest)) == 40 and "leaves out" not in caplog.text
