"""examples/train.py under torchrun with 2 CPU ranks: DDP training, exactly-once evaluation, and a
run stopped mid-epoch that the same command resumes from its checkpoint."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import torch
from conftest import NATIVE_ABORT, REPO

SMALL = ["--set", "train.transform.size=32", "--set", "val.transform.size=32", "--set", "train.batch_size=16"]
ON_CPU = ["--set", "output.device=cpu"]  # two ranks need the CPU (gloo) unless the machine has two GPUs


def torchrun(*args: str, cwd) -> str:
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(REPO / "examples" / "train.py"), str(REPO / "configs" / "sample.yaml"),
                           *SMALL, *ON_CPU, *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    if proc.returncode != 0 and NATIVE_ABORT in proc.stderr:  # torch's teardown (conftest): what follows
        warnings.warn(f"a rank aborted in native code:\n{proc.stderr[-3000:]}")  # checks every line printed
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_two_rank_ddp_run_stops_mid_epoch_and_the_same_command_resumes_it(tmp_path):
    checkpoint = tmp_path / "ckpt.pt"
    first = torchrun("--epochs", "2", "--max-steps", "3", "--log-every", "1", "--checkpoint", str(checkpoint),
                     cwd=tmp_path)
    # 240 demo images, 2 ranks x batch 16: 7 steps per epoch
    assert "resnet18 on 2 rank(s), torch backend, device cpu, global batch 32, 7 steps per epoch" in first
    assert len(re.findall(r"epoch 0 step \d loss \d+\.\d+ \d+ images/s", first)) == 3
    assert "stopped after 3 steps (--max-steps) at epoch 0, step 3" in first
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["step"] == 3 and saved["train_loader"]["position"] == 3 * 32

    second = torchrun("--epochs", "2", "--log-every", "1", "--checkpoint", str(checkpoint), cwd=tmp_path)
    assert "resumed from" in second and "step 3, epoch 0, sample 96 of 240" in second
    steps = [(int(e), int(s)) for e, s in re.findall(r"epoch (\d) step (\d+) loss", second)]
    assert steps == [(0, s) for s in range(4, 8)] + [(1, s) for s in range(8, 15)]  # nothing replayed or lost
    accuracy = re.findall(r"epoch (\d) done: loss \d+\.\d+, val accuracy (\d\.\d+) on (\d+) images", second)
    assert [(e, n) for e, _, n in accuracy] == [("0", "60"), ("1", "60")]  # every val image once over the ranks
    assert torch.load(checkpoint, weights_only=True)["train_loader"]["epoch"] == 1


def test_every_tensor_the_example_creates_names_its_device():
    """On a GPU, a tensor made without `device=` lands on the CPU and breaks the first sum or stack
    with the batches (as `torch.tensor(len(labels))` broke evaluate() on an H100). CPU runs cannot
    show that mistake, so the example's source is read for it; test_cuda.py runs the example there."""
    import ast
    factories = {"tensor", "zeros", "ones", "empty", "full", "arange", "as_tensor", "rand", "randn"}
    tree = ast.parse((REPO / "examples" / "train.py").read_text())
    undevised = [f"line {node.lineno}: torch.{node.func.attr}(...)" for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                 and node.func.attr in factories and not any(k.arg == "device" for k in node.keywords)]
    assert undevised == [], "tensors created on the CPU whatever the run's device: " + ", ".join(undevised)


def example(*args: str, cwd, **popen) -> subprocess.Popen:
    """examples/train.py in one process on the CPU (2 DataLoader workers, from the sample config)."""
    return subprocess.Popen([sys.executable, str(REPO / "examples" / "train.py"), str(REPO / "configs" / "sample.yaml"),
                             *SMALL, *ON_CPU, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def test_a_config_error_prints_its_message_and_exits_2(tmp_path):
    out, err = (proc := example("--set", "train.bach_size=3", cwd=tmp_path)).communicate(timeout=120)
    assert proc.returncode == 2, err[-2000:]
    assert "train.py: error: override 'train.bach_size': unknown key 'train.bach_size'; did you mean " \
           "'train.batch_size'?" in err and "Traceback" not in err


def test_a_batch_larger_than_the_split_is_an_error_not_a_run_of_no_steps(tmp_path):
    """It ran 0 steps, printed "loss nan ... train size  px" and exited 0 (issue 41.17)."""
    out, err = (proc := example("--set", "train.batch_size=4096", cwd=tmp_path)).communicate(timeout=120)
    assert proc.returncode == 2, err[-2000:]
    assert "train.py: error: split 'train' yields no batch per epoch" in err and "nan" not in out


def test_ctrl_c_saves_a_checkpoint_that_the_same_command_resumes_exactly(tmp_path):
    """Ctrl-C, as a terminal sends it to the whole process group (the DataLoader workers too): the step
    under way ends, the checkpoint is saved, exit 130; the same command resumes at the next step with
    nothing replayed or lost; a checkpoint saved at the end of an epoch resumes at the next one's start."""
    import os
    import signal
    checkpoint = tmp_path / "ckpt.pt"
    command = ["--epochs", "1", "--log-every", "1", "--checkpoint", str(checkpoint)]
    first = example(*command, cwd=tmp_path, start_new_session=True)
    lines = []
    try:
        for line in first.stdout:
            lines.append(line)
            if line.startswith("epoch 0 step 2 "):
                os.killpg(first.pid, signal.SIGINT)
                break
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    out = "".join(lines) + out
    assert first.returncode == 130, err[-3000:]
    stopped = re.search(r"interrupted at epoch 0, step (\d+): saved .*ckpt.pt; the same command resumes from it", out)
    assert stopped and "Traceback" not in err, out + err[-3000:]
    step = int(stopped.group(1))
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["step"] == step and saved["train_loader"]["position"] == step * 16  # what was trained on
    second = example(*command, cwd=tmp_path)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    assert f"resumed from {checkpoint}: step {step}, epoch 0, sample {step * 16} of 240" in out
    assert [int(s) for s in re.findall(r"epoch 0 step (\d+) loss", out)] == list(range(step + 1, 16))
    third = example("--epochs", "2", "--max-steps", "1", "--log-every", "1", "--checkpoint", str(checkpoint),
                    cwd=tmp_path)
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, err[-3000:]
    assert f"resumed from {checkpoint}: step 15, epoch 1, sample 0 of 240" in out  # not "epoch 1, sample 240"
    assert "epoch 1 step 16 loss" in out


def test_hooks_from_the_command_line_are_checkpointed_and_a_resume_with_others_is_refused(tmp_path):
    checkpoint = tmp_path / "ckpt.pt"
    first = example("--sample-hook", "my_transforms:RAND_AUGMENT", "--max-steps", "2", "--checkpoint",
                    str(checkpoint), cwd=tmp_path)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    saved = torch.load(checkpoint, weights_only=True)
    # the name, and a digest of the Compose's transforms and parameters (fastloader.hooks.fingerprint)
    assert re.fullmatch(r"with_global_rng\(my_transforms:RAND_AUGMENT\)#[0-9a-f]{8}",
                        saved["train_loader"]["hooks"]["sample_hook"]), saved["train_loader"]["hooks"]
    second = example("--batch-hook", "my_transforms:brightness", "--max-steps", "1", "--checkpoint", str(checkpoint),
                     cwd=tmp_path)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 2, err[-3000:]
    assert re.search(r"loader state was saved with other hooks \(batch_hook: none then, my_transforms:brightness now; "
                     r"sample_hook: with_global_rng\(my_transforms:RAND_AUGMENT\)#[0-9a-f]{8} then, none now\)", err)
    assert "Traceback" not in err
