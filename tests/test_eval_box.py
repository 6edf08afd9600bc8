"""The DALI backend's eval box, computed on the host: the sizes it is computed from are the ones
DALI decodes to, and the result is torchvision's Resize + CenterCrop."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from conftest import REALPHOTOS, base_config, requires_realphotos  # noqa: E402
from nvidia.dali import fn, pipeline_def, types  # noqa: E402

from dali_loader.sizes import upright_size  # noqa: E402
from fastloader import build_loader  # noqa: E402
from fastloader.imaging.jpeg_header import HEAD_BYTES  # noqa: E402

TORCHVISION_BOUND = 0.005
"""Mean |DALI - torchvision| (normalized units) over the eval images; measured 0.0028 on the real photos."""
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _tiff_exif(orientation: int) -> bytes:
    """A little-endian EXIF block (Pillow writes big-endian) whose Orientation is the second tag."""
    entries = struct.pack("<HHII", 0x010F, 2, 4, 0x61) + struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0)
    return b"Exif\x00\x00II*\x00" + struct.pack("<IH", 8, 2) + entries + b"\x00" * 4


def odd_files(folder) -> list[str]:
    """Stored 64 wide x 48 high, in the layouts a header reader can get wrong."""
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    turned = Image.Exif()
    turned[0x0112] = 6
    files = {f"o{o}.jpg": {"exif": _exif(o)} for o in range(1, 9)}
    files.update({"little_endian_exif.jpg": {"exif": _tiff_exif(5)},
                  "long_comment.jpg": {"exif": turned, "comment": b"x" * (3 * HEAD_BYTES)},
                  "progressive.jpg": {"exif": turned, "progressive": True},
                  "plain.png": {}, "turned.png": {"exif": turned}, "turned.webp": {"exif": turned},
                  "turned.tiff": {"exif": turned}})
    for name, options in files.items():
        image.save(folder / name, **options)
    image.convert("L").save(folder / "grey.jpg", exif=turned)
    image.convert("CMYK").save(folder / "cmyk.jpg", exif=turned)
    return sorted(str(path) for path in folder.iterdir())


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


@pytest.mark.parametrize("adjust", [True, False])
def test_sizes_from_the_header_are_those_dali_decodes_to(tmp_path, adjust):
    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def peek():
        encoded = fn.io.file.read(fn.external_source(name="path", dtype=types.UINT8))
        return fn.peek_image_shape(encoded, adjust_orientation=adjust)

    pipe = peek()
    pipe.build()
    swapped = 0
    for path in odd_files(tmp_path):
        pipe.feed_input("path", [np.frombuffer(path.encode(), dtype=np.uint8)])
        dali = tuple(np.array(pipe.run()[0][0]).tolist()[:2])
        assert upright_size(path, adjust) == dali, path
        swapped += dali == (64, 48)
    assert swapped == (12 if adjust else 0)  # o5-o8, little-endian o5 and seven turned files


def test_a_file_gone_before_its_header_is_read_has_no_size(tmp_path):
    assert upright_size(str(tmp_path / "missing.jpg"), True) is None


def torchvision_eval(path: str, size: int) -> torch.Tensor:
    transform = T.Compose([T.Resize(int(size / 0.875)), T.CenterCrop(size), T.ToTensor(), T.Normalize(MEAN, STD)])
    with Image.open(path) as image:
        return transform(image.convert("RGB"))


def dali_eval(config: dict) -> tuple[torch.Tensor, list[str]]:
    with build_loader({**config, "backend": "dali", "output": {"device": "cpu"}}, "val") as loader:
        assert loader.backend == "dali"
        images = torch.cat([x for x, _ in loader])
        return images, [loader.index.path(i) for i in range(len(loader.index))]


def write_odd_sizes(root) -> dict:
    """val/<class>/*.png of sizes whose boxes round differently; the config that reads them at 64 px."""
    rng = np.random.default_rng(3)
    for i, (w, h) in enumerate([(150, 113), (113, 150), (131, 97), (97, 131), (200, 73), (74, 74), (257, 256)]):
        folder = root / "val" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([x * 255 // w, y * 255 // h, (x * 7 + y * 3) % 256], -1) + rng.integers(0, 30, (h, w, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"i{i}.png")
    return base_config(root, val={"batch_size": 3, "transform": {"size": 64}})


def test_dali_eval_is_torchvisions_resize_and_centre_crop_on_odd_sizes(tmp_path):
    images, paths = dali_eval(write_odd_sizes(tmp_path))
    reference = torch.stack([torchvision_eval(path, 64) for path in paths])
    per_image = (images - reference).abs().mean(dim=(1, 2, 3))
    assert images.shape == (7, 3, 64, 64) and per_image.mean() <= TORCHVISION_BOUND, per_image


@requires_realphotos
def test_dali_eval_is_torchvisions_resize_and_centre_crop_on_the_real_photos():
    config = {"dataset": {"root": str(REALPHOTOS)}, "workers": {"num_workers": 2},
              "val": {"batch_size": 32, "transform": {"size": 224}}}
    images, paths = dali_eval(config)
    reference = torch.stack([torchvision_eval(path, 224) for path in paths])
    per_image = (images - reference).abs().mean(dim=(1, 2, 3))
    assert len(paths) == 100 and per_image.mean() <= TORCHVISION_BOUND, per_image


def test_dali_eval_from_the_cache_is_torchvisions_box_of_the_cached_pixels(tmp_path):
    from fastloader import load_config
    from fastloader.cache import open_split_cache
    from fastloader.cache_write import build_split_cache
    from fastloader.samples import build_index
    config = write_odd_sizes(tmp_path)
    config["dataset"]["cache"] = str(tmp_path / "cache")
    loaded = load_config(config)
    index = build_index(loaded, loaded.split("val"))
    build_split_cache(loaded, loaded.split("val"), index, str(tmp_path / "cache"), 80, workers=0)
    images, _ = dali_eval(config)
    pixels = open_split_cache(loaded, loaded.split("val"), index).pixels
    transform = T.Compose([T.ToPILImage(), T.Resize(73), T.CenterCrop(64), T.ToTensor(), T.Normalize(MEAN, STD)])
    reference = torch.stack([transform(pixels.image(i)) for i in range(len(index))])
    per_image = (images - reference).abs().mean(dim=(1, 2, 3))
    assert images.shape == (7, 3, 64, 64) and per_image.mean() <= TORCHVISION_BOUND, per_image
