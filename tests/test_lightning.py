"""fastloader.lightning.DataModule under a real Lightning Trainer on the CPU: the loaders built per
rank, the epochs the trainer's, a mid-epoch checkpoint that resumes with exactly the rest of the
epoch (Lightning fetches a batch ahead: the state counts what was trained), DDP ranks sharing the
samples, and a config without its val split refused with the fix."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, base_config, write_numbered_dataset

pytest.importorskip("lightning", reason="lightning is in the test extra: pip install -e '.[test]'")
import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning_run import Recorder, datamodule, trainer  # noqa: E402

from fastloader.errors import ConfigError  # noqa: E402


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    return write_numbered_dataset(tmp_path_factory.mktemp("numbered"), per_class=4)


def config(root, **train):
    return base_config(root, train={"batch_size": 2, "transform": {"size": 16}, **train},
                       val={"batch_size": 4, "transform": {"size": 16}})


def test_a_mid_epoch_checkpoint_resumes_with_exactly_the_rest_of_the_epoch(numbered, tmp_path):
    """Device: CPU. 2 epochs of 6 steps uninterrupted, against 4 steps, a checkpoint (saved by
    ModelCheckpoint at step 4, Lightning's next batch already fetched), and fit(ckpt_path=...): the
    same batches, none lost, none repeated, the second epoch included."""
    whole = Recorder()
    trainer(str(tmp_path / "a"), max_epochs=2, num_sanity_val_steps=0).fit(
        whole, datamodule=datamodule(config(numbered)))
    assert len(whole.seen) == 12
    first = Recorder()
    saving = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    trainer(str(tmp_path / "b"), max_steps=4, callbacks=[saving], num_sanity_val_steps=0).fit(
        first, datamodule=datamodule(config(numbered)))
    checkpoint = next((tmp_path / "ckpt").glob("*step=4*.ckpt"))
    rest = Recorder()
    trainer(str(tmp_path / "b"), max_epochs=2, num_sanity_val_steps=0).fit(
        rest, datamodule=datamodule(config(numbered)), ckpt_path=str(checkpoint))
    assert first.seen + rest.seen == whole.seen


class SaveBeforeStep(pl.Callback):
    """A checkpoint taken when a batch has been fetched but not trained on (on_train_batch_start)."""

    def __init__(self, path, batch: int):
        self.path, self.batch = path, batch

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx == self.batch and trainer.current_epoch == 0:
            trainer.save_checkpoint(self.path)


def test_a_checkpoint_taken_with_a_batch_fetched_but_not_trained_replays_that_batch(numbered, tmp_path):
    """Device: CPU. The loader has handed over batch 4 when the checkpoint is taken, the model has
    not trained on it: the state says 4 batches, and the resumed run starts with batch 4 (the
    loader's own position would skip it, as a fit loop that fetches ahead would)."""
    whole = Recorder()
    trainer(str(tmp_path / "a"), max_epochs=2, num_sanity_val_steps=0).fit(
        whole, datamodule=datamodule(config(numbered)))
    first = Recorder()
    trainer(str(tmp_path / "b"), max_steps=5, callbacks=[SaveBeforeStep(tmp_path / "at4.ckpt", 4)],
            num_sanity_val_steps=0).fit(first, datamodule=datamodule(config(numbered)))
    rest = Recorder()
    trainer(str(tmp_path / "b"), max_epochs=2, num_sanity_val_steps=0).fit(
        rest, datamodule=datamodule(config(numbered)), ckpt_path=str(tmp_path / "at4.ckpt"))
    assert first.seen[:4] + rest.seen == whole.seen


def test_each_epoch_is_the_trainers_and_the_val_loader_is_fastloaders(numbered, tmp_path):
    """Device: CPU. The train loader runs the trainer's epoch (a new order each epoch), validation
    reads every val sample."""
    module = datamodule(config(numbered))
    model = Recorder()
    run = trainer(str(tmp_path), max_epochs=2, num_sanity_val_steps=0)
    run.fit(model, datamodule=module)
    first, second = model.seen[:6], model.seen[6:]
    assert sorted(sum(first, [])) == sorted(sum(second, [])) and first != second
    assert "val_loss" in run.callback_metrics


def test_two_ddp_ranks_on_the_cpu_share_the_epochs_samples(numbered, tmp_path):
    """Device: CPU. Trainer(strategy="ddp", devices=2) in its own processes: each rank trains on
    its own half of the epoch's samples, none twice (Lightning's sampler injection leaves fastloader
    alone)."""
    out = tmp_path / "seen"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "lightning_run.py"), json.dumps(config(numbered)),
                           str(out)], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"seen.{rank}").read_text()) for rank in range(2)]
    assert all(rank["world_size"] == 2 for rank in ranks)
    images = [tuple(colour) for rank in ranks for batch in rank["seen"] for colour in batch]
    assert len(images) == len(set(images)) == 12  # 12 train images, 2 ranks x 3 steps x 2


def test_a_datamodule_without_its_val_split_is_refused_with_the_fix(numbered):
    raw = config(numbered)
    del raw["val"]
    with pytest.raises(ConfigError, match=r"DataModule\(val_split='val'\): the config has no split 'val' \(it has "
                                          r"train\); add a 'val:' section, or pass val_split=<one of them> or "
                                          r"val_split=None to train without validation"):
        datamodule(raw)


def test_the_lightning_example_trains_saves_and_resumes_on_the_demo(tmp_path, monkeypatch, caplog):
    """examples/lightning_train.py, in this process as `python examples/lightning_train.py ...` would
    run (CPU, the embedded demo, small): 3 steps with a checkpoint, then `--resume` goes on from it."""
    import logging
    import runpy
    command = ["lightning_train.py", str(REPO / "configs" / "sample.yaml"), "--set", "train.transform.size=32",
               "--set", "val.transform.size=32", "--set", "output.device=cpu", "--set", "workers.num_workers=0",
               "--save-every", "2", "--checkpoints", str(tmp_path / "ckpt")]
    for argv in ([*command, "--max-steps", "3"], [*command, "--max-steps", "5", "--resume",
                                                   str(tmp_path / "ckpt" / "last.ckpt")]):
        monkeypatch.setattr(sys, "argv", argv)
        with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as stopped:
            runpy.run_path(str(REPO / "examples" / "lightning_train.py"), run_name="__main__")
        assert stopped.value.code == 0
        assert (tmp_path / "ckpt" / "last.ckpt").is_file()
    assert "Restored all states from the checkpoint" in caplog.text and "`max_steps=5` reached" in caplog.text


def resumed_twice(numbered, tmp_path, first_steps: int) -> list[list[tuple]]:
    """Batch 2 for `first_steps` steps, a checkpoint at each; resumed at batch 4 for one step, a
    checkpoint; resumed again at batch 4 to the epoch's end: the batches the three runs trained."""
    runs = [Recorder() for _ in range(3)]
    saving = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    trainer(str(tmp_path / "b"), max_steps=first_steps, callbacks=[saving], num_sanity_val_steps=0).fit(
        runs[0], datamodule=datamodule(config(numbered)))
    saving = ModelCheckpoint(dirpath=tmp_path / "ckpt4", every_n_train_steps=1, save_top_k=-1)
    trainer(str(tmp_path / "b"), max_steps=first_steps + 1, callbacks=[saving], num_sanity_val_steps=0).fit(
        runs[1], datamodule=datamodule(config(numbered, batch_size=4)),
        ckpt_path=str(next((tmp_path / "ckpt").glob(f"*step={first_steps}.ckpt"))))
    trainer(str(tmp_path / "b"), max_epochs=1, num_sanity_val_steps=0).fit(
        runs[2], datamodule=datamodule(config(numbered, batch_size=4)),
        ckpt_path=str(next((tmp_path / "ckpt4").glob(f"*step={first_steps + 1}.ckpt"))))
    return [batch for run in runs for batch in run.seen]


def test_a_checkpoint_resumed_with_another_batch_size_then_saved_and_resumed_again_trains_each_sample_once(
        numbered, tmp_path):
    """Device: CPU. Batch 2 for 2 steps (4 samples), a checkpoint; resumed at batch 4 for one step,
    a checkpoint; resumed again to the end of the epoch. The position was Lightning's processed
    batches (3) times the new batch size (12: the epoch's end), and 4 samples were never trained."""
    batches = resumed_twice(numbered, tmp_path, 2)
    seen = [image for batch in batches for image in batch]
    assert [len(batch) for batch in batches] == [2, 2, 4, 4]
    assert len(seen) == len(set(seen)) == 12  # every train sample of epoch 0, once


def test_a_resume_with_a_batch_size_whose_whole_batches_leave_samples_out_says_so(numbered, tmp_path, caplog):
    """Device: CPU. Issue 68.6: batch 2 for one step, resumed at batch 4 for one step, resumed again
    to the epoch's end: the 10 samples left after the first step make 2 batches of 4 under drop_last
    (the train default), and 2 samples no whole batch can read. Those 2 were lost with no word (36
    of 40 in the issue's run); the first resume now says so, naming the keys; every other sample is
    trained once."""
    import logging
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        batches = resumed_twice(numbered, tmp_path, 1)
    assert caplog.text.count("leaves out") == 1
    assert ("resuming epoch 0 at sample 2 of 12 with 1 rank x batch 4 leaves out 2 samples that the state's 1 rank "
            "x batch 2 would read: train.drop_last: true takes whole steps only") in caplog.text
    seen = [image for batch in batches for image in batch]
    assert [len(batch) for batch in batches] == [2, 4, 4]
    assert len(seen) == len(set(seen)) == 10


class EpochMarks(pl.Callback):
    """Notes each epoch's start among the batches the model records."""

    def on_train_epoch_start(self, trainer, module):
        module.seen.append(("epoch", trainer.current_epoch))


def test_a_resume_whose_batch_size_leaves_nothing_of_the_epoch_goes_on_with_the_next_one(numbered, tmp_path):
    """Device: CPU. Batch 2 for 5 steps (10 of 12 samples), resumed at batch 4: the 2 left fill no
    batch (drop_last; warned), so the loader resumes at epoch 1, while the fit loop still finishes
    epoch 0, whose set_epoch(0) started it again from its first batch: 12 samples trained twice."""
    saving = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    first, rest = Recorder(), Recorder()
    trainer(str(tmp_path / "b"), max_steps=5, callbacks=[saving], num_sanity_val_steps=0).fit(
        first, datamodule=datamodule(config(numbered)))
    trainer(str(tmp_path / "b"), max_epochs=2, num_sanity_val_steps=0, callbacks=[EpochMarks()]).fit(
        rest, datamodule=datamodule(config(numbered, batch_size=4)),
        ckpt_path=str(next((tmp_path / "ckpt").glob("*step=5.ckpt"))))
    assert rest.seen[0] == ("epoch", 1) and [len(batch) for batch in rest.seen[1:]] == [4, 4, 4]
    epoch_1 = [image for batch in rest.seen[1:] for image in batch]
    assert len(epoch_1) == len(set(epoch_1)) == 12
