"""A source's read() made into what every reader takes: an image's encoded bytes.

Encoded bytes (bytes, bytearray, memoryview) are copied, into the reader's arena or a buffer of
their own: a source may hand out one buffer it reuses or resizes for every read (a blob client
reading each object into the same bytearray), and a reader that kept it (the DALI feed hands a
batch's bytes to DALI in place) would see a later sample's bytes under this one's label. A decoded
image (a uint8 numpy array, a PIL image of any mode, a uint8 tensor) becomes a binary PPM (P6, or P5
for one channel): a 15-byte header on its pixels, which every decoder here reads (Pillow, DALI) at
the cost of a copy, but which no decoder can crop before decoding nor decode on the GPU; its size is
checked against dataset.max_pixels from its shape, before a byte is copied. What a read raises, or
gives that is none of these, becomes a SourceReadError naming the source and the sample: an
unreadable sample, under dataset.on_bad_image like a missing file.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..errors import SourceError, SourceReadError
from ..imaging.rgb import to_8_bits
from ..locations import Location, ReadArena
from ..schema import BOMB_PIXELS
from .protocol import opened

_BYTES = (bytes, bytearray, memoryview)


def source_bytes(location: Location, into: ReadArena | None = None, max_pixels: int = BOMB_PIXELS
                 ) -> bytearray | memoryview:
    """The bytes of a source's sample (location.start: its number in the source), copied into
    `into` where given."""
    source = opened(location.reader)
    try:
        value = source.read(location.start)
    except SourceError:
        raise  # not this sample's failure: the source's, which stops the run
    except (SystemExit, KeyboardInterrupt) as error:  # the user's code tried to end the process, from here
        how = f"called sys.exit({error.code!r})" if isinstance(error, SystemExit) else "raised KeyboardInterrupt"
        raise SourceError(f"{source.name}: read({location.start}) of {location.name} {how}: a source's read() "
                          f"runs in the loader's workers or threads, where it cannot end the process; raise an "
                          f"exception for a sample that cannot be read (it is skipped under "
                          f"dataset.on_bad_image)") from None
    except Exception as error:  # the user's code: whatever it raises names the source and the sample
        raise SourceReadError(getattr(error, "errno", None) or 0,
                              f"{source.name}: read({location.start}) of {location.name} raised "
                              f"{type(error).__name__}: {error}") from error
    try:
        return image_bytes(value, into, max_pixels)
    except (TypeError, ValueError, BufferError) as error:
        raise SourceReadError(0, f"{source.name}: read({location.start}) of {location.name} gave {error}") from None


def image_bytes(value: object, into: ReadArena | None = None, max_pixels: int = BOMB_PIXELS
                ) -> bytearray | memoryview:
    """Encoded bytes, copied; a decoded image as a PPM (module docstring). TypeError or ValueError
    saying what `value` is where it is neither, or a decoded image larger than `max_pixels`."""
    if isinstance(value, _BYTES):
        source = memoryview(value).cast("B") if isinstance(value, memoryview) else value
        data = into.view(len(source)) if into is not None else bytearray(len(source))
        data[:] = source
        return data
    return ppm(pixels_of(value, max_pixels))


def pixels_of(value: object, max_pixels: int = BOMB_PIXELS) -> np.ndarray:
    """A decoded image as uint8 HWC (1 or 3 channels) numpy pixels: a numpy array (HWC or HW), a PIL
    image (any mode as Pillow's decoders give it: 16-bit grey scaled to 8 bits, as a 16-bit PNG's
    bytes are decoded; to RGB unless it is L), or a tensor (CHW where its first axis is 1 or 3 and its
    last is not, else HWC). Refused from its shape, before anything is copied, where it has more
    than `max_pixels` pixels (dataset.max_pixels, the files' decompression-bomb limit)."""
    if hasattr(value, "getbands") and hasattr(value, "convert"):  # a PIL image
        _check_pixels(value.size[0], value.size[1], max_pixels)
        value = to_8_bits(value)
        value = np.asarray(value if value.mode in ("RGB", "L") else value.convert("RGB"))
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        shape = tuple(value.shape)
        chw = len(shape) == 3 and shape[0] in (1, 3) and shape[-1] not in (1, 3)
        if len(shape) in (2, 3):
            _check_pixels(shape[-1] if chw else shape[1], shape[-2] if chw else shape[0], max_pixels)
        value = value.detach().cpu().numpy()
        if chw:
            value = value.transpose(1, 2, 0)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"a {type(value).__name__}, neither an image's bytes nor a decoded image (a uint8 array, "
                        f"a PIL image, a uint8 tensor)")
    if value.ndim in (2, 3):
        _check_pixels(value.shape[1], value.shape[0], max_pixels)
    if value.dtype != np.uint8:
        raise ValueError(f"an array of {value.dtype}; decoded images are uint8 (0-255)")
    if value.ndim == 2:
        value = value[:, :, None]
    if value.ndim != 3 or value.shape[2] not in (1, 3) or 0 in value.shape:
        raise ValueError(f"an array of shape {tuple(value.shape)}; a decoded image is height x width x 3 (or 1)")
    return value


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise ValueError(f"a decoded image of {width} x {height} pixels ({width * height:,}), more than "
                         f"dataset.max_pixels ({max_pixels:,}), the decompression-bomb limit files are held to; "
                         f"raise dataset.max_pixels if such images are meant")


def ppm(pixels: np.ndarray) -> bytearray:
    """uint8 HWC pixels (1 or 3 channels) as a binary PGM or PPM file."""
    height, width, channels = pixels.shape
    header = f"P{6 if channels == 3 else 5}\n{width} {height}\n255\n".encode("ascii")
    data = bytearray(len(header) + pixels.size)
    data[:len(header)] = header
    np.frombuffer(data, dtype=np.uint8, offset=len(header)).reshape(pixels.shape)[:] = pixels
    return data


def identity_stamp(token: str) -> int:
    """A source's identity() as an int64: what the uint8 cache and screening keep per sample."""
    identity = str(opened(token).identity())
    return int.from_bytes(hashlib.blake2b(identity.encode("utf-8", "surrogateescape"), digest_size=8).digest(),
                          "little", signed=True)
