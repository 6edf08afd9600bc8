"""Parquet and Arrow files of Hugging Face datasets (dataset.format: parquet / arrow) on both backends,
on the CPU: the same samples, labels, order and pixels as the same images in a folder, written by
pyarrow and by the `datasets` package; odd rows named `file.parquet:row` and skipped; every bad file
named with its fix."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import (
    REALPHOTOS,
    base_config,
    everything,
    identities,
    requires_realphotos,
    write_numbered_dataset,
    write_textured_dataset,
)
from shardfiles import png_bytes, resumes_and_evaluates_once
from tablefiles import folder_rows, split_as_arrow, split_as_parquet, table, write_arrow, write_parquet

from fastloader import build_loader
from fastloader.cli import main
from fastloader.errors import BadImageError, ConfigError
from fastloader.words import plural

BACKENDS = ["torch", pytest.param("dali", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("nvidia.dali"), reason="NVIDIA DALI is not installed"))]


def table_config(fmt: str, files: dict, **sections) -> dict:
    config = base_config("unused", **sections)
    config["dataset"] = {"format": fmt, **sections.get("dataset", {})}
    for split, patterns in files.items():
        config[split] = {**config.get(split, {}), "files": patterns}
    return config


def as_tables(root, out, fmt: str, writer: str = "pyarrow") -> dict[str, str]:
    """train and val of a folder dataset as parquet (2 files a split, row groups of 4) or Arrow files."""
    files = {}
    for split in ("train", "val"):
        folder = out / split
        if writer == "datasets":
            write_with_datasets(root / split, folder, fmt)
        elif fmt == "parquet":
            split_as_parquet(root / split, folder, files=2, row_group_size=4)
        else:
            split_as_arrow(root / split, folder)
        files[split] = str(folder / f"*.{fmt}")
    return files


def write_with_datasets(split_dir, out, fmt: str) -> None:
    """The peer writer: `datasets` casts the column to its Image feature and writes parquet or saves to disk."""
    datasets = pytest.importorskip("datasets")
    classes, images, labels = folder_rows(split_dir)
    dataset = datasets.Dataset.from_dict({"image": [{"bytes": data, "path": None} for data in images],
                                          "label": labels})
    dataset = dataset.cast_column("image", datasets.Image()).cast_column("label", datasets.ClassLabel(names=classes))
    if fmt == "parquet":
        out.mkdir(parents=True)
        dataset.to_parquet(str(out / "data.parquet"))
    else:
        dataset.save_to_disk(str(out))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt,writer", [("parquet", "pyarrow"), ("arrow", "pyarrow"), ("parquet", "datasets"),
                                        ("arrow", "datasets")])
def test_tables_give_the_folders_samples_labels_order_and_pixels(tmp_path, backend, fmt, writer):
    """Device: CPU. The same images as rows in the folder index's order: every train batch (a seeded
    permutation, random crops and flips) and every val batch equal, pixel for pixel, on each backend;
    the class names from the ClassLabel metadata."""
    root = write_textured_dataset(tmp_path / "d", per_class=4)
    files = as_tables(root, tmp_path / "t", fmt, writer)
    sections = dict(backend=backend, workers={"num_workers": 2})
    for split in ("train", "val"):
        from_folder = build_loader(base_config(root, **sections), split)
        from_table = build_loader(table_config(fmt, files, **sections), split)
        assert from_table.backend == backend and from_table.classes == from_folder.classes
        assert len(from_table) == len(from_folder)
        folder_labels, folder_images = everything(from_folder)
        table_labels, table_images = everything(from_table)
        assert table_labels == folder_labels, split
        for ours, theirs in zip(table_images, folder_images, strict=True):
            assert torch.equal(ours, theirs)
    files = len(from_table.index.ranges.files)  # "1 arrow file", not "1 arrow files"
    assert f".{fmt}:0" in from_table.index.path(0)
    assert f"pixels from {plural(files, f'{fmt} file')})" in repr(from_table)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parquet_loader_resumes_mid_epoch_and_evaluates_each_row_once_across_ranks(tmp_path, backend):
    root = write_numbered_dataset(tmp_path / "d", per_class=6)
    resumes_and_evaluates_once(table_config("parquet", as_tables(root, tmp_path / "t", "parquet"), backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_restart_with_more_ranks_re_shards_the_rest_of_a_parquet_epoch_exactly_once(tmp_path, backend):
    """Device: CPU. 2 ranks read 16 of 36 rows (compressed pages, read by row group); restarted as 3
    ranks with another batch size from that state, they read the other 20, each once."""
    root = write_numbered_dataset(tmp_path / "d", per_class=12, splits=("val",))
    classes, images, labels = folder_rows(root / "val")
    pq.write_table(table(images, labels, classes), tmp_path / "val.parquet", row_group_size=5)
    config = table_config("parquet", {"val": str(tmp_path / "val.parquet")}, backend=backend)

    def rank_loader(rank: int, world: int, batch: int):
        return build_loader({**config, "distributed": {"rank": rank, "world_size": world},
                             "val": {**config["val"], "batch_size": batch}}, "val")

    before, state = [], None
    for rank in range(2):
        loader = rank_loader(rank, 2, 4)
        for step, (batch, _) in enumerate(loader):
            before += identities(batch)
            if step == 1:
                state = state or loader.state_dict()
                break
    rest = []
    for rank in range(3):
        loader = rank_loader(rank, 3, 5)
        loader.load_state_dict(state)
        rest += [i for batch, _ in loader for i in identities(batch)]
    every = [i for batch, _ in build_loader(config, "val") for i in identities(batch)]
    assert len(before) == 16 and len(rest) == 20 and sorted(before + rest) == sorted(every)


def test_block_order_reads_parquet_files_block_by_block(tmp_path):
    """shuffle: block groups rows by file: a block of one file (block_size 1B) is read whole before the
    next, and every row once an epoch."""
    root = write_numbered_dataset(tmp_path / "d", per_class=6, splits=("train",))
    split_as_parquet(root / "train", tmp_path / "t", files=6, row_group_size=2)
    config = table_config("parquet", {"train": str(tmp_path / "t" / "*.parquet")},
                          train={"shuffle": "block", "block_size": "1B", "batch_size": 3})
    del config["val"]
    loader = build_loader(config, "train")
    order = loader.order.permutation(0)
    files = [loader.index.path(int(i)).rsplit(":", 1)[0] for i in order]
    runs = [name for k, name in enumerate(files) if k == 0 or name != files[k - 1]]
    assert len(runs) == 6 and len(set(runs)) == 6, runs  # each file's rows together
    assert sorted(order.tolist()) == list(range(18))
    assert sum(len(labels) for _, labels in loader) == 18


def odd_rows(path, compressed: bool = False) -> dict[str, str]:
    """A parquet file of 9 rows: 4 good ones, and one of each odd kind; {row name: word of its reason}.
    compressed: written with pyarrow's defaults (snappy, dictionary), its rows read by row group."""
    good = [png_bytes((10 * k, 100, 200 - 10 * k), (40, 30)) for k in range(4)]
    images = [good[0], None, good[1], b"%PDF-1.4 not an image", good[2], good[3], png_bytes(), png_bytes(), None]
    labels = [0, 1, 1, 0, 2, 1, None, 7, 0]
    if compressed:
        pq.write_table(table(images, labels, ["a", "b", "c"]), path, row_group_size=4)
    else:
        write_parquet(path, table(images, labels, ["a", "b", "c"]), row_group_size=4)
    return {f"{path}:1": "no image bytes (null)", f"{path}:3": "not an image", f"{path}:6": "no label",
            f"{path}:7": "outside the ClassLabel's 3 names", f"{path}:8": "no image bytes"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["parquet", "parquet-compressed", "arrow"])
def test_odd_rows_are_named_file_row_and_skipped_and_the_rest_is_read(tmp_path, backend, fmt):
    """Device: CPU. Null bytes, a non-image, a missing label and a label outside the ClassLabel: each
    named `file.parquet:row` with its reason in loader.bad_samples, on each backend; the 4 good rows read
    (rows of compressed pages too: their null bytes are found when screening reads them)."""
    bad = odd_rows(tmp_path / "odd.parquet", compressed=fmt == "parquet-compressed")
    fmt = fmt.split("-")[0]
    if fmt == "arrow":
        write_arrow(tmp_path / "odd.arrow", pq.read_table(tmp_path / "odd.parquet"), max_chunksize=4)
        bad = {name.replace(".parquet", ".arrow"): word for name, word in bad.items()}
    config = table_config(fmt, {"val": str(tmp_path / f"odd.{fmt}")}, backend=backend, workers={"num_workers": 2})
    loader = build_loader(config, "val")
    labels, images = everything(loader)
    assert labels == [0, 1, 2, 1] and loader.classes == ("a", "b", "c")
    reasons = dict(loader.bad_samples)
    assert set(reasons) == set(bad), sorted(reasons)
    for name, word in bad.items():
        assert word in reasons[name], (name, reasons[name])


def test_check_names_the_odd_rows(tmp_path, capsys):
    bad = odd_rows(tmp_path / "odd.parquet")
    config = tmp_path / "table.yaml"
    config.write_text(f"dataset: {{format: parquet}}\nval: {{files: '{tmp_path / 'odd.parquet'}'}}\n")
    assert main(["check", str(config)]) == 1
    out = capsys.readouterr().out
    for name in bad:
        assert os.path.relpath(name, tmp_path) in out or name in out, (name, out)


def test_a_truncated_parquet_file_is_named_and_the_others_are_read(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=3, splits=("val",))
    split_as_parquet(root / "val", tmp_path / "t", files=3, row_group_size=2)
    cut = sorted((tmp_path / "t").glob("*.parquet"))[1]
    cut.write_bytes(cut.read_bytes()[:cut.stat().st_size // 2])
    loader = build_loader(table_config("parquet", {"val": str(tmp_path / "t" / "*.parquet")}), "val")
    assert dict(loader.bad_samples) == {str(cut): "parquet file cut short (%s bytes, no footer at its end); copy it "
                                        "again" % f"{cut.stat().st_size:,}"}
    assert sum(len(labels) for _, labels in loader) == 6
    with pytest.raises(BadImageError, match=f"{cut}.*cut short"):
        build_loader(table_config("parquet", {"val": str(tmp_path / "t" / "*.parquet")},
                                  dataset={"on_bad_image": "raise"}), "val")


@pytest.mark.parametrize("backend", BACKENDS)
def test_compressed_pages_are_read_by_row_group_with_the_folders_pixels(tmp_path, backend, caplog):
    """Device: CPU. Parquet as pyarrow writes it by default (snappy, dictionary pages): rows read by
    decoding their row group give the folder's batches, in the eval order and in the block order over
    row groups (each row group's rows together); a uniform order is warned of, with its cost and the fix."""
    root = write_textured_dataset(tmp_path / "d", per_class=4)
    files = {}
    for split in ("train", "val"):
        classes, images, labels = folder_rows(root / split)
        pq.write_table(table(images, labels, classes), tmp_path / f"{split}.parquet", row_group_size=3)
        files[split] = str(tmp_path / f"{split}.parquet")
    sections = dict(backend=backend, workers={"num_workers": 2})
    for split in ("train", "val"):
        folder_labels, folder_images = everything(build_loader(base_config(root, **sections), split))
        table_labels, table_images = everything(build_loader(table_config("parquet", files, **sections), split))
        assert table_labels == folder_labels
        for ours, theirs in zip(table_images, folder_images, strict=True):
            assert torch.equal(ours, theirs)
    assert "nearly every row costs its whole row group" in caplog.text and "train.shuffle: block" in caplog.text
    blocks = build_loader(table_config("parquet", files, train={"shuffle": "block", "block_size": "1B"},
                                       **sections), "train")
    order = blocks.order.permutation(0)
    groups = (order // 3).tolist()  # 12 rows, row groups of 3, in index order
    assert [g for k, g in enumerate(groups) if k == 0 or g != groups[k - 1]] == list(dict.fromkeys(groups))
    assert len(set(groups)) == 4 and sorted(order.tolist()) == list(range(12))
    assert sum(len(labels) for _, labels in blocks) == 12


def test_bad_files_fail_with_the_file_and_the_fix(tmp_path):
    images, labels = [png_bytes(), png_bytes((1, 2, 3))], [0, 1]
    cases = {}
    (tmp_path / "notparquet.parquet").write_bytes(b"id,label\n1,2\n" * 10)
    cases["notparquet.parquet"] = ("parquet", r"notparquet\.parquet: not a parquet file .* list only `\.parquet`")
    write_parquet(tmp_path / "noimage.parquet", pa.table({"picture_id": [1, 2], "label": labels}))
    cases["noimage.parquet"] = ("parquet", r"noimage\.parquet: no image column: its columns are picture_id \(int64\), "
                                           r"label \(int64\); .* Set dataset\.image_column")
    write_parquet(tmp_path / "names.parquet", table(images, ["cat", "dog"], None, pa.string()))
    cases["names.parquet"] = ("parquet", r"names\.parquet: the label column 'label' holds class names \(strings\), "
                                         r"and dataset\.classes is not set; set dataset\.classes")
    (tmp_path / "notarrow.arrow").write_bytes(b"PAR1" + b"\0" * 100)
    cases["notarrow.arrow"] = ("arrow", r"notarrow\.arrow: not an Arrow file")
    for name, (fmt, message) in cases.items():
        with pytest.raises(ConfigError, match=message):
            build_loader(table_config(fmt, {"val": str(tmp_path / name)}), "val")
    named = build_loader(table_config("parquet", {"val": str(tmp_path / "names.parquet")},
                                      dataset={"classes": ["dog", "cat"]}), "val")
    assert named.index.labels.tolist() == [1, 0]


RED, BLUE = (250, 10, 10), (10, 10, 250)
"""Cats are red, dogs blue, in every file of the ClassLabel tests."""


def colours_and_names(loader) -> list[tuple[str, str]]:
    """(the colour of each delivered image, its label's class name), in delivery order."""
    return [("red" if colour[0] > colour[2] else "blue", loader.classes[label]) for images, labels in loader
            for colour, label in zip(identities(images), labels.tolist(), strict=True)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_classlabel_integers_keep_their_names_whatever_order_dataset_classes_lists(tmp_path, backend, fmt):
    """Device: CPU. dataset.classes [cat, dog] over a file whose ClassLabel says [dog, cat], one that
    says [cat, dog] and one of plain integers (positions in dataset.classes): every red image is a cat
    and every blue one a dog, on each backend. Without dataset.classes the two orders are refused; a
    ClassLabel name that dataset.classes lacks is refused with the file, the name and the fix."""
    write = write_parquet if fmt == "parquet" else write_arrow
    write(tmp_path / f"a.{fmt}", table([png_bytes(BLUE), png_bytes(BLUE), png_bytes(RED)], [0, 0, 1], ["dog", "cat"]))
    write(tmp_path / f"b.{fmt}", table([png_bytes(RED), png_bytes(BLUE)], [0, 1], ["cat", "dog"]))
    write(tmp_path / f"c.{fmt}", table([png_bytes(BLUE), png_bytes(RED)], [1, 0], None))
    alone = build_loader(table_config(fmt, {"val": str(tmp_path / f"a.{fmt}")}, dataset={"classes": ["cat", "dog"]}),
                         "val")
    assert alone.index.labels.tolist() == [1, 1, 0]  # dog, dog, cat: by name, not by position
    files = {"val": str(tmp_path / f"*.{fmt}")}
    loader = build_loader(table_config(fmt, files, backend=backend, dataset={"classes": ["cat", "dog"]}), "val")
    assert loader.classes == ("cat", "dog") and loader.index.labels.tolist() == [1, 1, 0, 0, 1, 1, 0]
    assert colours_and_names(loader) == [("blue", "dog"), ("blue", "dog"), ("red", "cat"), ("red", "cat"),
                                         ("blue", "dog"), ("blue", "dog"), ("red", "cat")]
    with pytest.raises(ConfigError, match=rf"b\.{fmt}: its ClassLabel names \(cat, dog ...\) differ from those of "
                                          rf".*a\.{fmt} \(dog, cat ...\); set dataset\.classes"):
        build_loader(table_config(fmt, files), "val")
    with pytest.raises(ConfigError, match=rf"dataset\.classes: .*a\.{fmt}: its ClassLabel names 1 class that "
                                          rf"dataset\.classes lacks \('dog'\); .* add it to dataset\.classes"):
        build_loader(table_config(fmt, {"val": str(tmp_path / f"a.{fmt}")}, dataset={"classes": ["cat", "bird"]}),
                     "val")


def test_a_scan_made_with_dataset_classes_still_asks_for_them_without(tmp_path):
    """The scan cache holds what the file says: class names read once with dataset.classes are not
    taken as read without it, which asks for dataset.classes again."""
    write_parquet(tmp_path / "names.parquet", table([png_bytes(), png_bytes((1, 2, 3))], ["cat", "dog"], None,
                                                    pa.string()))
    files = {"val": str(tmp_path / "names.parquet")}
    named = build_loader(table_config("parquet", files, dataset={"classes": ["dog", "cat"]}), "val")
    assert named.index.labels.tolist() == [1, 0]
    with pytest.raises(ConfigError, match=r"names\.parquet: the label column 'label' holds class names \(strings\), "
                                          r"and dataset\.classes is not set; set dataset\.classes"):
        build_loader(table_config("parquet", files), "val")


def test_columns_chosen_by_the_dataset_keys_and_rows_left_out_by_exclude(tmp_path):
    images = [png_bytes((k * 20, 0, 0)) for k in range(4)]
    data = pa.table({"jpg": pa.array(images, pa.binary()), "cls": [0, 1, 0, 1], "label": ["x"] * 4})
    write_parquet(tmp_path / "plain.parquet", data, compression="none", use_dictionary=False,
                  column_encoding=None)
    exclude = tmp_path / "exclude.txt"
    exclude.write_text("plain.parquet:2\n")
    config = table_config("parquet", {"val": str(tmp_path / "plain.parquet")},
                          dataset={"image_column": "jpg", "label_column": "cls", "root": str(tmp_path),
                                   "exclude": str(exclude)})
    loader = build_loader(config, "val")
    assert loader.index.labels.tolist() == [0, 1, 1] and loader.index.excluded == 1
    assert [loader.index.relpath(i) for i in range(3)] == ["plain.parquet:0", "plain.parquet:1", "plain.parquet:3"]
    assert sum(len(labels) for _, labels in loader) == 3


def test_pack_writes_parquet_rows_as_tar_shards_with_the_same_bytes(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=3, splits=("val",))
    split_as_parquet(root / "val", tmp_path / "t", files=2, row_group_size=2)
    config = tmp_path / "table.yaml"
    config.write_text(f"dataset: {{format: parquet}}\nval: {{files: '{tmp_path / 't' / '*.parquet'}'}}\n")
    assert main(["pack", str(config), "--split", "val", "--out", str(tmp_path / "shards")]) == 0
    from_table = build_loader(table_config("parquet", {"val": str(tmp_path / "t" / "*.parquet")}), "val")
    shards = build_loader({**base_config("unused"), "dataset": {"format": "webdataset"},
                           "val": {**base_config("unused")["val"], "shards": str(tmp_path / "shards" / "*.tar")}},
                          "val")
    assert sorted(shards.index.labels.tolist()) == sorted(from_table.index.labels.tolist())
    assert shards.classes == from_table.classes


def test_the_uint8_cache_is_built_from_parquet_and_serves_its_rows(tmp_path):
    from fastloader.cache_write import build_split_cache
    from fastloader.config import load_config
    from fastloader.sources.formats import build_index

    root = write_numbered_dataset(tmp_path / "d", per_class=4, splits=("val",))
    split_as_parquet(root / "val", tmp_path / "t", files=2, row_group_size=3)
    files = {"val": str(tmp_path / "t" / "*.parquet")}
    config = load_config(table_config("parquet", files))
    report = build_split_cache(config, config.split("val"), build_index(config, config.split("val")),
                               str(tmp_path / "cache"), short_side=37, workers=0)
    assert report["images"] == 12, report
    direct_labels, direct = everything(build_loader(table_config("parquet", files), "val"))
    cached = build_loader(table_config("parquet", files, dataset={"cache": str(tmp_path / "cache")}), "val")
    cached_labels, cached_images = everything(cached)
    assert cached_labels == direct_labels
    for ours, theirs in zip(cached_images, direct, strict=True):
        assert (ours - theirs).abs().max() < 0.05


@pytest.mark.parametrize("compressed", [False, True])
def test_parquet_files_in_an_object_store_give_the_local_rows(tmp_path, object_store, request, compressed):
    """Files in S3 (byte ranges, or rows of compressed pages read with their row group from the node
    cache's copy): the same labels and pixels as the same files on disk."""
    from remotefiles import bucket_for, uploaded

    root = write_numbered_dataset(tmp_path / "d", per_class=3, splits=("val",))
    split_as_parquet(root / "val", tmp_path / "t" / "val", files=2, row_group_size=2)
    if compressed:  # rewritten with pyarrow's defaults
        for path in (tmp_path / "t" / "val").glob("*.parquet"):
            pq.write_table(pq.read_table(path), path, row_group_size=2)
    url = uploaded(object_store, bucket_for(request), tmp_path / "t", "hf")
    local = build_loader(table_config("parquet", {"val": str(tmp_path / "t" / "val" / "*.parquet")}), "val")
    stored = build_loader(table_config("parquet", {"val": f"{url}/val/*.parquet"},
                                       dataset={"remote": {"cache_dir": str(tmp_path / "node")}}), "val")
    assert stored.index.path(0) == f"{url}/val/train-00000-of-00002.parquet:0"
    local_labels, local_images = everything(local)
    stored_labels, stored_images = everything(stored)
    assert stored_labels == local_labels
    for ours, theirs in zip(stored_images, local_images, strict=True):
        assert torch.equal(ours, theirs)


@requires_realphotos
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_real_photos_as_parquet_and_arrow_give_the_folders_pixels_and_labels(tmp_path, fmt, backend):
    """Device: CPU. The 100 real val photos (JPEGs as ImageNet ships them) in row groups of 100 rows,
    as Hugging Face writes image datasets: each backend yields the folder's tensors, exactly."""
    writer = split_as_parquet if fmt == "parquet" else split_as_arrow
    writer(REALPHOTOS / "val", tmp_path / "t")
    sections = dict(backend=backend, workers={"num_workers": 2}, val={"batch_size": 25, "transform": {"size": 64}})
    from_folder = build_loader(base_config(REALPHOTOS, **sections), "val")
    from_table = build_loader(table_config(fmt, {"val": str(tmp_path / "t" / f"*.{fmt}")}, **sections), "val")
    folder_labels, folder_images = everything(from_folder)
    table_labels, table_images = everything(from_table)
    assert table_labels == folder_labels and len(table_labels) == 100
    for ours, theirs in zip(table_images, folder_images, strict=True):
        assert torch.equal(ours, theirs)


def test_a_zero_byte_parquet_file_is_named_and_the_others_are_read(tmp_path):
    """An empty `.parquet` beside good ones refused the whole split (issue 41.16)."""
    root = write_numbered_dataset(tmp_path / "d", per_class=3, splits=("val",))
    split_as_parquet(root / "val", tmp_path / "t", files=3, row_group_size=2)
    empty = tmp_path / "t" / "train-00003-of-00003.parquet"
    empty.write_bytes(b"")
    loader = build_loader(table_config("parquet", {"val": str(tmp_path / "t" / "*.parquet")}), "val")
    assert list(dict(loader.bad_samples)) == [str(empty)] and "empty (0 bytes)" in dict(loader.bad_samples)[str(empty)]
    assert sum(len(labels) for _, labels in loader) == 9


def parquet_of_paths(split_dir, out) -> list[str]:
    """The split written by `datasets` from file paths, as a user casts them: rows {bytes: null,
    path: <relative to out's folder>} and a ClassLabel; the class names."""
    import datasets

    classes, paths, labels = [], [], []
    for label, class_dir in enumerate(sorted(p for p in split_dir.iterdir() if p.is_dir())):
        classes.append(class_dir.name)
        for image in sorted(class_dir.iterdir()):
            paths.append(os.path.relpath(image, out.parent))
            labels.append(label)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    here = os.getcwd()
    os.chdir(out.parent)  # where the user ran `datasets`: the paths are relative to it
    try:
        datasets.Dataset.from_dict({"image": paths, "label": labels}, features=features).to_parquet(str(out))
    finally:
        os.chdir(here)
    stored = pq.read_table(out).column("image").to_pylist()
    assert all(row["bytes"] is None and row["path"] for row in stored)  # what the peer writes
    return classes


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_datasets_wrote_from_file_paths_are_read_by_their_path(tmp_path, backend, monkeypatch):
    """{bytes: null, path: ...} rows were all refused as "no image bytes (null)", though `datasets`
    reads them by their path (issue 41.14). Relative paths are relative to the parquet file's folder,
    wherever the loader runs; the pixels and labels are the folder's."""
    root = write_numbered_dataset(tmp_path / "d", per_class=2, splits=("val",))
    parquet_of_paths(root / "val", tmp_path / "val.parquet")
    monkeypatch.chdir(tmp_path / "d")  # not the folder the paths are relative to
    from_table = build_loader(table_config("parquet", {"val": str(tmp_path / "val.parquet")}, backend=backend), "val")
    from_folder = build_loader(base_config(root, backend=backend), "val")
    assert not from_table.bad_samples and len(from_table.index) == 6
    assert everything(from_table)[0] == everything(from_folder)[0]
    assert [identities(x) for x, _ in from_table] == [identities(x) for x, _ in from_folder]


def test_a_row_whose_path_names_no_file_is_named_and_the_others_are_read(tmp_path):
    root = write_numbered_dataset(tmp_path / "d", per_class=2, splits=("val",))
    parquet_of_paths(root / "val", tmp_path / "val.parquet")
    gone = sorted((root / "val" / "a_red").iterdir())[0]
    gone.unlink()
    loader = build_loader(table_config("parquet", {"val": str(tmp_path / "val.parquet")}), "val")
    (name, reason), = loader.bad_samples
    assert name == f"{tmp_path / 'val.parquet'}:0" and reason.startswith(
        f"no image bytes (null), and its path 'd/val/a_red/{gone.name}' ({gone}) cannot be read: No such file")
    assert sum(len(labels) for _, labels in loader) == 5
