"""File -> upright RGB uint8 pixels (HWC tensor), decoding as few pixels as the crop allows.

The header is read first so that the caller can choose its crop from the image size: a JPEG's
markers are walked over the bytes already read (fastloader/imaging/jpeg_header.py), and Pillow reads
every other file and every JPEG the walk is not sure of. Then, per image, the cheapest decoder that
gives today's pixels:
- a JPEG whose crop is at least twice the output: Pillow's `draft` (libjpeg-turbo shrinks by 2/4/8 in
  the DCT domain);
- any other RGB or greyscale JPEG: nvImageCodec's CPU backend (libjpeg-turbo) decodes only the crop's
  region, pixel for pixel what decoding the whole file and cropping gives (tests/test_decode.py checks
  it), in 0.78x the time of a whole-file decode on random-resized crops (docs/performance.md);
- a whole file (FASTLOADER_JPEG_DECODER=whole, or a region nvImageCodec refuses): nvImageCodec decodes
  all of it, the pixels of torchvision's `decode_jpeg` (500 of 500 real photos identical, at its speed:
  docs/performance.md); torchvision 0.29 deprecates its decoders, so torchcodec, then decode_jpeg,
  serve only where nvImageCodec is absent;
- everything else stays with Pillow: CMYK/YCCK JPEGs, EXIF-rotated photos, PNG, WEBP, GIF, BMP, TIFF,
  16-bit and palette images, and JPEGs the faster decoders refuse (Pillow says why).

FASTLOADER_JPEG_DECODER (auto | whole | pillow; decode_jpeg is an old name of whole) narrows the
choice, to compare decoders or to rule one out; `describe()` says what this process uses (the
loader's log, `fastloader check`).
"""
from __future__ import annotations

import dataclasses
import functools
import io
import logging
import math
import os
import warnings
from typing import Callable, NamedTuple

import numpy as np
import torch
from PIL import Image, ImageOps

from fastloader.decoding.screen import Screened, bomb_problem, decode_file, native_words
from fastloader.errors import ConfigError
from fastloader.imaging.jpeg_header import ORIENTATION, JpegHeader, read_header
from fastloader.locations import Location, as_location
from fastloader.schema import BOMB_PIXELS
from fastloader.sources.reading import read_bytes

from ..imaging.geometry import Crop
from ..imaging.rgb import to_rgb

log = logging.getLogger("fastloader")
_TURNED = frozenset({2, 3, 4, 5, 6, 7, 8})
"""EXIF orientations other than upright: Pillow turns those images before the crop is chosen."""
# torchvision 0.29 deprecates its decoders in favour of TorchCodec and warns on every call; we pick
# the available one below and say so once, rather than once per image.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)

DECODER_ENV = "FASTLOADER_JPEG_DECODER"
DECODER_CHOICES = {
    "auto": "nvImageCodec region decode, else the whole file, else Pillow",
    "whole": "the whole file (nvImageCodec, else torchcodec, else torchvision's decode_jpeg; no region decode), "
             "else Pillow",
    "pillow": "Pillow only",
}
_ALIASES = {"decode_jpeg": "whole"}
"""Old names of a choice, still taken."""
REGION, DRAFT, WHOLE, PILLOW = "nvImageCodec region", "Pillow draft", "whole file", "Pillow"
"""How one image was decoded (`Decoded.decoder`)."""


class Decoded(NamedTuple):
    pixels: torch.Tensor
    """uint8 [H, W, 3]: the whole upright image, a shrunk one (draft) or only the crop's box (region)."""
    crop: Crop
    """The chosen crop, in the coordinates of `pixels`."""
    decoder: str
    """REGION, DRAFT, WHOLE or PILLOW."""


def decoder_choice() -> str:
    """FASTLOADER_JPEG_DECODER, checked: auto unless set."""
    choice = os.environ.get(DECODER_ENV, "auto").strip().lower() or "auto"
    choice = _ALIASES.get(choice, choice)
    if choice not in DECODER_CHOICES:
        raise ConfigError(f"{DECODER_ENV}={os.environ[DECODER_ENV]!r} is not a decoder choice: set it to "
                          f"{', '.join(DECODER_CHOICES)}, or unset it (auto)")
    return choice


def jpeg_decoder() -> tuple[str, Callable[[bytearray], torch.Tensor | None] | None]:
    """(name, JPEG bytes -> RGB uint8 [H, W, 3], or None where it refuses the file) of the whole-file
    decoder of this process: nvImageCodec's CPU backend, else torchcodec, else torchvision's
    deprecated decode_jpeg; else (pillow, None)."""
    decoder = _region_decoder_in(os.getpid())
    if isinstance(decoder, RegionDecoder):
        return f"nvImageCodec {decoder.version} CPU", decoder.whole
    return _library_jpeg_decoder()


@functools.lru_cache(maxsize=None)
def _library_jpeg_decoder() -> tuple[str, Callable[[bytearray], torch.Tensor | None] | None]:
    """Where nvImageCodec cannot serve: torchcodec's JPEG decoder, else torchvision's (deprecated since
    0.29, still at hand), else Pillow, said once."""
    try:
        from torchcodec.decoders import decode_jpeg as torchcodec_decode_jpeg
        return "torchcodec.decoders.decode_jpeg", _tensor_decoder(functools.partial(torchcodec_decode_jpeg,
                                                                                    mode="RGB"))
    except (ImportError, OSError, RuntimeError) as error:
        reason = f"torchcodec unavailable ({error})"
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
        return "torchvision.io.decode_jpeg", _tensor_decoder(functools.partial(decode_jpeg, mode=ImageReadMode.RGB))
    except (ImportError, OSError) as error:
        reason += f"; torchvision.io.decode_jpeg unavailable ({error})"
    log.warning("JPEGs are decoded with Pillow, about 25%% slower: %s", reason)
    return "pillow", None


def _tensor_decoder(decode: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[bytearray], torch.Tensor | None]:
    """A torch decoder (bytes tensor -> [3, H, W]) as bytes -> [H, W, 3], None where it refuses the file."""
    def whole(data: bytearray) -> torch.Tensor | None:
        try:
            return decode(torch.frombuffer(data, dtype=torch.uint8)).permute(1, 2, 0)
        except RuntimeError:  # a JPEG that libjpeg-turbo refuses here: Pillow tries, and explains
            return None
    return whole


class RegionDecoder:
    """nvImageCodec's CPU backend (libjpeg-turbo, no GPU needed): decodes only a box of a JPEG.

    One per process, made after the fork: the decoder holds native state that a forked worker must
    not share. One thread: the DataLoader's workers are the parallelism.
    """

    def __init__(self, nvimgcodec):
        self.version = getattr(nvimgcodec, "__version__", "(version unknown)")
        self._codec = nvimgcodec
        self._decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                                           backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])
        self._params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.SRGB,
                                               sample_format=nvimgcodec.I_RGB)

    def __call__(self, data: bytes | bytearray, box: tuple[int, int, int, int]) -> torch.Tensor | None:
        """uint8 [bottom - top, right - left, 3] of the box (left, top, right, bottom), or None where
        nvImageCodec cannot decode the file (it gives no reason; the next decoder will)."""
        left, top, right, bottom = box
        try:
            stream = self._codec.CodeStream(np.frombuffer(data, dtype=np.uint8))
            region = stream.get_sub_code_stream(region=self._codec.Region(top, left, bottom, right))
            image = self._decoder.decode(region, params=self._params)
        except RuntimeError:
            return None
        if image is None:
            return None
        pixels = np.asarray(image)  # the image's host buffer, kept alive by the array
        if pixels.shape != (bottom - top, right - left, 3):
            return None
        return torch.from_numpy(pixels)

    def whole(self, data: bytes | bytearray) -> torch.Tensor | None:
        """uint8 [H, W, 3] of the whole JPEG, or None where nvImageCodec cannot decode it."""
        try:
            image = self._decoder.decode(self._codec.CodeStream(np.frombuffer(data, dtype=np.uint8)),
                                         params=self._params)
        except RuntimeError:
            return None
        if image is None:
            return None
        pixels = np.asarray(image)
        return torch.from_numpy(pixels) if pixels.ndim == 3 and pixels.shape[2] == 3 else None


@functools.lru_cache(maxsize=None)
def _nvimgcodec():
    """The nvImageCodec module, or the reason it cannot serve (logged once per process)."""
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")  # its per-file warnings: we log our own
    try:
        import nvidia.nvimgcodec as nvimgcodec
    except ImportError as error:
        reason = f"nvImageCodec is not installed ({error}); on Linux x86_64/aarch64 " \
                 f"`pip install nvidia-nvimgcodec-cu13` adds it"
        log.info("JPEG crops are decoded whole (torchcodec or torchvision): %s", reason)
        return reason
    except Exception as error:  # installed but broken (missing library, ABI)
        reason = f"nvImageCodec does not import ({type(error).__name__}: {error})"
        log.warning("JPEG crops are decoded whole (torchcodec or torchvision): %s", reason)
        return reason
    return nvimgcodec


@functools.lru_cache(maxsize=None)
def _region_decoder_in(pid: int) -> RegionDecoder | str:
    """This process's RegionDecoder, checked on a small JPEG, or why there is none."""
    module = _nvimgcodec()
    if isinstance(module, str):
        return module
    try:
        decoder = RegionDecoder(module)
        probe = io.BytesIO()
        Image.new("RGB", (16, 16), (200, 120, 40)).save(probe, format="JPEG")
        pixels = decoder(probe.getvalue(), (2, 4, 10, 12))
        if pixels is None or pixels.shape != (8, 8, 3):
            raise RuntimeError("it could not decode a 16x16 test JPEG on the CPU")
    except Exception as error:
        reason = f"nvImageCodec {getattr(module, '__version__', '')} cannot decode here " \
                 f"({type(error).__name__}: {error})"
        log.warning("JPEG crops are decoded whole by torchcodec or torchvision (process %d): %s", pid, reason)
        return reason
    return decoder


def region_decoder() -> RegionDecoder | None:
    """This process's region decoder, or None: FASTLOADER_JPEG_DECODER rules it out, or nvImageCodec is
    absent or fails here (logged once per process, with the reason)."""
    if decoder_choice() != "auto":
        return None
    decoder = _region_decoder_in(os.getpid())
    return decoder if isinstance(decoder, RegionDecoder) else None


def describe() -> str:
    """Which decoders the torch backend uses in this process, for the loader's log and `fastloader check`."""
    choice = decoder_choice()
    whole_name = jpeg_decoder()[0] if choice != "pillow" else "pillow"
    whole = f"{whole_name} (whole file)" if whole_name != "pillow" else "Pillow"
    if choice == "auto":
        decoder = _region_decoder_in(os.getpid())
        if isinstance(decoder, RegionDecoder):
            jpegs = f"nvImageCodec {decoder.version} CPU region decode (the crop's pixels only), " \
                    f"else {whole}"
        else:
            jpegs = f"{whole}; no region decode: {decoder}"
    else:
        jpegs = f"{whole} ({DECODER_ENV}={choice})"
    return f"JPEG crops: {jpegs}; crops of 2x the output or more: Pillow draft; other formats, " \
           f"CMYK and EXIF-rotated JPEGs: Pillow"


def allow_pixels(max_pixels: int) -> None:
    """Let Pillow open images up to `max_pixels` when the config allows more than Pillow's default
    (its check would refuse them first); our own check in load_region stays the limit."""
    if Image.MAX_IMAGE_PIXELS is not None and max_pixels > 2 * Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_pixels // 2 + 1

ChooseCrop = Callable[[int, int], Crop]
"""(width, height) of the upright image -> the region to keep."""


def load_region(where: str | Location, choose_crop: ChooseCrop, size: int, *, exif_orientation: bool = True,
                use_draft: bool = True, max_pixels: int = BOMB_PIXELS) -> Decoded:
    """The decoded pixels (uint8 [H, W, 3]), the chosen crop in their coordinates, and the decoder used.

    An image of more than `max_pixels` is refused from its header, before its pixels are allocated.
    A plain RGB or greyscale JPEG is read from its markers (jpeg_header.py, a sixth of Pillow's
    time) and goes straight to the fast decoders; anything else, and any JPEG the walk is not sure
    of, is opened by Pillow first, which decides as it did before the walk. `where` is a file's path
    or a sample's Location (a shard member).
    """
    data = read_bytes(where, max_pixels=max_pixels)
    path = as_location(where).name
    fast = decoder_choice() != "pillow"
    header = plain_jpeg_header(data, exif_orientation, max_pixels) if fast else None
    if header is not None:
        crop = choose_crop(header.width, header.height)
        if not _drafts(crop, size, use_draft):
            decoded = _fast_jpeg(data, crop, (header.width, header.height), path)
            if decoded is not None:
                return decoded
            fast = False  # Pillow decodes it, or says what is wrong with it
    return _with_pillow(path, data, choose_crop, size, exif_orientation, use_draft, max_pixels, fast)


def plain_jpeg_header(data: bytes | bytearray, exif_orientation: bool = True,
                      max_pixels: int = BOMB_PIXELS) -> JpegHeader | None:
    """The header of an RGB or greyscale JPEG that the fast decoders take as it is (upright, within
    the pixel limits), from its markers; None: Pillow reads the file first, and decides."""
    header = read_header(data)
    if header is None or header.components not in (1, 3):
        return None
    pixels = header.width * header.height
    if pixels > max_pixels or (Image.MAX_IMAGE_PIXELS is not None and pixels > Image.MAX_IMAGE_PIXELS):
        return None  # Pillow refuses it, in today's words, or warns
    return None if exif_orientation and header.orientation in _TURNED else header


def _drafts(crop: Crop, size: int, use_draft: bool) -> bool:
    """Whether Pillow's draft shrinks this JPEG: the crop is at least twice the output on each side."""
    return use_draft and _draft_factor(crop, size) >= 2


def _draft_factor(crop: Crop, size: int) -> float:
    return min(crop.right - crop.left, crop.bottom - crop.top) / size


def _with_pillow(path: str, data: bytearray, choose_crop: ChooseCrop, size: int, exif_orientation: bool,
                 use_draft: bool, max_pixels: int, fast: bool) -> Decoded:
    """Pillow reads the header and decides: draft, the fast decoders (when `fast`), or its own decode."""
    with Image.open(io.BytesIO(data)) as image:
        if image.width * image.height > max_pixels:
            raise ValueError(bomb_problem(image.width, image.height, max_pixels))
        orientation = image.getexif().get(ORIENTATION, 1) if exif_orientation else 1
        if orientation in _TURNED:  # rare: decode fully, turn upright, crop upright
            upright = ImageOps.exif_transpose(image)
            return Decoded(_pillow_pixels(upright), choose_crop(upright.width, upright.height), PILLOW)
        crop = choose_crop(image.width, image.height)
        if image.format == "JPEG" and image.mode in ("RGB", "L"):
            if _drafts(crop, size, use_draft):
                try:
                    return _drafted(image, crop, _draft_factor(crop, size))
                except OSError:  # libjpeg's error where libjpeg-turbo's decoders conceal bad scan data
                    decoded = _fast_jpeg(data, crop, image.size, path) if fast else None
                    if decoded is None:
                        raise
                    return decoded  # what the fast decoders and DALI deliver, at every output size
            decoded = _fast_jpeg(data, crop, image.size, path) if fast else None
            if decoded is not None:
                return decoded
        return Decoded(_pillow_pixels(image), crop, PILLOW)


def _fast_jpeg(data: bytearray, crop: Crop, size: tuple[int, int], path: str) -> Decoded | None:
    """The crop's region (nvImageCodec), else the whole file (jpeg_decoder), else None: Pillow tries, and
    explains what is wrong with the file."""
    region = region_decoder()
    if region is not None:
        box = crop.pixel_box(*size)
        pixels = region(data, box)
        if pixels is not None:
            return Decoded(pixels, Crop(0, 0, box[2] - box[0], box[3] - box[1], crop.flip), REGION)
        log.warning("%s: nvImageCodec could not decode this JPEG; the whole file goes to the next decoder", path)
    decode = jpeg_decoder()[1]
    pixels = decode(data) if decode is not None else None
    return Decoded(pixels, crop, WHOLE) if pixels is not None and pixels.shape[:2] == (size[1], size[0]) else None


def _drafted(image: Image.Image, crop: Crop, factor: float) -> Decoded:
    """Let the JPEG decoder shrink by 2/4/8 while the crop stays at least `size` pixels on each side."""
    full_w, full_h = image.size
    image.draft("RGB", (math.ceil(full_w / factor), math.ceil(full_h / factor)))
    crop = crop.scaled(image.width / full_w, image.height / full_h)
    return Decoded(_pillow_pixels(image), crop, DRAFT)


def decoded_with_words(where: str | Location, max_pixels: int = BOMB_PIXELS) -> Screened:
    """`fastloader check --deep`: screen.decode_file's full decode (Pillow), then for a JPEG the fast
    decoder's own (nvImageCodec or decode_jpeg: libjpeg-turbo), whose words on damage it concealed
    ('Corrupt JPEG data: 453 extraneous bytes before marker 0xd9') become the file's warning: Pillow
    decodes such a file without a word, into pixels that may be grey or smeared past the damage."""
    screened = decode_file(where, max_pixels)
    decode = jpeg_decoder()[1] if screened.problem is None and screened.format == "JPEG" else None
    if decode is None:
        return screened
    data = read_bytes(where, max_pixels=max_pixels)
    with native_words() as said:
        try:
            decode(data)
        except Exception:  # noqa: BLE001 - Pillow decoded it: a fast decoder's refusal is only words here
            pass
    return dataclasses.replace(screened, warning=said[0]) if said[0] else screened


def _pillow_pixels(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(to_rgb(image)))


