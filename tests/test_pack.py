"""`fastloader pack` on the CPU: every sample once, its own bytes and label, shards within their
limits, the same bytes twice, read back by tarfile, by our loader, by the webdataset package and
by DALI's webdataset reader as peers read them."""
from __future__ import annotations

import subprocess
import sys
import tarfile
from collections import Counter

import numpy as np
import pytest
from conftest import REPO, base_config, cpu_only_env, write_numbered_dataset
from PIL import Image

from fastloader import build_loader, load_config
from fastloader.packing import pack_index, sample_keys
from fastloader.sources.formats import build_index


def members_of(shards) -> dict[str, bytes]:
    found = {}
    for shard in shards:
        with tarfile.open(shard) as archive:
            for info in archive:
                found[info.name] = archive.extractfile(info).read()
    return found


@pytest.fixture
def packed(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=5, splits=("val",))
    config = load_config(base_config(root))
    index = build_index(config, config.split("val"))
    result = pack_index(config, index, str(tmp_path / "out"), "val", max_count=4)
    return root, index, result


def test_every_sample_is_packed_once_with_its_bytes_and_label(packed):
    root, index, result = packed
    assert result.samples == 15 and len(result.shards) == 4  # 15 samples, 4 a shard
    members = members_of(result.shards)
    keys = sample_keys(index)
    assert len(members) == 30
    for sample, key in enumerate(keys):
        assert members[f"{key}.png"] == open(index.path(sample), "rb").read()
        assert members[f"{key}.cls"] == str(index.label(sample)).encode()
    with tarfile.open(result.shards[0]) as archive:  # shuffled: the first shard is not the first class alone
        first = [int(archive.extractfile(i).read()) for i in archive if i.name.endswith(".cls")]
    assert len(first) == 4 and len(set(first)) > 1


def test_packing_twice_writes_the_same_bytes_and_no_partial_shard(packed, tmp_path):
    root, index, result = packed
    config = load_config(base_config(root))
    again = pack_index(config, index, str(tmp_path / "again"), "val", max_count=4)
    assert [open(a, "rb").read() for a in result.shards] == [open(b, "rb").read() for b in again.shards]
    assert not list((tmp_path / "out").glob("*.partial"))
    assert (tmp_path / "out" / "val-classes.txt").read_text().split() == list(index.classes)


def test_byte_limits_start_new_shards_and_keys_never_clash(tmp_path):
    root = tmp_path / "d" / "val" / "c"
    root.mkdir(parents=True)
    for name in ("a.b.png", "a_b.png", "x y.png"):
        Image.new("RGB", (20, 20), (9, 9, 9)).save(root / name)
    config = load_config(base_config(tmp_path / "d"))
    index = build_index(config, config.split("val"))
    assert sorted(sample_keys(index)) == ["c/a_b", "c/a_b_1", "c/x_y"]
    size = max((root / n).stat().st_size for n in ("a.b.png", "a_b.png"))
    result = pack_index(config, index, str(tmp_path / "out"), "v", max_bytes=size, shuffle_seed=None)
    assert len(result.shards) == 3  # no two images fit under the limit together


def test_our_loader_reads_the_packed_shards_as_the_folder(packed, tmp_path):
    root, index, result = packed
    folder_labels = Counter(label for _, labels in build_loader(base_config(root), "val") for label in labels.tolist())
    config = base_config(root)
    config["dataset"] = {"format": "webdataset", "classes": list(index.classes)}
    config["val"] = {**config["val"], "shards": str(tmp_path / "out" / "val-{000000..000003}.tar")}
    loader = build_loader(config, "val")
    assert Counter(label for _, labels in loader for label in labels.tolist()) == folder_labels


def test_the_webdataset_package_reads_our_shards_as_timm_does(packed):
    wds = pytest.importorskip("webdataset")
    root, index, result = packed
    dataset = wds.WebDataset(result.shards, shardshuffle=False).decode("pil").to_tuple("png", "cls")
    pairs = [(np.asarray(image).tolist()[0][0], label) for image, label in dataset]
    expected = [(list(Image.open(index.path(i)).convert("RGB").getpixel((0, 0))), index.label(i))
                for i in range(len(index))]
    assert sorted(pairs) == sorted(expected)


def test_dalis_webdataset_reader_reads_our_shards_on_the_cpu(packed, tmp_path):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    root, index, result = packed

    @pipeline_def(batch_size=15, num_threads=1, device_id=None)
    def read():
        image, label = fn.readers.webdataset(paths=result.shards, ext=["png", "cls"],
                                             missing_component_behavior="error")
        return image, label

    pipe = read()
    pipe.build()
    images, labels = pipe.run()
    got = sorted((bytes(np.asarray(images[i])), bytes(np.asarray(labels[i]))) for i in range(15))
    expected = sorted((open(index.path(i), "rb").read(), str(index.label(i)).encode()) for i in range(len(index)))
    assert got == expected


def test_the_command_packs_a_split_and_names_bad_options(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=2, splits=("val",))
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\nval: {{batch_size: 2}}\n")

    def pack(*args):
        return subprocess.run([sys.executable, "-m", "fastloader.cli", "pack", str(config), *args], cwd=REPO,
                              env=cpu_only_env(tmp_path / "cache"), capture_output=True, text=True, timeout=120)

    done = pack("--split", "val", "--out", str(tmp_path / "o"), "--per-shard", "4")
    assert done.returncode == 0, done.stderr
    assert "split val: 6 samples" in done.stdout
    assert f"shards: {tmp_path / 'o'}/val-{{000000..000001}}.tar" in done.stdout
    bad_size = pack("--split", "val", "--out", str(tmp_path / "p"), "--shard-size", "lots")
    assert bad_size.returncode == 2 and "--shard-size: expected a size such as 256MB" in bad_size.stderr
    no_split = pack("--split", "train", "--out", str(tmp_path / "p"))
    assert no_split.returncode == 2 and "--split: " in no_split.stderr and "its splits: val" in no_split.stderr


# ---------------------------------------------------------------------------------------------
# Issue 33: members named .jpg, class names the loader reads, what is packed checked, and files
# created new in the output folder. The CPU; real files, real links, the real command.
# ---------------------------------------------------------------------------------------------


def jpeg_dataset(root, per_class: int = 2):
    """root/val/<class>/img_N.JPEG, ImageNet's suffix, real JPEGs of one colour per class."""
    for name, colour in (("n01_tench", (200, 30, 30)), ("n02_goldfish", (30, 200, 30))):
        (root / "val" / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (40, 30), colour).save(root / "val" / name / f"img_{i}.JPEG", format="JPEG")
    return root


def pack_command(config, *args, capsys) -> tuple[int, str, str]:
    from fastloader.cli import main
    code = main(["pack", str(config), "--split", "val", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_jpegs_are_members_named_jpg_that_the_webdataset_idiom_reads(tmp_path):
    wds = pytest.importorskip("webdataset")
    root = jpeg_dataset(tmp_path / "d")
    config = load_config(base_config(root))
    index = build_index(config, config.split("val"))
    result = pack_index(config, index, str(tmp_path / "out"), "val")
    assert sorted(name.rsplit(".", 1)[1] for name in members_of(result.shards)) == ["cls"] * 4 + ["jpg"] * 4
    pairs = list(wds.WebDataset(result.shards, shardshuffle=False).decode("pil").to_tuple("jpg", "cls"))
    assert sorted((image.getpixel((20, 15))[0] > 100, label) for image, label in pairs) == [
        (False, 1), (False, 1), (True, 0), (True, 0)]


def test_pack_then_load_gives_the_folders_class_names(tmp_path, capsys):
    root = jpeg_dataset(tmp_path / "d")
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\nval: {{batch_size: 2}}\n")
    code, out, _ = pack_command(config, "--out", str(tmp_path / "wds"), capsys=capsys)
    assert code == 0
    printed = out.split("to read them", 1)[1].split(":\n", 1)[1]  # the config pack prints, as a user copies it
    assert f"classes: {tmp_path / 'wds' / 'val-classes.txt'}" in printed
    (tmp_path / "read.yaml").write_text(printed.replace("\n  ", "\n").strip() + "\nbackend: torch\n"
                                        "output: {device: cpu}\nworkers: {num_workers: 0}\n")
    folder_classes = ("n01_tench", "n02_goldfish")
    loader = build_loader(tmp_path / "read.yaml", "val")
    assert loader.classes == folder_classes
    assert sorted(label for _, labels in loader for label in labels.tolist()) == [0, 0, 1, 1]
    # without dataset.classes, the names beside the shards are read all the same
    bare = {"backend": "torch", "output": {"device": "cpu"}, "dataset": {"format": "webdataset"},
            "val": {"shards": str(tmp_path / "wds" / "val-000000.tar")}}
    assert build_loader(bare, "val").classes == folder_classes


def test_pack_never_writes_through_a_link_planted_in_the_output_folder(tmp_path, capsys):
    root = jpeg_dataset(tmp_path / "d")
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\nval: {{batch_size: 2}}\n")
    out = tmp_path / "out"
    out.mkdir()
    victims = {name: tmp_path / f"victim-{name}" for name in ("val-000000.tar.partial", "val-classes.txt",
                                                               "val-000000.tar")}
    for name, victim in victims.items():
        victim.write_text("precious\n")
        (out / name).symlink_to(victim)
    code, _, _ = pack_command(config, "--out", str(out), capsys=capsys)
    assert code == 0
    assert all(victim.read_text() == "precious\n" for victim in victims.values())
    assert not (out / "val-classes.txt").is_symlink() and (out / "val-classes.txt").read_text().split() == [
        "n01_tench", "n02_goldfish"]
    assert not (out / "val-000000.tar").is_symlink() and tarfile.is_tarfile(out / "val-000000.tar")
    # no temporary file left; the shard's index beside it
    assert sorted(p.name for p in out.iterdir()) == sorted([*victims, "val-000000.tar.idx"])


def test_pack_leaves_out_links_out_of_the_dataset_and_files_that_are_not_images(tmp_path, capsys, caplog):
    root = jpeg_dataset(tmp_path / "d")
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    photo = tmp_path / "outside.png"
    Image.new("RGB", (20, 20), (1, 2, 3)).save(photo)
    tench = root / "val" / "n01_tench"
    (tench / "passwd.JPEG").symlink_to(secret)
    (tench / "elsewhere.png").symlink_to(photo)
    (tench / "copy.JPEG").symlink_to(tench / "img_0.JPEG")  # a link inside the dataset is packed
    (tench / "page.JPEG").write_text("<!DOCTYPE html><html>404</html>")
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\nval: {{batch_size: 2}}\n")
    code, out, err = pack_command(config, "--out", str(tmp_path / "wds"), capsys=capsys)
    assert code == 0, err
    assert "split val: 5 samples" in out and "3 files left out" in out
    assert (f"left out {tench / 'passwd.JPEG'}: a symbolic link to {secret}, outside the dataset ({root}); pack reads "
            f"only files inside it (--follow-links packs such files too)") in caplog.text
    assert f"left out {tench / 'page.JPEG'}: not an image: an HTML or XML page" in caplog.text
    members = members_of([tmp_path / "wds" / "val-000000.tar"])
    assert not any(b"root:x:0:0" in data for data in members.values()) and "n01_tench/copy.jpg" in members
    caplog.clear()
    code, out, err = pack_command(config, "--out", str(tmp_path / "all"), "--follow-links", capsys=capsys)
    assert code == 0 and "split val: 6 samples" in out and "2 files left out" in out
    assert "n01_tench/elsewhere.png" in members_of([tmp_path / "all" / "val-000000.tar"])
    assert f"left out {tench / 'passwd.JPEG'}: not an image: text" in caplog.text  # followed, still not packed


def test_packs_messages_say_the_fix_and_the_fix_works(tmp_path, capsys):
    """`--out` naming a file was a raw [Errno 17]; `--shard-size 10` (no unit) silently made a shard per image."""
    root = jpeg_dataset(tmp_path / "d")
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\nval: {{batch_size: 2}}\n")
    (tmp_path / "shards.tar").write_bytes(b"")
    code, _, err = pack_command(config, "--out", str(tmp_path / "shards.tar"), capsys=capsys)
    assert code == 2 and "Errno" not in err
    assert (f"fastloader: error: --out: {tmp_path / 'shards.tar'} is a file, not a folder; pass a folder for the "
            f"shards (created if needed), e.g. {tmp_path / 'shards'}-shards") in err
    assert pack_command(config, "--out", f"{tmp_path / 'shards'}-shards", capsys=capsys)[0] == 0  # the fix
    code, _, err = pack_command(config, "--out", str(tmp_path / "o"), "--shard-size", "10", capsys=capsys)
    assert code == 2 and not (tmp_path / "o").exists()
    assert ("fastloader: error: --shard-size: '10' has no unit; write 10MB for megabytes or 10B for bytes (units: "
            "B (bytes), K or KB, M or MB, G or GB, T or TB (powers of 1024; KiB ... too))") in err
    code, out, _ = pack_command(config, "--out", str(tmp_path / "o"), "--shard-size", "10MB", capsys=capsys)
    assert code == 0 and "in 1 shard ->" in out


@pytest.mark.parametrize("prefix", ["/../../x", "../x", "a/b", ".hidden", ".."])
def test_a_prefix_that_is_no_plain_name_writes_nothing_anywhere(tmp_path, capsys, prefix):
    """`--prefix '/../../x'` wrote shards and a classes file outside --out, exit 0 (issue 41.11)."""
    root = jpeg_dataset(tmp_path / "d")
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}}}\nval: {{batch_size: 2}}\n")
    out = tmp_path / "deep" / "er" / "out"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    code, _, err = pack_command(config, "--out", str(out), "--prefix", prefix, capsys=capsys)
    assert code == 2
    assert f"--prefix: {prefix!r} is not a plain name" in err and "may hold no '/'" in err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
