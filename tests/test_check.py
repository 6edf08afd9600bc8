"""`fastloader check` and the screening behind it, on real files broken the ways real datasets are:
empty, not an image, cut short, mislabelled, a bomb, unreadable, corrupt compressed data."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, cpu_only_env
from PIL import Image

from fastloader.decoding.screen import Screened, decode_file, screen_file, screen_files, sniff

FASTLOADER = [sys.executable, "-m", "fastloader.cli"]


# ---------------------------------------------------------------------------------------------
# Files, made and broken here
# ---------------------------------------------------------------------------------------------


def photo_bytes(fmt: str = "JPEG", size=(64, 48), seed: int = 0) -> bytes:
    """A textured image (noise over a gradient), so that a JPEG has real entropy-coded data."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, np.full_like(x, 90)], axis=-1)
    noise = np.random.default_rng(seed).integers(0, 60, size=(height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(buffer, format=fmt)
    return buffer.getvalue()


def with_size_in_header(jpeg: bytes, width: int, height: int) -> bytes:
    """The JPEG with its SOF0 marker (FFC0: length, precision, height, width) declaring another size."""
    sof = jpeg.index(b"\xff\xc0")
    dims = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return jpeg[:sof + 5] + dims + jpeg[sof + 9:]


def with_garbage_in_scan(jpeg: bytes) -> bytes:
    """The JPEG with junk, including a stray SOF marker, in the middle of its entropy-coded data: the
    header stays intact (and the EOI marker too), only a full decode can tell."""
    sos = jpeg.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big")
    middle = (start + len(jpeg) - 2) // 2
    junk = b"\x13\x37\xff\xc0\x00\x11\x08\xde\xad\xbe\xef" * 3
    return jpeg[:middle] + junk + jpeg[middle + len(junk):]


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------------------------
# screen.py
# ---------------------------------------------------------------------------------------------


def test_a_good_jpeg_has_its_format_and_size_and_no_problem(tmp_path):
    path = write(tmp_path / "ok.JPEG", photo_bytes(size=(64, 48)))
    assert screen_file(str(path)) == Screened(str(path), "JPEG", 64, 48, None)
    assert decode_file(str(path)).problem is None
    assert not screen_file(str(path)).suffix_mismatch


def test_a_png_named_jpeg_is_readable_but_its_suffix_is_noted(tmp_path):
    screened = screen_file(str(write(tmp_path / "n01.JPEG", photo_bytes("PNG", size=(30, 20)))))
    assert (screened.format, screened.width, screened.height, screened.problem) == ("PNG", 30, 20, None)
    assert screened.suffix_mismatch
    assert decode_file(screened.path).problem is None


def test_empty_missing_and_non_image_files_are_named_as_such(tmp_path):
    assert screen_file(str(write(tmp_path / "empty.jpg", b""))).problem == "empty file"
    assert screen_file(str(tmp_path / "gone.jpg")).problem == "missing (no such file)"
    os.symlink(tmp_path / "gone.jpg", tmp_path / "link.jpg")
    assert screen_file(str(tmp_path / "link.jpg")).problem == "missing (broken symbolic link)"
    noise = np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    random_file = screen_file(str(write(tmp_path / "noise.jpg", b"\x00\x01" + noise)))
    assert random_file.format is None and random_file.problem.startswith("not an image: unknown format")
    html = screen_file(str(write(tmp_path / "page.jpg", b"<!DOCTYPE html><html>404 Not Found</html>")))
    assert html.problem == "not an image: an HTML or XML page"  # what it is, never what it holds
    secret = screen_file(str(write(tmp_path / "passwd.jpg", b"root:x:0:0:root:/root:/bin/bash\n")))
    assert secret.problem == "not an image: text"


def test_a_jpeg_signature_with_a_broken_header_says_it_does_not_parse(tmp_path):
    screened = screen_file(str(write(tmp_path / "bad.jpg", b"\xff\xd8\xff\xc0\x00\x02" + bytes(200))))
    assert screened.format == "JPEG"
    assert screened.problem.startswith("JPEG header does not parse")


def test_files_cut_short_are_truncated(tmp_path):
    jpeg, png = photo_bytes(), photo_bytes("PNG")
    half = screen_file(str(write(tmp_path / "half.jpg", jpeg[:len(jpeg) // 2])))
    assert half.format == "JPEG" and half.width == 64
    assert half.problem == "truncated JPEG: no end-of-image marker (FFD9) in its last 512 bytes"
    assert screen_file(str(write(tmp_path / "half.png", png[:len(png) // 2]))).problem.startswith("truncated PNG")
    # padding after the end-of-image marker is fine
    assert screen_file(str(write(tmp_path / "padded.jpg", jpeg + bytes(100)))).problem is None


def test_a_header_declaring_65535x65535_is_a_decompression_bomb(tmp_path):
    bomb = screen_file(str(write(tmp_path / "bomb.jpg", with_size_in_header(photo_bytes(), 65535, 65535))))
    assert bomb.problem == "decompression bomb: 4,294,836,225 pixels, Pillow refuses it"
    small = screen_file(str(write(tmp_path / "ok.jpg", photo_bytes(size=(64, 48)))), max_pixels=1000)
    assert small.problem == "decompression bomb: 64x48 = 3,072 pixels, above dataset.max_pixels (1,000)"


def test_an_unreadable_file_is_named_unreadable(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their permissions")
    path = write(tmp_path / "secret.jpg", photo_bytes())
    path.chmod(0)
    try:
        assert screen_file(str(path)).problem == "unreadable: permission denied"
    finally:
        path.chmod(0o644)


def test_garbage_in_the_entropy_data_passes_the_header_check_and_fails_the_decode(tmp_path):
    path = str(write(tmp_path / "garbled.jpg", with_garbage_in_scan(photo_bytes())))
    assert screen_file(path) == Screened(path, "JPEG", 64, 48, None)
    assert decode_file(path).problem.startswith("decode failed: ")


def test_sniff_names_formats_from_their_first_bytes():
    for fmt in ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF", "PPM"):
        assert sniff(photo_bytes(fmt, size=(8, 8))[:32]) == fmt
    assert sniff(b"RIFF\x00\x00\x00\x00WAVEfmt ") is None


def test_screen_files_keeps_the_order_in_processes_and_inline(tmp_path):
    paths = [str(write(tmp_path / f"{i:03d}.jpg", photo_bytes(size=(8 + i % 5, 8)))) for i in range(150)]
    paths[70] = str(write(tmp_path / "070.jpg", b""))
    paths[140] = str(write(tmp_path / "140.jpg", with_garbage_in_scan(photo_bytes())))
    seen = []
    shallow = list(screen_files(paths, workers=2, chunk=16, on_progress=seen.append))
    assert [r.path for r in shallow] == paths and seen[-1] == 150 and seen == sorted(seen)
    assert [r.width for r in shallow[:5]] == [8, 9, 10, 11, 12]
    assert [i for i, r in enumerate(shallow) if r.problem] == [70]
    assert list(screen_files(paths, workers=0, chunk=16)) == shallow
    deep = list(screen_files(paths, deep=True, workers=2, chunk=16))
    assert [i for i, r in enumerate(deep) if r.problem] == [70, 140]


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


def check(*args, cache_dir):
    """The command as a user on a CPU-only machine runs it."""
    environment = cpu_only_env(cache_dir)
    return subprocess.run([*FASTLOADER, "check", *args], cwd=REPO, env=environment, capture_output=True,
                          text=True, timeout=120)


BROKEN = {  # relative path -> the reason the header check gives
    "train/b_green/empty.jpg": "empty file",
    "train/b_green/half.jpg": "truncated JPEG: no end-of-image marker (FFD9) in its last 512 bytes",
    "train/b_green/bomb.jpg": "decompression bomb: 4,294,836,225 pixels, Pillow refuses it",
    "train/c_blue/noise.jpg": "not an image: unknown format",
    "val/a_red/page.png": "not an image: an HTML or XML page",
}


def broken_dataset(tmp_path: Path) -> Path:
    """tmp/data/{train,val}/<class>/... with good JPEGs and PNGs, a PNG named .JPEG, the files of
    BROKEN and one JPEG with garbage in its compressed data; tmp/check.yaml reads it."""
    data = tmp_path / "data"
    jpeg = photo_bytes()
    for i in range(3):
        write(data / "train" / "a_red" / f"ok_{i}.jpg", photo_bytes(size=(64 + 8 * i, 48), seed=i))
        write(data / "train" / "c_blue" / f"ok_{i}.png", photo_bytes("PNG", size=(40, 40), seed=i))
        write(data / "val" / "a_red" / f"ok_{i}.jpg", photo_bytes(seed=i))
    write(data / "train" / "a_red" / "n0001.JPEG", photo_bytes("PNG", size=(50, 50)))
    write(data / "train" / "b_green" / "empty.jpg", b"")
    write(data / "train" / "b_green" / "half.jpg", jpeg[:len(jpeg) // 2])
    write(data / "train" / "b_green" / "bomb.jpg", with_size_in_header(jpeg, 65535, 65535))
    write(data / "train" / "b_green" / "garbled.jpg", with_garbage_in_scan(jpeg))
    write(data / "train" / "c_blue" / "noise.jpg", np.random.default_rng(5).bytes(3000))
    write(data / "val" / "a_red" / "page.png", b"<html><body>oops</body></html>")
    (tmp_path / "check.yaml").write_text("dataset: {root: data}\ntrain: {batch_size: 4}\nval: {}\n")
    return tmp_path / "check.yaml"


def test_check_on_the_embedded_demo_reports_the_environment_and_the_splits(tmp_path):
    result = check("configs/sample.yaml", "--set", "train.transform.auto_augment=rand-m9-mstd0.5-inc1",
                   "--set", "train.transform.color_jitter=0.4", cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^versions: Python [\d.]+, torch \S+, torchvision \S+, DALI (\S+|not installed), "
                     r"Pillow \S+ \((with|without) libjpeg-turbo", out, re.M), out
    assert re.search(r"^CUDA devices: (none|\d+)", out, re.M)
    assert "split train: 240 images in 5 classes" in out and "split val: 60 images in 5 classes" in out
    assert "images per class: circle 48, cross 48, square 48, stripes 48, triangle 48" in out
    assert "formats: JPEG 240" in out and "formats: JPEG 60" in out
    widths = [int(w) for w in re.findall(r"width: {2}min (\d+), p5 \d+, median \d+, p95 \d+, max (\d+)", out)[0]]
    heights = [int(h) for h in re.findall(r"height: min (\d+), p5 \d+, median \d+, p95 \d+, max (\d+)", out)[0]]
    assert 200 <= widths[0] <= widths[1] < 320 and 160 <= heights[0] <= heights[1] < 260  # demo.py's sizes
    assert "no problems in 300 files" in out
    assert ("augmentation: hflip 0.5; ops: rand-m9-mstd0.5-inc1: RandAugment, 2 of 15 ops (increasing set), "
            "magnitude 9 + normal noise std 0.5, clipped to [0, 10], each applied with p 0.5 (color_jitter 0.4 is "
            "off: auto_augment is set, as in timm)") in out
    assert out.count("augmentation:") == 1  # the train split only
    assert "240/240 files (100%)" in result.stderr  # the progress line


def check_here(capsys, *args) -> subprocess.CompletedProcess:
    """The command in this process (the real-process run is the demo's test above): its exit code
    and what it printed."""
    from fastloader.cli import main
    code = main(["check", *args])
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(["check", *args], code, printed.out, printed.err)


def test_check_names_each_broken_file_writes_an_exclude_list_and_deep_finds_the_rest(tmp_path, capsys):
    config = broken_dataset(tmp_path)
    bad_list, deep_list = tmp_path / "bad.txt", tmp_path / "deep-bad.txt"

    header = check_here(capsys, str(config), "--exclude-list", str(bad_list))
    assert header.returncode == 1, header.stderr
    for relpath, reason in BROKEN.items():
        assert f"  {relpath}: {reason}" in header.stdout
    assert f"problems: {len(BROKEN)} of 16 files" in header.stdout
    assert "garbled" not in header.stdout  # its header is fine
    assert "split train: 12 images in 3 classes" in header.stdout  # and val's 4, under train's classes:
    assert "split val: 4 images in 3 classes " in header.stdout  # one meaning of each label in both
    assert "images per class: a_red 4, b_green 4, c_blue 4" in header.stdout
    assert "formats: JPEG 6, PNG 4, unknown 2" in header.stdout
    assert "  train/a_red/n0001.JPEG is PNG" in header.stdout  # readable, but its suffix lies
    lines = bad_list.read_text().splitlines()
    assert lines[0].startswith("# written by fastloader check") and sorted(lines[1:]) == sorted(BROKEN)
    assert f"--set dataset.exclude={bad_list}" in header.stdout

    deep = check_here(capsys, str(config), "--deep", "--set", f"dataset.exclude={bad_list}", "--exclude-list",
                      str(deep_list))
    assert deep.returncode == 1, deep.stderr
    assert f"dataset.exclude: {len(BROKEN)} paths listed in {bad_list} are left out" in deep.stdout
    assert re.search(r"^split train: 8 images in 3 classes \(.*/data/train\), 4 more left out by dataset.exclude$",
                     deep.stdout, re.M)
    assert re.search(r"problems: 1 of 11 files .*\n  train/b_green/garbled.jpg: decode failed: ", deep.stdout)
    assert sorted(deep_list.read_text().splitlines()[2:]) == sorted([*BROKEN, "train/b_green/garbled.jpg"])

    clean = check_here(capsys, str(config), "--deep", "--set", f"dataset.exclude={deep_list}")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no problems in 10 files (header check and full decode)" in clean.stdout


def test_check_without_splits_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "none.yaml").write_text("dataset: {root: data}\n")
    result = check_here(capsys, str(tmp_path / "none.yaml"))
    assert result.returncode == 2 and "no split sections to check" in result.stderr


def test_many_classes_are_summarized_and_long_problem_lists_are_capped(capsys):
    from fastloader.commands.check import LISTED, class_counts, report_problems
    names = [f"n{i:04d}" for i in range(30)]
    counts = [1300] * 27 + [732, 5, 0]
    assert class_counts(names, counts) == ("min 0, median 1300, max 1300; smallest: n0029 0, n0028 5, "
                                           "n0027 732, n0000 1300, n0001 1300")
    problems = {f"train/x/{i:03d}.jpg": Screened(f"/d/train/x/{i:03d}.jpg", problem="empty file") for i in range(25)}
    report_problems(problems, 100, deep=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "problems: 25 of 100 files (header check; --deep also decodes every file):"
    assert lines[1] == "  train/x/000.jpg: empty file" and len(lines) == 1 + LISTED + 1
    assert lines[-1] == f"  ... and {25 - LISTED} more"


@pytest.mark.parametrize("keys, words", [
    ("train: {batch_size: 1000}", "problem: split 'train' yields no batch per epoch: 240 samples, batch_size 1000 x "
                                  "world_size 1 with drop_last: true"),
    ("train: {batch_size: 32, epoch_size: 10}", "train.epoch_size: 10 is below world_size x batch_size"),
])
def test_check_finds_what_bench_and_show_refuse_about_the_splits_size(tmp_path, capsys, keys, words):
    """check said "no problems" where bench and show refused and train.py ran 0 steps (issue 41.17)."""
    from fastloader.cli import main
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: builtin:sample}}\n{keys}\n")
    assert main(["check", str(config)]) == 1
    assert words in capsys.readouterr().out


@pytest.mark.parametrize("batch_sizes, batches", [([300, 100], 2), ([300, 250], 0), ([250], 0)])
def test_check_counts_a_batch_size_per_size_as_the_loader_does_and_suggests_what_the_config_check_takes(
        tmp_path, capsys, caplog, batch_sizes, batches):
    """Issue 68.20: with batch_sizes [16, 4] on 10 images check said the split "yields no batch" (its
    batch_size, the largest, is 16) and suggested --set train.batch_size=10, which the config check
    refuses; the loader yields 2 batches. Here on the 240 samples of builtin:sample: check agrees
    with len(loader), and where there is no batch, its suggestion passes the config check and makes
    one; the loader's own warning names batch_sizes too."""
    from fastloader import build_loader
    from fastloader.cli import main
    config = tmp_path / "c.yaml"
    sizes = [16, 32][:len(batch_sizes)]
    config.write_text(f"dataset: {{root: builtin:sample}}\nbackend: torch\noutput: {{device: cpu}}\n"
                      f"workers: {{num_workers: 0}}\ntrain: {{batch_sizes: {batch_sizes}, transform: {{size: 32, "
                      f"sizes: {sizes}}}}}\n")
    with build_loader(str(config), "train") as loader:
        assert len(loader) == batches
    assert (f"batch_size {min(batch_sizes)} x world_size 1 with drop_last: true; lower train.batch_sizes (their "
            f"smallest) or set train.drop_last: false" in caplog.text) == (batches == 0)  # the loader's own warning
    assert main(["check", str(config)]) == (1 if batches == 0 else 0)
    out = capsys.readouterr().out
    if batches:
        assert "problem:" not in out
        return
    assert ("problem: split 'train' yields no batch per epoch: 240 samples, 240 a rank over world_size 1, fewer "
            f"than the smallest of train.batch_sizes ({min(batch_sizes)}), with drop_last: true; lower it (e.g. "
            "--set 'train.batch_sizes=[") in out
    fix = re.findall(r"--set '?([^' )]+(?: \d+\])?)'?", out.split("lower it (e.g. ")[1].split(") or set")[0])
    assert main(["check", str(config), *[word for value in fix for word in ("--set", value)]]) == 0
    assert "problem:" not in capsys.readouterr().out


def test_check_says_colour_jitter_is_on_with_deit3s_3a_policy(tmp_path, capsys):
    from fastloader.cli import main
    config = tmp_path / "c.yaml"
    config.write_text("dataset: {root: builtin:sample}\ntrain: {transform: {auto_augment: 3a, color_jitter: 0.3}}\n")
    assert main(["check", str(config)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "augmentation:" in line)
    assert "then colour jitter: brightness x[0.7, 1.3]" in line and "is off" not in line


def test_check_deep_names_a_jpeg_whose_damaged_data_the_decoder_conceals(tmp_path, capsys):
    """Scan data overwritten mid-file: libjpeg warns 'Corrupt JPEG data' and conceals it (grey or
    smeared pixels), Pillow decodes it without a word, and `check --deep` said 'no problems'."""
    from oddfiles import _garbage_in_entropy_data
    from PIL import Image

    root = tmp_path / "data"
    for name in ("a", "b"):
        (root / "train" / name).mkdir(parents=True)
        Image.new("RGB", (32, 24), (200, 10, 10)).save(root / "train" / name / "good.jpg")
    (root / "train" / "b" / "damaged.jpg").write_bytes(_garbage_in_entropy_data())
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\ntrain: {{batch_size: 1}}\n")
    result = check_here(capsys, str(config), "--deep", "--workers", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 file decode with the decoder's warning (damaged data it conceals" in result.stdout, result.stdout
    assert re.search(r"^    train/b/damaged\.jpg: Corrupt JPEG data", result.stdout, re.M), result.stdout
    assert "no problems in 3 files (header check and full decode)" in result.stdout
    assert "Corrupt JPEG data" not in result.stderr  # said in the report, not spilled onto the terminal
