"""The JPEG marker walk (fastloader/imaging/jpeg_header.py): where it answers, Pillow reads the same
size, mode and orientation; where Pillow may read a file otherwise, it does not answer."""
from __future__ import annotations

import io
import re
import struct
from pathlib import Path

import pytest
from conftest import REALPHOTOS, requires_realphotos
from oddfiles import ODD_FILES, write_odd_files
from PIL import Image
from test_decode import photo_like, varied_jpegs

from fastloader.decoding.decode import DECODER_ENV, PILLOW, REGION, WHOLE, load_region, region_decoder
from fastloader.imaging.geometry import Crop
from fastloader.imaging.jpeg_header import HEAD_BYTES, chroma_sampling, read_header, read_header_from

MODES = {1: "L", 3: "RGB", 4: "CMYK"}


def pillow_reads(data: bytes) -> tuple:
    """What the torch backend used to read from the header: format, mode, size, orientation."""
    with Image.open(io.BytesIO(data)) as image:
        return image.format, image.mode, image.size, image.getexif().get(0x0112, 1)


def walk_reads(data: bytes) -> tuple | None:
    header = read_header(bytearray(data))
    if header is None:
        return None
    return "JPEG", MODES[header.components], (header.width, header.height), header.orientation


def segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def after_soi(data: bytes, *segments: bytes) -> bytes:
    return data[:2] + b"".join(segments) + data[2:]


def tiff(entries: list[tuple[int, int, int, bytes]], order: str = ">", tail: bytes = b"") -> bytes:
    """An EXIF APP1 body: a TIFF header, IFD0 with (tag, type, count, 4 value bytes) entries, then `tail`."""
    head = (b"MM\x00*" if order == ">" else b"II*\x00") + struct.pack(order + "IH", 8, len(entries))
    ifd = b"".join(struct.pack(order + "HHI", tag, kind, count) + value for tag, kind, count, value in entries)
    return b"Exif\x00\x00" + head + ifd + b"\x00" * 4 + tail


def short(value: int, order: str = ">") -> bytes:
    return struct.pack(order + "HH", value, 0)


def xmp(orientation: int) -> bytes:
    return b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta><rdf:Description tiff:Orientation=\"%d\"/></x:xmpmeta>" \
        % orientation


def plain_jpeg(**options) -> bytes:
    buffer = io.BytesIO()
    photo_like(64, 48).save(buffer, format="JPEG", quality=90, **options)
    return buffer.getvalue()


def mpo() -> bytes:
    buffer = io.BytesIO()
    photo_like(64, 48).save(buffer, format="MPO", save_all=True, append_images=[photo_like(64, 48, seed=1)])
    return buffer.getvalue()


ORIENTATION, ASCII, SHORT, LONG = 0x0112, 2, 3, 4


def with_exif(jpeg: bytes, entries: list, order: str = ">", tail: bytes = b"") -> bytes:
    return after_soi(jpeg, segment(0xE1, tiff(entries, order, tail)))


def answered() -> dict[str, bytes]:
    """Files the walk must answer for, as Pillow reads them."""
    jpeg = plain_jpeg()
    sof = jpeg.index(b"\xff\xc0")
    description_at_38 = (0x010E, ASCII, 6, struct.pack(">I", 38))  # 38: just after IFD0 of two entries
    photoshop = b"Photoshop 3.0\x008BIM\x04\x04\x00\x00" + struct.pack(">I", 2) + b"ab"
    return {
        "plain": jpeg,
        "exif orientation 6, big-endian": plain_jpeg(exif=tiff([(ORIENTATION, SHORT, 1, short(6))])),
        "exif orientation 5, little-endian": with_exif(jpeg, [(0x010F, ASCII, 4, b"ACME"),
                                                              (ORIENTATION, SHORT, 1, short(5, "<"))], "<"),
        "exif 3 after a string": with_exif(jpeg, [description_at_38, (ORIENTATION, SHORT, 1, short(3))],
                                            tail=b"hello\x00"),
        "exif without orientation": with_exif(jpeg, [(0x010F, ASCII, 4, b"ACME")]),
        "xmp orientation 8, no exif": after_soi(jpeg, segment(0xE1, xmp(8))),
        "exif 3 wins over xmp 6": after_soi(with_exif(jpeg, [(ORIENTATION, SHORT, 1, short(3))]),
                                            segment(0xE1, xmp(6))),
        "photoshop resources": after_soi(jpeg, segment(0xED, photoshop)),
        "icc profile": plain_jpeg(icc_profile=b"\x00" * 200),
        "progressive": plain_jpeg(progressive=True),
        "comment longer than the first read": after_soi(with_exif(jpeg, [(ORIENTATION, SHORT, 1, short(6))]),
                                                        segment(0xFE, b"c" * (3 * HEAD_BYTES))),
        "greyscale": _encoded(photo_like(64, 48).convert("L")),
        "cmyk": _encoded(photo_like(64, 48).convert("CMYK")),
        "lossless frame header (decoders refuse it)": jpeg[:sof + 1] + b"\xc3" + jpeg[sof + 2:],
    }


def unanswered() -> dict[str, bytes]:
    """Files Pillow may read otherwise than a plain walk would: the walk leaves them to Pillow."""
    jpeg = plain_jpeg()
    sof = jpeg.index(b"\xff\xc0")
    sof_end = sof + 2 + struct.unpack(">H", jpeg[sof + 2:sof + 4])[0]
    turned = [(ORIENTATION, SHORT, 1, short(6))]
    return {
        "two exif blocks (Pillow joins them)": with_exif(with_exif(jpeg, turned), turned),
        "orientation stored as LONG": with_exif(jpeg, [(ORIENTATION, LONG, 1, struct.pack(">I", 6))]),
        "orientation twice": with_exif(jpeg, [*turned, (ORIENTATION, SHORT, 1, short(3))]),
        "a tag's data past the exif block": with_exif(jpeg, [(0x010E, ASCII, 64, struct.pack(">I", 8)), *turned]),
        "exif directory past the block": after_soi(jpeg, segment(0xE1, b"Exif\x00\x00MM\x00*\x00\x00\x03\xe7")),
        "exif that is not tiff": after_soi(jpeg, segment(0xE1, b"Exif\x00\x00Exif\x00\x00MM\x00*")),
        "mpo": mpo(),
        "fill bytes before a marker": jpeg[:sof] + b"\xff\xff" + jpeg[sof:],
        "junk between segments": jpeg[:sof] + b"\x00\x17" + jpeg[sof:],
        "second frame header": jpeg[:sof_end] + jpeg[sof:sof_end] + jpeg[sof_end:],
        "12-bit samples": jpeg[:sof + 4] + b"\x0c" + jpeg[sof + 5:],
        "height in a later DNL marker": jpeg[:sof + 5] + b"\x00\x00" + jpeg[sof + 7:],
        "cut inside the header": jpeg[:sof + 6],
        "quantization table cut short": after_soi(jpeg, segment(0xDB, b"\x00" + b"\x01" * 30)),
        "png": _encoded(photo_like(64, 48), "PNG"),
        "empty": b"",
    }


def _encoded(image: Image.Image, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, quality=90)
    return buffer.getvalue()


@pytest.mark.parametrize("name", list(answered()))
def test_the_walk_reads_what_pillow_reads(name):
    data = answered()[name]
    assert walk_reads(data) == pillow_reads(data)


@pytest.mark.parametrize("name", list(unanswered()))
def test_the_walk_leaves_to_pillow_what_it_may_read_otherwise(name):
    assert read_header(unanswered()[name]) is None


def test_from_a_file_it_reads_what_it_reads_in_memory(tmp_path):
    for name, data in {**answered(), **unanswered()}.items():
        path = tmp_path / "f.jpg"
        path.write_bytes(data)
        with open(path, "rb") as handle:
            assert read_header_from(handle) == read_header(data), name


def test_every_varied_and_odd_file_is_read_as_pillow_reads_it_or_left_to_it(tmp_path):
    write_odd_files(tmp_path / "odd", only=tuple(odd.name for odd in ODD_FILES if odd.name != "unreadable.JPEG"))
    paths = varied_jpegs(tmp_path / "varied") + sorted(str(p) for p in (tmp_path / "odd").iterdir())
    answers = 0
    for path in paths:
        data = Path(path).read_bytes()
        walked = walk_reads(data)
        if walked is not None and walked[2][0] * walked[2][1] <= Image.MAX_IMAGE_PIXELS:  # the bomb: Pillow refuses
            assert walked == pillow_reads(data), path
            answers += 1
    assert answers >= 7 * 5  # every varied JPEG (7 kinds, 5 sizes), and the plain odd ones


@requires_realphotos
def test_every_real_photo_is_read_as_pillow_reads_it():
    paths = sorted(REALPHOTOS.rglob("*.JPEG"))
    for path in paths:
        data = path.read_bytes()
        assert walk_reads(data) == pillow_reads(data), path  # and none is left to Pillow


@requires_realphotos
def test_every_real_photos_chroma_sampling_is_the_one_pillow_reads():
    """The chroma subsampling the walk reads (the DALI feed's rule of what nvJPEG refuses), against
    Pillow's own reading of the frame (JpegImagePlugin.get_sampling: 0 4:4:4, 1 4:2:2, 2 4:2:0)."""
    from PIL import JpegImagePlugin
    pillow_names = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}
    seen = set()
    for path in sorted(REALPHOTOS.rglob("*.JPEG")):
        sampling = read_header(path.read_bytes()).sampling
        with Image.open(path) as image:
            expected = "grey" if image.mode == "L" else pillow_names.get(JpegImagePlugin.get_sampling(image))
            factors = [(h, v) for _, h, v, _ in image.layer]
        if expected is None:  # a layout Pillow does not name: luma sampled twice vertically is 4:4:0
            assert factors == [(1, 2), (1, 1), (1, 1)] and sampling == "4:4:0", (path, factors)
        assert sampling == (expected or "4:4:0"), path
        seen.add(sampling)
    assert "4:2:0" in seen  # most of ImageNet


def test_every_layout_of_sampling_factors_is_named_by_its_own_factors_each_time():
    """The walk names a frame's sampling from its factor bytes as met before (a handful per dataset;
    the feed's thread reads a header per sample): every (h, v) of three components, 4096 layouts,
    more than it keeps, read twice each and in two orders, gets chroma_sampling of its own factors."""
    jpeg = plain_jpeg(subsampling=0)
    frame = jpeg.index(b"\xff\xc0") + 4  # SOF0's body: precision, height, width, 3 components
    assert jpeg[frame + 5] == 3
    pairs = [(h, v) for h in range(1, 5) for v in range(1, 5)]
    layouts = [(luma, blue, red) for luma in pairs for blue in pairs for red in pairs]
    for order in (layouts, layouts[::-1]):
        for factors in order:
            patched = bytearray(jpeg)
            for component, (h, v) in enumerate(factors):
                patched[frame + 7 + 3 * component] = h << 4 | v
            expected = chroma_sampling(list(factors))
            assert read_header(bytes(patched)).sampling == expected, factors
            assert read_header(bytes(patched)).sampling == expected, factors


def cropped_or_error(path, choice: str, monkeypatch) -> tuple:
    """load_region's crop of the image with FASTLOADER_JPEG_DECODER=choice, or its error; and the decoder."""
    monkeypatch.setenv(DECODER_ENV, choice)
    try:
        decoded = load_region(str(path), lambda w, h: Crop(w * 0.1, h * 0.2, w * 0.8, h * 0.9), size=32)
    except Exception as error:
        return (type(error), re.sub(" at 0x[0-9a-f]+", "", str(error))), None
    left, top, right, bottom = decoded.crop.pixel_box(decoded.pixels.shape[1], decoded.pixels.shape[0])
    return decoded.pixels[top:bottom, left:right].numpy().tobytes(), decoded.decoder


@pytest.mark.filterwarnings("ignore:(Corrupt EXIF data|Tag data larger than file):UserWarning")  # Pillow's, on purpose
def test_files_the_walk_leaves_to_pillow_decode_as_pillow_decodes_them(tmp_path, monkeypatch):
    """The torch backend's pixels for the unusual JPEGs: the fast decoders where Pillow's header calls
    for them, Pillow's own decode otherwise; the same pixels, or error, as FASTLOADER_JPEG_DECODER=pillow."""
    used = set()
    for name, data in unanswered().items():
        path = tmp_path / "f.jpg"
        path.write_bytes(data)
        reference, _ = cropped_or_error(path, "pillow", monkeypatch)
        outcome, decoder = cropped_or_error(path, "auto", monkeypatch)
        assert outcome == reference, name
        used.add(decoder)
    assert {PILLOW, REGION if region_decoder() else WHOLE} <= used  # MPOs stay with Pillow, the rest goes fast


def test_broken_jpegs_fail_with_the_reasons_pillow_gives(tmp_path, monkeypatch):
    names = ("precision12.JPEG", "lossless.JPEG", "cut_in_half.JPEG", "random_bytes.jpg", "bomb.JPEG", "empty.JPEG")
    write_odd_files(tmp_path, only=names)
    for name in names:
        failures = []
        for choice in ("pillow", "auto"):
            monkeypatch.setenv(DECODER_ENV, choice)
            with pytest.raises(Exception) as failure:
                load_region(str(tmp_path / name), lambda w, h: Crop(0, 0, w, h), size=32, max_pixels=10**6)
            failures.append((type(failure.value), re.sub(" at 0x[0-9a-f]+", "", str(failure.value))))
        assert failures[0] == failures[1], name
