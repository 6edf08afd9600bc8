"""fastloader in a Hugging Face Accelerate loop on the CPU, the documented way (docs/accelerate.md):
the loader is not `prepare`d (its device and ranks are its own), and a resume through
save_state / load_state restores its position instead of skipping batches."""
from __future__ import annotations

import pytest
import torch
from conftest import base_config, identities, write_numbered_dataset

pytest.importorskip("accelerate", reason="accelerate is in the test extra: pip install -e '.[test]'")
from accelerate import Accelerator  # noqa: E402

from fastloader import build_loader  # noqa: E402


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    return write_numbered_dataset(tmp_path_factory.mktemp("numbered"), per_class=4, splits=("train",))


def config(root):
    return base_config(root, train={"batch_size": 2, "transform": {"size": 16}})


def steps(accelerator, loader, model, optimizer, count=None):
    """Train on the loader's batches (all of one epoch, or `count`), noting each batch's images."""
    seen = []
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images.mean(dim=(2, 3))), labels)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        seen.append(identities(images))
        if count is not None and len(seen) == count:
            break
    return seen


def run(accelerator, root):
    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = build_loader(config(root), "train")
    accelerator.register_for_checkpointing(loader)  # its state_dict / load_state_dict, in save_state's files
    return model, optimizer, loader


def test_save_state_and_load_state_resume_the_loader_mid_epoch(numbered, tmp_path):
    """Device: CPU. 2 batches, save_state, then a new Accelerator and loader, load_state: the rest of
    the epoch, then the next one, are the uninterrupted run's batches."""
    uninterrupted = Accelerator(cpu=True)
    model, optimizer, loader = run(uninterrupted, numbered)
    whole = steps(uninterrupted, loader, model, optimizer) + steps(uninterrupted, loader, model, optimizer)
    assert len(whole) == 12
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = run(accelerator, numbered)
    first = steps(accelerator, loader, model, optimizer, count=2)
    accelerator.save_state(str(tmp_path / "state"))
    again = Accelerator(cpu=True)
    model, optimizer, loader = run(again, numbered)
    again.load_state(str(tmp_path / "state"))
    rest = steps(again, loader, model, optimizer) + steps(again, loader, model, optimizer)
    assert first + rest == whole


def test_a_prepared_loader_is_the_loader_and_skipping_batches_names_the_fix(numbered):
    """Device: CPU. prepare() hands a fastloader loader back as it is (no second sharding);
    skip_first_batches, Accelerate's resume for DataLoaders, is refused naming what to do instead."""
    accelerator = Accelerator(cpu=True)
    loader = build_loader(config(numbered), "train")
    assert accelerator.prepare(loader) is loader
    with pytest.raises(AttributeError, match=r"has no torch `dataset`.*restore its position rather than skipping "
                                             r"batches.*register_for_checkpointing\(loader\)"):
        accelerator.skip_first_batches(loader, 2)


def test_the_accelerate_example_stops_and_the_same_command_resumes_mid_epoch(tmp_path, monkeypatch, capsys):
    """examples/accelerate_train.py, in this process as `python examples/accelerate_train.py ...`
    would run (CPU, the embedded demo): stopped after 3 steps, the same command resumes at the 4th
    batch of epoch 0 and finishes the epoch."""
    import runpy
    import sys

    from conftest import REPO
    command = ["accelerate_train.py", str(REPO / "configs" / "sample.yaml"), "--set", "train.transform.size=32",
               "--set", "workers.num_workers=0", "--set", "output.device=cpu", "--epochs", "1",
               "--state", str(tmp_path / "state")]
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    for argv in ([*command, "--max-steps", "3"], command):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as stopped:
            runpy.run_path(str(REPO / "examples" / "accelerate_train.py"), run_name="__main__")
        assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert "stopped after 3 steps; the same command resumes" in out
    assert "resumed from" in out and "epoch 0, sample 96" in out and "epoch 0 done" in out  # 3 x batch 32
