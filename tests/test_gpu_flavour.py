"""What the DALI backend's GPU flavour is built with, checked without a GPU: its decoders' arguments
against DALI's operator schemas, and nvJPEG's memory (DALI's documented rule: per DALI thread, one
device buffer of device_memory_padding and two pinned buffers of host_memory_padding) against
NVIDIA's ResNet-50 example at the same threads. The GPU run of these: test_cuda.py."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

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

    from dali_loader.pipeline import decode_plan, decoder_words
    from fastloader import build_loader, load_config

    root = write_numbered_dataset(tmp_path / "d", per_class=2, splits=("val",))
    caplog.set_level(logging.INFO, logger="fastloader")
    with build_loader(base_config(root, backend="dali"), "val"):
        pass
    assert "split 'val': DALI decodes with DALI's CPU decoder (libjpeg-turbo" in caplog.text
    config = load_config(base_config(root, dali={"fancy_upsampling": False, "hw_decoder_load": 0.5}))
    words = decoder_words(config.dali.hw_decoder_load, True, decode_plan(False, True, True, (13, 3, 2)), train=True)
    assert "hardware JPEG decoder for 50% of each batch" in words and "preallocated for the whole batch" in words
    assert "subsampled chroma repeated (nvJPEG's default); each crop's region decoded (dali.fancy_upsampling: " \
           "false)" in words
    words = decoder_words(config.dali.hw_decoder_load, True, decode_plan("auto", True, True, (12, 4, 0)), train=True)
    assert "nvJPEG 12.4.0 decodes no region of a subsampled JPEG with interpolated chroma on the GPU" in words
    assert "counted in loader.stats" in words


# -- the decode plan: every baseline JPEG stays on nvJPEG (issue 55) --------------------------------

OLD, NEW = (12, 4, 0), (13, 3, 2)
"""nvidia-dali-cuda120's nvJPEG and nvidia-dali-cuda130's."""


@pytest.mark.parametrize("nvjpeg", [OLD, NEW, None])
@pytest.mark.parametrize("setting", ["auto", True, False])
@pytest.mark.parametrize("train", [True, False])
def test_no_plan_asks_a_region_with_interpolated_chroma_of_an_nvjpeg_that_leaves_it_to_the_cpu(nvjpeg, setting, train):
    """nvImageCodec refuses a region decode of a subsampled JPEG with interpolated chroma below
    nvJPEG 13.2 (its enable_roi_fancy_upsampling), on both GPU decoders: DALI then decodes it on
    the CPU, silently. No setting may ask for that."""
    from dali_loader.pipeline import decode_plan
    from dali_loader.stack import region_fancy_on_gpu

    plan = decode_plan(setting, True, train, nvjpeg)
    assert not (plan.region and plan.fancy and not region_fancy_on_gpu(nvjpeg)), plan
    assert plan.region == (train and (setting != True or region_fancy_on_gpu(nvjpeg)))  # noqa: E712
    assert plan.fancy == (setting is True or (setting == "auto" and (not train or region_fancy_on_gpu(nvjpeg))))
    cpu = decode_plan(setting, False, train, None)
    assert cpu.fancy and cpu.region == train  # the CPU flavour: libjpeg-turbo's pixels, regions for train


def test_the_nvjpeg_version_is_read_from_the_bound_library_without_a_gpu():
    """The nvJPEG DALI's decoders bind in this process, by its own nvjpegGetProperty: the one a
    by-soname open gets (which copy depends on what this test process imported first:
    test_nvjpeg_binding.py checks each order in a fresh process). Where the DALI installed is the one
    pyproject.toml asks for (a fresh set-up, CI), it is torch's CUDA major, and the nvidia-nvjpeg
    wheel beside it is 13.2 or later, so the stack check says nothing."""
    import importlib.metadata
    import re

    from conftest import REPO

    from dali_loader.stack import dali_cuda_major, nvjpeg_version, region_fancy_on_gpu, stack_problem
    from fastloader.cuda_install import torch_cuda_major
    from fastloader.cuda_libraries import bound_nvjpeg, file_version, wheel_nvjpegs

    major = dali_cuda_major()
    version = nvjpeg_version(major)
    assert major in (12, 13) and version is not None and version[0] == major, (major, version)
    assert bound_nvjpeg(major).version == version  # what a by-soname open gets, not a file's
    wanted = re.search(r'"(nvidia-dali-cuda\d+)>=', (REPO / "pyproject.toml").read_text()).group(1)
    try:
        importlib.metadata.version(wanted)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"the DALI installed here is not pyproject.toml's {wanted}")
    assert wanted == "nvidia-dali-cuda130" and major == 13
    wheel = file_version(wheel_nvjpegs()[major])
    assert region_fancy_on_gpu(wheel), wheel  # nvJPEG 13.3: 4:2:0 regions interpolated on the GPU
    if torch_cuda_major() is not None:
        assert stack_problem(major, torch_cuda_major()) is None, stack_problem(major, torch_cuda_major())


def test_a_dali_of_another_cuda_major_than_torchs_is_named_with_the_fix():
    from dali_loader.stack import stack_problem

    words = stack_problem(12, 13)
    assert "NVIDIA DALI is built for CUDA 12 and torch for CUDA 13" in words
    assert "pip uninstall -y nvidia-dali-cuda120 && pip install nvidia-dali-cuda130" in words
    assert stack_problem(13, 13) is None and stack_problem(12, None) is None


def inputs_of(spec: str) -> list[str]:
    """The inputs of an operator's spec text, argument inputs too (a per-sample `mirror`, a resize's roi)."""
    return spec.split("Inputs:", 1)[1].split("Outputs:", 1)[0].split()


def graph_ops(pipe) -> list[tuple[str, str, str]]:
    """(operator schema, device, its spec as text) of each operator of a pipeline's Python graph,
    defined but not built: what the GPU flavour asks of DALI, read without a GPU (DALI 2.4's
    Pipeline._build_graph and OpSpec's text)."""
    pipe._build_graph()
    ops = []
    for op in pipe._ops:
        text = str(op.spec)
        schema = text.split("OpSpec for ", 1)[1].split(":", 1)[0]
        device = text.split("device: ", 1)[1].split("\n", 1)[0].strip()
        ops.append((schema, device, text))
    return ops


def gpu_graph(tmp_path, split: str = "train", nvjpeg=NEW, **transform):
    """The GPU flavour's graph of a split, as the loader defines it for `nvjpeg`, defined on a machine
    without a GPU."""
    from conftest import base_config, write_numbered_dataset

    from dali_loader.loader import graph_spec
    from dali_loader.pipeline import decode_plan, define_pipeline
    from dali_loader.user_ops import NO_USER_OPS
    from fastloader import load_config
    from fastloader.draws import Augmenter

    root = write_numbered_dataset(tmp_path / "g", per_class=1)
    dali = transform.pop("dali", {})
    config = load_config(base_config(root, backend="dali", train={"transform": {"size": 32, **transform}}, dali=dali))
    section = config.split(split)
    augmenter = Augmenter(section.transform, config.normalize.mean) if split == "train" else None
    plan = decode_plan(config.dali.fancy_upsampling, True, split == "train", nvjpeg)
    pipe = define_pipeline(graph_spec(config, section), lambda: None, device_id=0, batch_size=4, num_threads=2,
                           prefetch_queue_depth=2, seed=1, augmenter=augmenter, user=NO_USER_OPS, plan=plan)
    return graph_ops(pipe)


@pytest.mark.parametrize("nvjpeg", [OLD, NEW])
@pytest.mark.parametrize("setting", ["auto", True, False])
def test_the_gpu_flavours_train_graph_asks_nvjpeg_only_for_what_it_decodes_on_the_gpu(tmp_path, nvjpeg, setting):
    ops = gpu_graph(tmp_path, nvjpeg=nvjpeg, dali={"fancy_upsampling": setting})
    decoders = [(schema, device, text) for schema, device, text in ops if schema.startswith("decoders__")]
    assert len(decoders) == 1 and decoders[0][1] == "mixed", decoders  # nvJPEG: DALI's mixed operator
    schema, _, text = decoders[0]
    fancy = "jpeg_fancy_upsampling: True" in text
    if schema == "decoders__ImageSlice":
        assert not fancy or nvjpeg >= (13, 2), text
    else:  # a whole image: the crop is the resize's region of interest
        assert schema == "decoders__Image" and fancy and setting is True and nvjpeg < (13, 2), text
        resize = next(text for schema, _, text in ops if schema == "Resize")
        assert "roi_relative: False" in resize and len(inputs_of(resize)) == 3, resize  # images, roi_start, roi_end
    assert fancy == (setting is True or (setting == "auto" and nvjpeg >= (13, 2)))


def test_the_val_graph_interpolates_chroma_on_every_nvjpeg(tmp_path):
    for nvjpeg in (OLD, NEW):
        decoder = next(text for schema, _, text in gpu_graph(tmp_path / str(nvjpeg[0]), "val", nvjpeg=nvjpeg)
                       if schema.startswith("decoders__"))
        assert "OpSpec for decoders__Image:" in decoder and "jpeg_fancy_upsampling: True" in decoder


def test_the_horizontal_flip_is_the_normalizes_mirror_where_nothing_comes_between(tmp_path):
    """As in NVIDIA's example: no Flip operator (one kernel a sample) where the split only flips
    horizontally and has no ops; a vertical flip or ops keep it, in their order."""
    plain = [schema for schema, _, _ in gpu_graph(tmp_path / "a")]
    assert "Flip" not in plain and "CropMirrorNormalize" in plain
    cmn = next(text for schema, _, text in gpu_graph(tmp_path / "b") if schema == "CropMirrorNormalize")
    assert len(inputs_of(cmn)) == 2, cmn  # the images, and the per-sample hflip as `mirror`
    assert "Flip" in [schema for schema, _, _ in gpu_graph(tmp_path / "c", vflip=0.5)]
    assert "Flip" in [schema for schema, _, _ in gpu_graph(tmp_path / "d", auto_augment="rand-m9-n2")]
    unflipped = [(schema, text) for schema, _, text in gpu_graph(tmp_path / "e", hflip=0.0)]
    assert "Flip" not in [schema for schema, _ in unflipped]
    assert len(inputs_of(next(text for schema, text in unflipped if schema == "CropMirrorNormalize"))) == 1


# -- the same choices with devices switched: the CPU flavour runs them (pixels) ----------------------

def subsampled_jpegs(root, per_class: int = 6):
    """train/<class>/*.jpg: noisy gradients saved as 4:2:0 JPEGs (ImageNet's layout), at odd sizes."""
    from PIL import Image

    rng = np.random.default_rng(3)
    for c, name in enumerate(("a", "b")):
        folder = root / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = 90 + 17 * i, 70 + 11 * i
            y, x = np.mgrid[0:h, 0:w]
            base = np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 90 * c)], axis=-1)
            pixels = np.clip(base + rng.integers(0, 60, size=(h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"j_{i}.jpg", quality=90, subsampling=2)
    return root


def train_epoch(config: dict, monkeypatch=None, plan=None) -> torch.Tensor:
    from fastloader import build_loader

    if plan is not None:  # the loader's own choice replaced by the plan a GPU with that nvJPEG gets
        monkeypatch.setattr("dali_loader.loader.decode_plan", lambda *args: plan)
    with build_loader(config, "train") as loader:
        return torch.cat([images for images, _ in loader])


def test_a_whole_image_decode_with_the_crop_in_the_resize_gives_the_regions_pixels(tmp_path, monkeypatch):
    """dali.fancy_upsampling: true on an nvJPEG below 13.2 decodes whole images and resizes the
    crop's box (no slice): the same graph on the CPU flavour gives the region decode's pixels but
    at the crop's edges, where the resize's filter may read the pixels beyond it (docs/semantics.md:
    within 0.005 per image, 0.0013 measured)."""
    from conftest import base_config

    from dali_loader.pipeline import DecodePlan

    root = subsampled_jpegs(tmp_path / "j")
    config = base_config(root, backend="dali", train={"batch_size": 4, "transform": {"size": 48, "scale": [0.2, 1.0]}})
    regions = train_epoch(config)
    whole = train_epoch(config, monkeypatch, DecodePlan(True, False, "a whole-image plan, as on nvJPEG 12"))
    per_image = (regions - whole).abs().mean(dim=(1, 2, 3))
    assert len(per_image) == 12 and per_image.max() < 0.005, per_image
    assert per_image.max() > 0  # two paths, not one taken twice
    torch_backend = train_epoch({**config, "backend": "torch"})
    assert (torch_backend - whole).abs().mean(dim=(1, 2, 3)).max() < 0.15  # the backends' train bound


def test_the_mirror_in_the_normalize_flips_exactly(tmp_path):
    """Crops do not depend on the flip's probability (fastloader.augment draws them apart): a split
    that always flips gives, through crop_mirror_normalize's mirror, exactly the mirror image of one
    that never does."""
    from conftest import base_config

    root = subsampled_jpegs(tmp_path / "m", per_class=3)
    never, always = (train_epoch(base_config(root, backend="dali", train={"batch_size": 3, "transform": {
        "size": 40, "hflip": p}})) for p in (0.0, 1.0))
    assert torch.equal(always, never.flip(-1))


def kinds_of_jpegs(root, per_class: int = 4):
    """subsampled_jpegs (4:2:0) plus, in class a, real JPEGs of each other kind Pillow writes: 4:2:2,
    4:4:4, progressive 4:2:0, greyscale; and 3 PNG files. -> {file name: (chroma sampling, coding)}."""
    from PIL import Image

    root = subsampled_jpegs(root, per_class=per_class)
    source = Image.open(root / "train" / "b" / "j_0.jpg")
    folder = root / "train" / "a"
    source.save(folder / "s422.jpg", subsampling=1, quality=90)
    source.save(folder / "s444.jpg", subsampling=0, quality=90)
    source.save(folder / "prog.jpg", progressive=True, subsampling=2, quality=90)
    source.convert("L").save(folder / "grey.jpg", quality=90)
    for i in range(3):
        Image.new("RGB", (50, 40), (10 * i, 90, 200)).save(folder / f"p_{i}.png")
    return root


@pytest.mark.parametrize("nvjpeg", [(13, 0, 1), NEW])
def test_what_the_gpu_flavour_decodes_on_the_cpu_is_counted_jpeg_by_jpeg_and_said_once(tmp_path, caplog, nvjpeg):
    """The GPU flavour's decoders leave PNG files, and (below nvJPEG 13.2) regions of subsampled JPEGs
    with interpolated chroma, to DALI's CPU decoder: counted in loader.stats per epoch and reason, said
    once, read on the driver thread or by the feed's worker processes (whole columns), JPEG by JPEG as
    the rule sends them (4:2:0, 4:2:2 and progressive 4:2:0 below 13.2; never 4:4:4, grey, or a whole
    image). The count is the feed's, so the CPU flavour's feed, told it feeds the GPU decoders of a
    plan and nvJPEG (stack.GpuDecoding), counts as the GPU flavour's does."""
    from conftest import base_config

    from dali_loader.stack import GpuDecoding
    from fastloader import build_loader

    root = kinds_of_jpegs(tmp_path / "c")
    caplog.set_level(logging.WARNING, logger="fastloader")
    old = nvjpeg < (13, 2)
    for processes, region in ((0, True), (2, True), (2, False)):
        caplog.clear()
        config = base_config(root, backend="dali", train={"batch_size": 5, "transform": {"size": 32}},
                             dali={"feed_processes": processes})
        with build_loader(config, "train") as loader:
            loader._reader.gpu = GpuDecoding(region, True, nvjpeg)
            for epoch in range(2):
                assert sum(len(labels) for _, labels in loader) == 15
                expected = {"PNG files": 3}
                if old and region:  # 4 + 4 subsampled_jpegs and prog.jpg at 4:2:0, s422.jpg at 4:2:2
                    expected |= {"regions of 4:2:0 JPEGs with interpolated chroma": 9,
                                 "regions of 4:2:2 JPEGs with interpolated chroma": 1}
                assert loader.stats.cpu_decoded == expected, (processes, region)
        said = [r.message for r in caplog.records if "on the CPU, not with nvJPEG" in r.message]
        assert len(said) == len(expected), said
        assert any("split 'train': DALI decodes PNG files on the CPU, not with nvJPEG" in m for m in said)
        assert f"{sum(expected.values())} decoded on the CPU, not with nvJPEG" in loader.stats.summary()


@pytest.mark.parametrize("nvjpeg", [(13, 0, 1), (13, 1, 9), (13, 2, 0), NEW, None])
def test_the_cpu_decode_rule_reads_the_jpegs_sampling_and_coding_from_screening(tmp_path, nvjpeg):
    """nvImageCodec's rule applied to real JPEGs as screening reads them: a region with interpolated
    chroma of a 4:2:0, 4:2:2 or 4:4:0 JPEG (baseline or progressive) goes to the CPU below nvJPEG 13.2
    (an unknown version counts as below); 4:4:4 and grey never; nor a whole image, nor plain chroma."""
    import io

    from PIL import Image

    from dali_loader.stack import GpuDecoding, cpu_decode_reason
    from fastloader.decoding.screen import screen_read

    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 56, 3), dtype=np.uint8))

    def screened(**options):
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", **options)
        return screen_read("x.jpg", buffer.getvalue())

    kinds = {"4:2:0": screened(subsampling=2), "4:2:2": screened(subsampling=1), "4:4:4": screened(subsampling=0),
             "progressive 4:2:0": screened(subsampling=2, progressive=True), "grey": None}
    grey = io.BytesIO()
    image.convert("L").save(grey, "JPEG")
    kinds["grey"] = screen_read("g.jpg", grey.getvalue())
    tall = io.BytesIO()  # 4:4:0: luma sampled twice vertically (Pillow writes no such JPEG): the frame patched
    image.save(tall, "JPEG", subsampling=0)
    kinds["4:4:0"] = screen_read("t.jpg", tall.getvalue().replace(b"\x01\x11", b"\x01\x12", 1))
    codings = {name: (s.sampling, s.coding) for name, s in kinds.items()}
    assert codings == {"4:2:0": ("4:2:0", 0xC0), "4:2:2": ("4:2:2", 0xC0), "4:4:4": ("4:4:4", 0xC0),
                       "progressive 4:2:0": ("4:2:0", 0xC2), "grey": ("grey", 0xC0), "4:4:0": ("4:4:0", 0xC0)}
    old = nvjpeg is None or nvjpeg < (13, 2)
    for name, s in kinds.items():
        for region, fancy in ((True, True), (True, False), (False, True)):
            reason = cpu_decode_reason("JPEG", s.coding, s.sampling, GpuDecoding(region, fancy, nvjpeg))
            refused = old and region and fancy and s.sampling not in ("4:4:4", "grey")
            assert reason == (f"regions of {s.sampling} JPEGs with interpolated chroma" if refused else None), name


# -- views: a group's ops on its views at once (dali_loader/view_ops.py; issue 58) ------------------

def gpu_views_graph(tmp_path, local_views: int, stacked: bool = True, **keys):
    """The GPU flavour's graph of DINOv2's views (2 x 32 px with their own blur and solarize, then
    `local_views` x 16 px), DINOv2's colour ops, the groups' ops stacked or not; defined, not built."""
    from conftest import base_config, write_numbered_dataset

    from dali_loader.loader import graph_spec
    from dali_loader.pipeline import decode_plan, define_pipeline
    from dali_loader.user_ops import NO_USER_OPS
    from fastloader import load_config
    from fastloader.draws import Augmenter
    from fastloader.views import ViewPlan

    root = write_numbered_dataset(tmp_path / "v", per_class=1)
    transform = {"size": 32, "color_jitter": [0.4, 0.4, 0.2, 0.1], "color_jitter_prob": 0.8, "grayscale_prob": 0.2,
                 **keys}
    views = [{"name": "global1", "count": 1, "size": 32, "gaussian_blur_prob": 1.0},
             {"name": "global2", "count": 1, "size": 32, "gaussian_blur_prob": 0.1, "solarize_prob": 0.2},
             {"name": "local", "count": local_views, "size": 16, "scale": [0.05, 0.3], "gaussian_blur_prob": 0.5}]
    config = load_config(base_config(root, backend="dali", train={"transform": transform, "views": views,
                                                                   "view_ops": "stacked" if stacked else "per_view"}))
    section = config.split("train")
    plan, augmenter = ViewPlan(section, config.normalize.mean), Augmenter(section.transform, config.normalize.mean)
    pipe = define_pipeline(graph_spec(config, section, plan), lambda: None, device_id=0, batch_size=4,
                           num_threads=2, prefetch_queue_depth=2, seed=1, augmenter=augmenter, user=NO_USER_OPS,
                           plan=decode_plan("auto", True, True, NEW), views=plan)
    return graph_ops(pipe)


def test_a_view_groups_views_share_each_photometric_operator(tmp_path):
    """DINOv2's ten views: each group's colour jitter slots (4), grey, blur and solarize are one
    operator each for all the group's views, on the GPU, with per-frame parameters; no auto_aug
    branches. Two local views or eight: the same operators, one slice and resize per view."""
    counts = {}
    for local in (2, 8):
        ops = gpu_views_graph(tmp_path / str(local), local)
        schemas = [schema for schema, _, _ in ops]
        counts[local] = {name: schemas.count(name) for name in ("Hsv", "GaussianBlur", "Resize", "Slice", "Stack")}
        photometric = [(schema, device) for schema, device, _ in ops if schema in ("Hsv", "GaussianBlur")]
        assert all(device == "gpu" for _, device in photometric), photometric
        assert not [schema for schema in schemas if "Split" in schema or "Merge" in schema or "Select" in schema]
        hsv = next(text for schema, _, text in ops if schema == "Hsv")
        assert len(inputs_of(hsv)) == 4, hsv  # the frames, and hue, saturation and value per frame
    # per group: 4 jitter slots + grey as Hsv; one blur (three groups blur); a stack per group
    assert counts[8]["Hsv"] == counts[2]["Hsv"] == 3 * 5
    assert counts[8]["GaussianBlur"] == counts[2]["GaussianBlur"] == 3 and counts[8]["Stack"] == 3
    assert counts[8]["Resize"] - counts[2]["Resize"] == 6 == counts[8]["Slice"] - counts[2]["Slice"]
    apart = gpu_views_graph(tmp_path / "apart", 8, stacked=False)  # view by view: each slot's branches per view
    assert sum(device == "gpu" for _, device, _ in apart) > 3 * sum(device == "gpu" for _, device, _ in ops)


def test_a_group_whose_policy_can_rotate_keeps_its_views_apart(tmp_path):
    """A rotation does not commute with the flips and has no per-frame operator: such a group's
    views each go through auto_aug's branches, as a single crop's."""
    schemas = [schema for schema, _, _ in gpu_views_graph(tmp_path, 2, auto_augment="rand-m9-n2")]
    assert "Hsv" not in schemas and "Stack" not in schemas and "Flip" in schemas
