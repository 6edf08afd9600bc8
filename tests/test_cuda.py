"""The GPU path, on a CUDA GPU (skipped without one): both backends' output against their CPU path,
whole epochs, the commands and the example as a user runs them there; the DALI GPU flavour's JPEG
pixels against its CPU flavour and the torch backend (docs/semantics.md's bounds), its train graph
with policies and mixing; a second GPU; the torch prefetcher's one side stream; CUDA graph capture
beside the DALI driver thread.

Other files run their device-sensitive tests here too, through `DEVICES` (conftest.py): the folder
of bad input under skip (test_bad_input.py), the uint8 cache (test_cache.py) and resume from a
saved state (test_resume.py).
"""
from __future__ import annotations

import logging
import re
import subprocess
import sys
import time

import pytest
import torch
from conftest import (
    REALPHOTOS,
    REPO,
    base_config,
    env_without,
    requires_cuda,
    requires_realphotos,
    write_numbered_dataset,
)
from test_resume import BACKENDS

from fastloader import build_loader
from fastloader.transfer import to_device

pytestmark = [pytest.mark.cuda, requires_cuda]

CUDA = {"device": "cuda"}


@pytest.mark.parametrize("dtype, channels_last", [("float32", False), ("bfloat16", True)])
def test_cuda_prefetcher_matches_cpu_conversion(textured_root, dtype, channels_last):
    output = {"dtype": dtype, "channels_last": channels_last}
    cpu = build_loader(base_config(textured_root, output={**output, "device": "cpu"}), split="val")
    gpu = build_loader(base_config(textured_root, output={**output, "device": "cuda"},
                                   workers={"num_workers": 2, "pin_memory": True}), split="val")
    assert gpu.device == torch.device("cuda", 0)
    pairs = list(zip(cpu, gpu))
    assert len(pairs) == len(cpu) == len(gpu) == 6  # 24 images, batch 4
    for (x_cpu, y_cpu), (x_gpu, y_gpu) in pairs:
        assert x_gpu.is_cuda and y_gpu.is_cuda and x_gpu.dtype == getattr(torch, dtype)
        assert x_gpu.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert torch.equal(y_cpu, y_gpu.cpu())
        assert torch.allclose(x_cpu.float(), x_gpu.float().cpu(), atol=1e-2)


def _dali_or_skip():
    pytest.importorskip("nvidia.dali", reason="the DALI GPU flavour needs NVIDIA DALI")


@pytest.mark.parametrize("dtype, channels_last", [("float32", False), ("bfloat16", True)])
def test_dali_gpu_flavour_matches_its_cpu_flavour(textured_root, dtype, channels_last):
    _dali_or_skip()
    output = {"dtype": dtype, "channels_last": channels_last}
    cpu = build_loader(base_config(textured_root, backend="dali", output={**output, "device": "cpu"}), "val")
    gpu = build_loader(base_config(textured_root, backend="dali", output={**output, "device": "cuda"}), "val")
    assert (cpu.flavour, gpu.flavour) == ("cpu", "gpu") and gpu.device == torch.device("cuda", 0)
    pairs = list(zip(cpu, gpu))
    assert len(pairs) == len(cpu) == len(gpu) == 6  # 24 images, batch 4
    for (x_cpu, y_cpu), (x_gpu, y_gpu) in pairs:
        assert x_gpu.is_cuda and y_gpu.is_cuda and y_gpu.dtype == torch.int64 and x_gpu.dtype == getattr(torch, dtype)
        assert x_gpu.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert torch.equal(y_cpu, y_gpu.cpu())
        # nvJPEG and libjpeg-turbo may round differently; PNG here decodes identically
        assert (x_cpu.float() - x_gpu.float().cpu()).abs().mean() < 0.02


def test_dali_gpu_flavour_train_contract_and_auto_choice(textured_root, caplog):
    _dali_or_skip()
    import logging
    train = {"batch_size": 5, "transform": {"size": 32, "erase_prob": 0.5}}
    with caplog.at_level(logging.INFO, logger="fastloader"):
        loader = build_loader(base_config(textured_root, backend="auto", output={"device": "auto"}, train=train),
                              "train")
    assert loader.backend == "dali" and loader.flavour == "gpu" and loader.device == torch.device("cuda", 0)
    assert "backend: auto, a CUDA GPU is present and NVIDIA DALI imports" in caplog.text
    torch_loader = build_loader(base_config(textured_root, backend="torch", train={"batch_size": 5}), "train")
    for _ in range(2):
        batches = list(loader)
        assert [tuple(x.shape) for x, _ in batches] == [(5, 3, 32, 32)] * 4  # 24 images, drop_last
        assert torch.equal(torch.cat([y for _, y in batches]).cpu(), torch.cat([y for _, y in torch_loader]))
    for step, _ in enumerate(loader):  # break, then a whole new epoch
        if step == 0:
            break
    assert len(list(loader)) == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_and_eval_epochs_on_the_gpu_deliver_every_sample(tmp_path, backend):
    """Train: full batches of distinct files in a new order each epoch; eval: every file once, in
    index order, with the CPU path's labels. Each image is one colour that names its file."""
    from conftest import identities
    root = write_numbered_dataset(tmp_path / "d", per_class=10)  # 30 images per split
    config = base_config(root, backend=backend, output=CUDA, workers={"num_workers": 2},
                         train={"batch_size": 8}, val={"batch_size": 8})
    with build_loader(config, "train") as train, build_loader(config, "val") as val, \
            build_loader(base_config(root, backend="torch"), "val") as reference:
        assert train.device.type == val.device.type == "cuda"
        orders = []
        for _ in range(2):
            batches = list(train)
            assert [len(y) for _, y in batches] == [8, 8, 8]
            assert all(x.is_cuda and y.is_cuda for x, y in batches)
            colours = [c for x, _ in batches for c in identities(x)]
            assert len(set(colours)) == 24
            orders.append(colours)
        assert orders[0] != orders[1]
        got = [(c, label) for x, y in val for c, label in zip(identities(x), y.tolist())]
        expected = [(c, label) for x, y in reference for c, label in zip(identities(x), y.tolist())]
        assert [label for _, label in got] == [label for _, label in expected] and len(got) == 30
        assert all(max(abs(a - b) for a, b in zip(g, e)) <= 2 for (g, _), (e, _) in zip(got, expected))


def run_command(*args, tmp_path) -> subprocess.CompletedProcess:
    """A command with the machine's GPU visible, as a user on it runs it."""
    environment = env_without("FASTLOADER_BACKEND", "CUDA_VISIBLE_DEVICES")
    environment["FASTLOADER_CACHE_DIR"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, *args], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=480)


def test_bench_and_show_run_on_the_gpu(tmp_path):
    bench = run_command("-m", "fastloader.cli", "bench", "configs/sample.yaml", "--batches", "3",
                        tmp_path=tmp_path)
    assert bench.returncode == 0, bench.stderr
    assert re.search(r"cuda:0 +\S", bench.stdout), bench.stdout
    show = run_command("-m", "fastloader.cli", "show", "configs/sample.yaml", "--out", str(tmp_path / "grid.png"),
                       "--n", "8", tmp_path=tmp_path)
    assert show.returncode == 0, show.stderr
    assert (tmp_path / "grid.png").stat().st_size > 10_000


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_example_trains_and_evaluates_on_the_gpu(tmp_path, backend):
    small = ["--set", "train.transform.size=64", "--set", "val.transform.size=64", "--set", f"backend={backend}"]
    single = run_command("examples/train.py", "configs/sample.yaml", "--epochs", "1", *small, tmp_path=tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]
    assert f"on 1 rank(s), {backend} backend, device cuda:0" in single.stdout
    assert re.search(r"epoch 0 done: loss \d+\.\d+, val accuracy \d\.\d+ on 60 images", single.stdout)
    gpus = torch.cuda.device_count()  # one rank per GPU, as torchrun users launch it
    ddp = run_command("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
                      "examples/train.py", "configs/sample.yaml", "--epochs", "1", *small, tmp_path=tmp_path)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert f"on {gpus} rank(s), {backend} backend, device cuda:0" in ddp.stdout
    assert re.search(r"epoch 0 done: loss \d+\.\d+, val accuracy \d\.\d+ on 60 images", ddp.stdout)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_device_cuda_n_puts_the_batches_on_gpu_n(textured_root, backend, monkeypatch, caplog):
    """The last GPU torch sees (cuda:0 on a one-GPU machine), named as torch users write it; both backends."""
    if backend == "dali":
        _dali_or_skip()
    last = torch.cuda.device_count() - 1
    config = base_config(textured_root, backend=backend, output={"device": f"cuda:{last}"})
    with build_loader(config, "val") as loader:
        assert loader.device == torch.device("cuda", last)
        batches = list(loader)
    assert len(batches) == 6 and all(x.device == y.device == torch.device("cuda", last) for x, y in batches)
    # two ranks on this node (torchrun's variables): both would put their batches on that one GPU, which is logged
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="fastloader"), build_loader(config, "val") as shared:
        assert shared.device == torch.device("cuda", last)
    assert f"output.device: cuda:{last} (<dict>): all 2 ranks of this node put their batches on that one GPU" \
           in caplog.text


# -- the DALI GPU flavour's pixels (docs/semantics.md#pixels) ---------------------------------------

PHOTOS_CONFIG = REPO / "configs" / "imagenette.yaml"
GPU_AGAINST_CPU_FLAVOUR = {"val": 0.035, "train": 0.09}
"""Per image, mean absolute difference in normalized units (docs/semantics.md: nvJPEG with fancy
upsampling against libjpeg-turbo, DALI's 1 level, or 4 for region decodes before nvJPEG 13.3; plus 1
for the two flavours' resize)."""
GPU_AGAINST_TORCH = {"val": 0.19, "train": 0.24}
"""The CPU flavour's 0.15 against the torch backend, plus the above."""


def photo_epoch(split: str, **overrides) -> tuple[torch.Tensor, torch.Tensor]:
    """One epoch of the real photos' split (JPEGs, a quarter of them 4:2:0), on the CPU."""
    overrides = {"dataset.root": str(REALPHOTOS), "workers.num_workers": 4, "train.batch_size": 50,
                 "val.batch_size": 50, **overrides}
    with build_loader(PHOTOS_CONFIG, split=split, overrides=overrides) as loader:
        batches = [(x.float().cpu(), y.cpu()) for x, y in loader]
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


@requires_realphotos
@pytest.mark.parametrize("split", ["val", "train"])
def test_dali_gpu_flavour_decodes_real_jpegs_as_its_cpu_flavour_and_the_torch_backend(split):
    """Eval and train (the same crops and flips: every draw comes from the seeds), per image."""
    _dali_or_skip()
    gpu_x, gpu_y = photo_epoch(split, backend="dali", **{"output.device": "cuda"})
    cpu_x, cpu_y = photo_epoch(split, backend="dali", **{"output.device": "cpu"})
    torch_x, torch_y = photo_epoch(split, backend="torch", **{"output.device": "cpu"})
    assert len(gpu_x) == (100 if split == "val" else 400) and torch.equal(gpu_y, cpu_y) and torch.equal(gpu_y, torch_y)
    against_cpu = (gpu_x - cpu_x).abs().mean(dim=(1, 2, 3))
    against_torch = (gpu_x - torch_x).abs().mean(dim=(1, 2, 3))
    measured = (f"GPU - CPU flavour: mean {against_cpu.mean():.4f}, worst {against_cpu.max():.4f}; "
                f"GPU - torch: mean {against_torch.mean():.4f}, worst {against_torch.max():.4f}")
    print(f"{split}: {measured}")  # the figures docs/semantics.md will quote (pytest -s)
    assert against_cpu.max() <= GPU_AGAINST_CPU_FLAVOUR[split], measured
    assert against_torch.max() <= GPU_AGAINST_TORCH[split], measured


# -- the DALI GPU flavour's train graph: policies, mixing -------------------------------------------

POLICIES = [{"auto_augment": "rand-m9-mstd0.5-inc1"}, {"auto_augment": "original"}, {"auto_augment": "ta_wide"},
            {"color_jitter": [0.4, 0.4, 0.4, 0.1]}]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: str(next(iter(p.values()))))
def test_dali_gpu_flavour_applies_each_policy_as_its_cpu_flavour(textured_root, policy):
    """The same ops on the same samples (PNGs, decoded alike): DALI's GPU kernels of the warps,
    blends and lookups within 3 grey levels per image of its CPU kernels; and the ops did something."""
    _dali_or_skip()
    train = {"batch_size": 6, "transform": {"size": 64, **policy}}
    runs = {}
    for name, device, transform in (("gpu", "cuda", policy), ("cpu", "cpu", policy), ("plain", "cuda", {})):
        config = base_config(textured_root, backend="dali", output={"device": device},
                             train={**train, "transform": {"size": 64, **transform}})
        with build_loader(config, "train") as loader:
            assert loader.flavour == ("gpu" if device == "cuda" else "cpu")
            runs[name] = torch.cat([x.float().cpu() for x, _ in loader])
    per_image = (runs["gpu"] - runs["cpu"]).abs().mean(dim=(1, 2, 3))
    assert len(per_image) == 24 and per_image.max() < 0.05, per_image
    assert (runs["gpu"] - runs["plain"]).abs().mean(dim=(1, 2, 3)).max() > 0.05  # the policy changed images


def test_dali_gpu_flavour_mixes_deits_batches_on_its_driver_as_its_cpu_flavour(tmp_path):
    """DeiT's batch augmentations (mixup 0.8, cutmix 1.0, mode batch: the whole-batch kernels;
    smoothing 0.1; erasing 0.25) finished on the driver thread, on the GPU: the CPU flavour's
    soft targets, and its pixels (one solid colour per image: decoded and resized alike)."""
    _dali_or_skip()
    root = write_numbered_dataset(tmp_path / "d", per_class=8, splits=("train",))
    train = {"batch_size": 8, "label_smoothing": 0.1, "transform": {"size": 32, "erase_prob": 0.25},
             "mixup": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "mode": "batch"}}
    runs = {}
    for device in ("cuda", "cpu"):
        with build_loader(base_config(root, backend="dali", output={"device": device}, train=train), "train") as loader:
            runs[device] = [(x, y) for x, y in loader]
    assert len(runs["cuda"]) == len(runs["cpu"]) == 3
    for (x_gpu, y_gpu), (x_cpu, y_cpu) in zip(runs["cuda"], runs["cpu"]):
        assert x_gpu.is_cuda and y_gpu.is_cuda and y_gpu.shape == (8, 3) and y_gpu.dtype == torch.float32
        assert torch.allclose(y_gpu.cpu(), y_cpu, atol=1e-6)
        assert torch.allclose(x_gpu.cpu(), x_cpu, atol=1e-4)
    one_hot = 1 - 0.1 + 0.1 / 3
    assert any((y.max(dim=1).values < one_hot - 1e-4).any() for _, y in runs["cuda"])  # really mixed


# -- a second GPU -----------------------------------------------------------------------------------

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason=f"needs two CUDA GPUs (torch sees {torch.cuda.device_count()})")


@two_gpus
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loader_on_cuda_1_works_there_and_leaves_the_current_device_alone(textured_root, backend):
    """Batches, the driver's or prefetcher's stream and their events all on cuda:1, while the
    training thread's current device stays cuda:0."""
    if backend == "dali":
        _dali_or_skip()
    train = {"batch_size": 4, "transform": {"size": 32, "erase_prob": 0.5},
             "mixup": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}, "label_smoothing": 0.1}
    config = base_config(textured_root, backend=backend, output={"device": "cuda:1"},
                         workers={"num_workers": 2}, train=train)
    torch.cuda.set_device(0)
    with build_loader(config, "train") as loader, build_loader(config, "val") as val:
        for _ in range(2):
            batches = list(loader) + list(val)
            assert batches and all(x.device == y.device == torch.device("cuda", 1) for x, y in batches)
            assert all(torch.isfinite(x).all() for x, _ in batches)
    assert torch.cuda.current_device() == 0


@two_gpus
def test_bench_simulated_step_keeps_cuda_1_busy_not_the_current_device():
    from fastloader.commands.bench import simulated_step
    torch.cuda.set_device(0)
    step = simulated_step(torch.device("cuda", 1), 50.0)
    started = time.perf_counter()
    step(None)  # sleeps on cuda:1's stream and waits for it; on cuda:0 the wait would return at once
    assert time.perf_counter() - started >= 0.04


# -- the torch backend's CUDA prefetcher, small copies -------------------------------------------


def test_the_torch_prefetcher_keeps_one_side_stream_for_the_loaders_life(textured_root):
    """A new stream each epoch stranded the caching allocator's freed blocks on the old one: the
    memory torch reserves grew each epoch. One stream: flat after the first epochs."""
    config = base_config(textured_root, output={"device": "cuda"}, workers={"num_workers": 2},
                         train={"batch_size": 4, "transform": {"size": 32, "erase_prob": 0.5}})
    with build_loader(config, "train") as loader:
        stream = loader._side_stream
        reserved = []
        for _ in range(6):
            assert len(list(loader)) == 6
            torch.cuda.synchronize()
            reserved.append(torch.cuda.memory_reserved(loader.device))
        assert loader._side_stream is stream
    assert reserved[-1] == reserved[1], reserved


def test_small_host_arrays_reach_the_gpu_intact_and_without_waiting_for_a_busy_stream():
    """fastloader.transfer pins, then copies asynchronously: the call returns while the stream is
    still busy, and the source may be overwritten the moment it returns."""
    source = torch.arange(4096, dtype=torch.int64)
    torch.cuda._sleep(400_000_000)  # some 0.2 s of GPU time ahead of the copy on the current stream
    started = time.perf_counter()
    copy = to_device(source, torch.device("cuda", 0))
    returned = time.perf_counter() - started
    source.fill_(-1)
    assert torch.equal(copy.cpu(), torch.arange(4096)) and returned < 0.05, returned


# -- CUDA graph capture beside the DALI driver thread (docs/performance.md#cuda-graphs-on-the-training-thread)


def test_a_cuda_graph_captured_while_the_dali_driver_runs_with_thread_local_mode(textured_root):
    """The driver thread copies and finishes batches (CUDA calls) while the training thread
    captures; capture_error_mode="thread_local" keeps the capture to the capturing thread."""
    _dali_or_skip()
    config = base_config(textured_root, backend="dali", output={"device": "cuda"},
                         train={"batch_size": 4, "transform": {"size": 32, "erase_prob": 0.5}})
    static_in = torch.zeros(4, 3, 32, 32, device="cuda")
    weight = torch.full((3, 1, 1), 2.0, device="cuda")
    with build_loader(config, "train") as loader:
        batches = iter(loader)
        first, _ = next(batches)  # the driver now runs ahead
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            (static_in * weight).sum(dim=(1, 2, 3))  # warm up on a side stream, as torch.cuda.graph asks
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            static_out = (static_in * weight).sum(dim=(1, 2, 3))
        for images, _ in batches:
            static_in.copy_(images)
            graph.replay()
            assert torch.allclose(static_out, (images * 2).sum(dim=(1, 2, 3)), rtol=1e-4, atol=1e-3)
@pytest.mark.parametrize("failure", ["oom", "queue"])
def test_a_dali_gpu_driver_that_dies_fails_next_at_once(textured_root, monkeypatch, failure):
    """The GPU flavour's driver thread (set-up on its device, copies and finisher on its stream) made
    to die: out of memory in the finisher reaches `next` as itself with the device's memory figures;
    a driver that can hand nothing over fails `next` instead of hanging (test_dali_driver.py: CPU)."""
    _dali_or_skip()
    import queue
    import time
    import types

    from test_dali_driver import MIXING, FailingQueue, raising

    import dali_loader.driver
    from fastloader.device_ops import BatchFinisher
    error = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if failure == "oom":
        monkeypatch.setattr(BatchFinisher, "pixels", raising(error))
    else:
        monkeypatch.setattr(dali_loader.driver, "queue", types.SimpleNamespace(
            Queue=FailingQueue, Empty=queue.Empty, Full=queue.Full))
    loader = build_loader(base_config(textured_root, backend="dali", output=CUDA, train=MIXING), "train")
    assert loader.flavour == "gpu"
    began = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        list(loader)
    assert time.monotonic() - began < 30  # the first batch's start-up (nvJPEG) included
    if failure == "oom":
        assert raised.value is error
        assert re.search(r"ran out of memory \(\d+\.\d GiB free of \d+\.\d GiB on cuda:0, \d+\.\d GiB of it held by "
                         r"torch\)\. Lower train.batch_size", "\n".join(raised.value.__notes__))
    else:
        assert str(raised.value) == "the hand-over queue is broken"


def test_a_dali_gpu_loader_keeps_one_driver_stream_for_its_life(textured_root, monkeypatch):
    """A stream per epoch would strand the caching allocator's blocks on streams no longer used: the
    finisher (on the driver's stream) sees the same side stream in every epoch, never the default."""
    _dali_or_skip()
    from test_dali_driver import MIXING

    from fastloader.device_ops import BatchFinisher
    streams = set()
    pixels = BatchFinisher.pixels

    def recording(self, images, seeds):
        streams.add(torch.cuda.current_stream(images.device).cuda_stream)
        return pixels(self, images, seeds)
    monkeypatch.setattr(BatchFinisher, "pixels", recording)
    loader = build_loader(base_config(textured_root, backend="dali", output=CUDA, train=MIXING), "train")
    for _ in range(3):
        assert len(list(loader)) == 6
    assert len(streams) == 1 and torch.cuda.default_stream(loader.device).cuda_stream not in streams


# -- what the GPU review found untested (issue 42, point 3) -------------------------------------------


@pytest.mark.parametrize("schedule", [{"sizes": [48, 64, 80]},
                                      {"size": 80, "progressive": {"min_size": 48, "start_epoch": 0,
                                                                   "end_epoch": 2}}],
                         ids=["sizes", "progressive"])
def test_dali_gpu_flavour_resizes_each_batch_to_its_size_as_its_cpu_flavour(textured_root, schedule):
    """Size schedules on the GPU graph: `out_size` reaches the resize (and the warps and slices of
    the ops after it) per sample; each batch has its size, the same on both flavours, within the
    3-level bound of the kernels (PNGs, decoded alike)."""
    _dali_or_skip()
    transform = {"size": 64, "auto_augment": "rand-m9-mstd0.5-inc1", **schedule}
    runs = {}
    for device in ("cuda", "cpu"):
        config = base_config(textured_root, backend="dali", output={"device": device},
                             train={"batch_size": 6, "transform": transform})
        with build_loader(config, "train") as loader:
            loader.set_epoch(1)
            runs[device] = [x.float().cpu() for x, _ in loader]
    assert [x.shape for x in runs["cuda"]] == [x.shape for x in runs["cpu"]]  # each batch at its own size
    sides = {x.shape[-1] for x in runs["cuda"]}
    assert sides <= {48, 64, 80} if "sizes" in schedule else all(48 <= side <= 80 for side in sides), sides
    for gpu, cpu in zip(runs["cuda"], runs["cpu"]):
        assert (gpu - cpu).abs().mean(dim=(1, 2, 3)).max() < 0.05


def test_exif_rotated_jpegs_decode_upright_through_the_gpu_region_decode(tmp_path):
    """EXIF orientation 6 through nvJPEG's region decode (train: the crop's region only, where the
    hardware decoder may serve): the colours of the upright picture, as the CPU flavour gives."""
    _dali_or_skip()
    from oddfiles import _exif_rotated
    for label in ("a", "b"):
        (tmp_path / "d" / "train" / label).mkdir(parents=True)
        for k in range(4):
            (tmp_path / "d" / "train" / label / f"{k}.jpg").write_bytes(_exif_rotated())
    runs = {}
    for device in ("cuda", "cpu"):
        config = base_config(tmp_path / "d", backend="dali", output={"device": device},
                             train={"batch_size": 4, "transform": {"size": 32, "scale": [0.2, 0.4], "hflip": 0}})
        with build_loader(config, "train") as loader:
            runs[device] = torch.cat([x.float().cpu() for x, _ in loader])
    assert (runs["cuda"] - runs["cpu"]).abs().mean(dim=(1, 2, 3)).max() < GPU_AGAINST_CPU_FLAVOUR["train"]


@requires_realphotos
def test_dali_gpu_flavour_without_fancy_upsampling_stays_within_its_stated_bound():
    """dali.fancy_upsampling: false (nvJPEG's default, NVIDIA's example's): eval within 0.09 per image
    of the CPU flavour (docs/semantics.md), and the setting is said in the log."""
    _dali_or_skip()
    gpu_x, _ = photo_epoch("val", backend="dali", **{"output.device": "cuda", "dali.fancy_upsampling": False})
    cpu_x, _ = photo_epoch("val", backend="dali", **{"output.device": "cpu"})
    per_image = (gpu_x - cpu_x).abs().mean(dim=(1, 2, 3))
    print(f"fancy_upsampling false, GPU - CPU flavour: mean {per_image.mean():.4f}, worst {per_image.max():.4f}")
    assert per_image.max() <= 0.09


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_hooks_on_the_gpu_give_what_they_give_on_the_cpu(textured_root, backend):
    """The sample hook (DALI: its images to the host for DALI's Python-function operator and back),
    the batch hook on the device (torch: on the prefetcher's side stream; DALI: the driver thread)
    and, on DALI, the graph function on the GPU: the same draws as the CPU path, pixels within its
    bounds."""
    if backend == "dali":
        _dali_or_skip()
    transform = {"size": 32, "sample_hook": "user_hooks:stamp", "batch_hook": "user_hooks:batch_stamp"}
    # DALI: every image flipped upside down by the graph function, after the sample hook: its row is the last
    dali = {"graph_hook": "user_hooks:graph_flip", "graph_hook_args": {"every": 1}} if backend == "dali" else {}
    row = -1 if backend == "dali" else 0
    config = base_config(textured_root, backend=backend, val={"batch_size": 4, "transform": transform}, dali=dali)
    cpu = build_loader(config, "val")
    gpu = build_loader({**config, "output": {"device": "cuda"}}, "val")
    pairs = list(zip(cpu, gpu))
    assert len(pairs) == len(cpu) == 6
    for (x_cpu, _), (x_gpu, _) in pairs:
        assert x_gpu.is_cuda
        # the batch hook's stamp, the seeds: (seed % 251) / 251, divided on each device (the last bit may differ)
        assert torch.allclose(x_cpu[:, :, 0, 0], x_gpu[:, :, 0, 0].cpu(), rtol=0, atol=1e-6)
        assert torch.allclose(x_cpu[:, :, row, 1:], x_gpu[:, :, row, 1:].cpu(), atol=1e-5)  # the sample hook's row
        assert (x_cpu.float() - x_gpu.float().cpu()).abs().mean() < 0.02


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_on_the_gpu_give_what_they_give_on_the_cpu(textured_root, backend):
    """Device: CUDA. train.views on the GPU (DALI: one whole decode by nvJPEG, a slice and resize
    per view on the GPU; torch: the groups' uint8 tensors normalized and erased on the side stream):
    each group crop-major on the device, the labels and shapes the CPU path's, the pixels within
    the train bounds, and in channels_last bfloat16 too."""
    if backend == "dali":
        _dali_or_skip()
    views = [{"count": 2, "size": 32, "scale": [0.4, 1.0]},
             {"count": 3, "size": 16, "scale": [0.05, 0.4], "gaussian_blur_prob": 0.5, "solarize_prob": 0.5,
              "erase_prob": 0.5}]
    train = {"batch_size": 4, "views": views,
             "transform": {"size": 32, "color_jitter": [0.4, 0.4, 0.2, 0.1], "color_jitter_prob": 0.8}}
    config = base_config(textured_root, backend=backend, train=train)
    for output in ({"device": "cuda"}, {"device": "cuda", "dtype": "bfloat16", "channels_last": True}):
        cpu, gpu = build_loader(config, "train"), build_loader({**config, "output": output}, "train")
        pairs = list(zip(cpu, gpu))
        assert len(pairs) == len(cpu) > 0
        for (x_cpu, y_cpu), (x_gpu, y_gpu) in pairs:
            assert torch.equal(y_cpu, y_gpu.cpu())
            for a, b in zip(x_cpu, x_gpu):
                assert b.is_cuda and a.shape == b.shape
                per_image = (a - b.float().cpu()).abs().mean(dim=(1, 2, 3))
                assert per_image.mean() < 0.05 and per_image.max() < 0.2, per_image
