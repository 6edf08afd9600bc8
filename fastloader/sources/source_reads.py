"""A source's read() made into what every reader takes: an image's encoded bytes.

Encoded bytes (bytes, bytearray, memoryview) pass as they are (a bytes object copied into a
writable buffer: decoders take `torch.frombuffer` of it). A decoded image (a uint8 numpy array, a
PIL image, a uint8 tensor) becomes a binary PPM (P6, or P5 for one channel): a 15-byte header on
its pixels, which every decoder here reads (Pillow, DALI) at the cost of a copy, but which no decoder
can crop before decoding nor decode on the GPU. What a read raises, or gives that is none of these,
becomes a SourceReadError naming the source and the sample: an unreadable sample, under
dataset.on_bad_image like a missing file.
"""
from __future__ import annotations

import hashlib

import numpy as np

from .locations import Location, ReadArena
from .protocol import SourceReadError, opened

_BYTES = (bytes, bytearray, memoryview)


def source_bytes(location: Location, into: ReadArena | None = None) -> bytearray | memoryview:
    """The bytes of a source's sample (location.start: its number in the source)."""
    source = opened(location.source)
    try:
        value = source.read(location.start)
    except Exception as error:  # the user's code: whatever it raises names the source and the sample
        raise SourceReadError(getattr(error, "errno", None) or 0,
                              f"{source.name}: read({location.start}) of {location.name} raised "
                              f"{type(error).__name__}: {error}") from error
    try:
        return image_bytes(value, into)
    except (TypeError, ValueError) as error:
        raise SourceReadError(0, f"{source.name}: read({location.start}) of {location.name} gave {error}") from None


def image_bytes(value: object, into: ReadArena | None = None) -> bytearray | memoryview:
    """Encoded bytes as they are; a decoded image as a PPM (module docstring). TypeError or
    ValueError saying what `value` is where it is neither."""
    if isinstance(value, bytearray) or (isinstance(value, memoryview) and not value.readonly):
        return value
    if isinstance(value, _BYTES):
        data = into.view(len(value)) if into is not None else bytearray(len(value))
        data[:] = value
        return data
    return ppm(pixels_of(value))


def pixels_of(value: object) -> np.ndarray:
    """A decoded image as uint8 HWC (1 or 3 channels) numpy pixels: a numpy array (HWC or HW), a PIL
    image (converted to RGB unless it is L), or a tensor (CHW where its first axis is 1 or 3 and its
    last is not, else HWC)."""
    if hasattr(value, "getbands") and hasattr(value, "convert"):  # a PIL image
        value = np.asarray(value if value.mode in ("RGB", "L") else value.convert("RGB"))
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().cpu().numpy()
        if value.ndim == 3 and value.shape[0] in (1, 3) and value.shape[-1] not in (1, 3):
            value = value.transpose(1, 2, 0)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"a {type(value).__name__}, neither an image's bytes nor a decoded image (a uint8 array, "
                        f"a PIL image, a uint8 tensor)")
    if value.dtype != np.uint8:
        raise ValueError(f"an array of {value.dtype}; decoded images are uint8 (0-255)")
    if value.ndim == 2:
        value = value[:, :, None]
    if value.ndim != 3 or value.shape[2] not in (1, 3) or 0 in value.shape:
        raise ValueError(f"an array of shape {tuple(value.shape)}; a decoded image is height x width x 3 (or 1)")
    return value


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
