"""What the DALI backend's GPU flavour is built with, checked without a GPU: its decoders' arguments
against DALI's operator schemas, and nvJPEG's memory (DALI's documented rule: per DALI thread, one
device buffer of device_memory_padding and two pinned buffers of host_memory_padding) against
NVIDIA's ResNet-50 example at the same threads. The GPU run of these: test_cuda.py."""
from __future__ import annotations

import logging

import pytest

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from nvidia.dali import backend  # noqa: E402

from dali_loader.pipeline import (  # noqa: E402
    DALI_DEVICE_PADDING,
    DALI_HOST_PADDING,
    NVIDIA_DEVICE_PADDING,
    NVIDIA_HOST_PADDING,
    NVIDIA_THREADS,
    decoder_options,
)

DECODERS = {True: "decoders__ImageSlice", False: "decoders__Image"}
"""The decoder of each mode (train: the crop's region, eval: the whole image)."""


def footprint(threads: int, train_options: dict, eval_options: dict) -> tuple[int, int]:
    """(device, pinned) bytes nvJPEG preallocates for a rank's train and val pipelines, by DALI's rule."""
    device = threads * (train_options["device_memory_padding"] + eval_options["device_memory_padding"])
    pinned = 2 * threads * (train_options["host_memory_padding"] + eval_options["host_memory_padding"])
    return device, pinned


def nvidia(threads: int) -> tuple[int, int]:
    """NVIDIA's example: its train decoder padded for ImageNet's largest image, its val at DALI's defaults."""
    return footprint(threads, {"device_memory_padding": NVIDIA_DEVICE_PADDING,
                               "host_memory_padding": NVIDIA_HOST_PADDING},
                     {"device_memory_padding": DALI_DEVICE_PADDING, "host_memory_padding": DALI_HOST_PADDING})


@pytest.mark.parametrize("threads", [1, 2, 4, 5, 8, 12, 16, 32, 64])
def test_nvjpeg_memory_per_rank_is_at_most_nvidias_at_the_same_threads(threads):
    ours = footprint(threads, decoder_options(True, 0.65, threads, train=True),
                     decoder_options(True, 0.65, threads, train=False))
    assert ours[0] <= nvidia(threads)[0] and ours[1] <= nvidia(threads)[1]
    if threads <= NVIDIA_THREADS:
        assert ours == nvidia(threads)  # the same hints per thread as NVIDIA's example
    else:  # the train decoder's padding stays what NVIDIA's has at 4 threads, whatever the threads
        train = decoder_options(True, 0.65, threads, train=True)
        assert abs(threads * train["device_memory_padding"] - NVIDIA_THREADS * NVIDIA_DEVICE_PADDING) < threads
        assert abs(threads * train["host_memory_padding"] - NVIDIA_THREADS * NVIDIA_HOST_PADDING) < threads
    # 16 threads per rank on an 8-GPU node: at most 1.1 GiB device per GPU and 11 GiB pinned per node
    if threads == 16:
        assert ours[0] < 1.1 * 2 ** 30 and 8 * ours[1] < 11 * 2 ** 30, ours


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("gpu", [True, False])
def test_every_decoder_argument_is_one_the_decoders_schema_takes(gpu, train):
    """A misspelt or removed argument would only fail when a GPU builds the pipeline."""
    schema = backend.GetSchema(DECODERS[train])
    options = decoder_options(gpu, 0.65, 16, train=train)
    assert all(schema.HasArgument(name) for name in options if name != "device"), options
    assert options["jpeg_fancy_upsampling"] is True  # nvJPEG upsamples 4:2:0 chroma as libjpeg-turbo does
    assert options["device"] == ("mixed" if gpu else "cpu")


def test_fancy_upsampling_is_a_choice_for_the_gpu_decoders_and_the_cpu_always_interpolates():
    """dali.fancy_upsampling (issue 42): false asks nvJPEG's default of the GPU decoders; the CPU
    decoder interpolates whatever the key says, as DALI's imgcodec decoder does."""
    assert decoder_options(True, 0.65, 4, train=True, fancy_upsampling=False)["jpeg_fancy_upsampling"] is False
    assert decoder_options(True, 0.65, 4, train=False, fancy_upsampling=True)["jpeg_fancy_upsampling"] is True
    assert decoder_options(False, 0.65, 4, train=True, fancy_upsampling=False)["jpeg_fancy_upsampling"] is True


def test_the_loader_says_which_decoders_dali_uses(tmp_path, caplog):
    from conftest import base_config, write_numbered_dataset

    from dali_loader.pipeline import decoder_words
    from fastloader import build_loader, load_config

    root = write_numbered_dataset(tmp_path / "d", per_class=2, splits=("val",))
    caplog.set_level(logging.INFO, logger="fastloader")
    with build_loader(base_config(root, backend="dali"), "val"):
        pass
    assert "split 'val': DALI decodes with DALI's CPU decoder (libjpeg-turbo" in caplog.text
    config = load_config(base_config(root, dali={"fancy_upsampling": False, "hw_decoder_load": 0.5}))
    words = decoder_words(config, gpu=True)
    assert "hardware JPEG decoder for 50% of each batch" in words and "preallocated for the whole batch" in words
    assert "chroma repeated, nvJPEG's default (dali.fancy_upsampling: false" in words
