"""A source of the user's own (docs/sources.md): a SQLite table of encoded images through
`<split>.source`, a map-style Dataset through `fastloader.sources.from_dataset`, any object through
`build_loader(source=...)`. The whole contract holds for them on both backends (DALI: its CPU
flavour here): every sample once, sharding, resume and re-sharding, bad samples, the uint8 cache,
the commands; and what a source does wrong is named.

Each image is one solid colour of its own (conftest.write_numbered_dataset), stored as PNG, so
`identities` reads back which sample every output image came from, whatever the crop.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import base_config, cpu_only_env, resumed_on_three_ranks, write_numbered_dataset
from PIL import Image
from test_sources import delivered

from fastloader import build_loader
from fastloader.errors import BadImageError, ConfigError
from fastloader.sources import from_dataset
from fastloader.sources.sqlite_table import write_table

BACKENDS = ["torch", "dali"]
SQLITE = "fastloader.sources.sqlite_table:SQLiteSource"


def numbered_images(tmp_path: Path) -> tuple[Path, list[tuple[str, bytes, int]], list[str]]:
    """The numbered dataset's train split as folders, and as (name, PNG bytes, label) rows."""
    root = write_numbered_dataset(tmp_path / "folders", per_class=6, splits=("train",))
    classes = sorted(path.name for path in (root / "train").iterdir())
    rows = [(f"{folder.name}/{path.name}", path.read_bytes(), label)
            for label, folder in enumerate(sorted((root / "train").iterdir())) for path in sorted(folder.iterdir())]
    return root, rows, classes


@pytest.fixture
def table(tmp_path) -> tuple[Path, Path]:
    root, rows, classes = numbered_images(tmp_path)
    write_table(str(tmp_path / "train.sqlite"), rows, classes)
    return root, tmp_path / "train.sqlite"


def sqlite_config(db: Path, backend: str = "torch", **train) -> dict:
    config = base_config(db.parent, backend=backend,
                         train={"source": SQLITE, "source_args": {"path": str(db)}, **train})
    del config["dataset"], config["val"]
    return config


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sqlite_table_reads_as_its_folder_does_every_sample_once_on_both_backends(table, backend):
    folders, db = table
    eval_split = {"mode": "eval", "batch_size": 5}
    from_table = build_loader(sqlite_config(db, backend, **eval_split), "train")
    from_folders = build_loader(base_config(folders, backend=backend, train=eval_split), "train")
    assert from_table.classes == from_folders.classes and len(from_table) == len(from_folders) == 4
    assert from_table.index.path(0) == f"{db}:a_red/n_00.png"  # messages name the source and the sample
    colours, labels = delivered(from_table)
    assert len(set(colours)) == 18 and sorted(zip(colours, labels)) == sorted(zip(*delivered(from_folders)))


def test_both_backends_give_a_sources_train_batches_alike(table):
    _, db = table
    torch_run = delivered(build_loader(sqlite_config(db, "torch"), "train"))
    dali_run = delivered(build_loader(sqlite_config(db, "dali"), "train"))
    assert torch_run == dali_run and len(torch_run[0]) == 16  # 18 samples, whole batches of 4


def test_a_resume_mid_epoch_on_2_ranks_then_3_reads_the_rest_of_the_uninterrupted_order(table):
    _, db = table
    config = sqlite_config(db, batch_size=2, drop_last=False)
    interleaved = resumed_on_three_ranks(config)
    whole = build_loader({**config, "train": {**config["train"], "mode": "eval", "batch_size": 18}}, "train")
    by_sample = delivered(whole)[0]
    planned = [by_sample[i] for i in build_loader(config, "train").order.permutation(0).tolist()]
    # 2 ranks x 2 batches x 2 read before; the last step padded so that 3 ranks yield equal batches
    assert interleaved[:10] == planned[8:] and len(interleaved) == 12 and set(interleaved[10:]) <= set(planned)


def test_class_weights_draw_a_sources_classes_equally(tmp_path):
    _, rows, classes = numbered_images(tmp_path)
    rows = rows[:6] + rows[6:8] + rows[12:14]  # 6 red, 2 green, 2 blue
    write_table(str(tmp_path / "t.sqlite"), rows, classes)
    config = sqlite_config(tmp_path / "t.sqlite", class_weights="inverse", epoch_size=3000, batch_size=100)
    labels = delivered(build_loader(config, "train"))[1]
    assert len(labels) == 3000 and all(900 < labels.count(label) < 1100 for label in range(3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_that_is_no_image_is_skipped_by_name_and_counted(tmp_path, backend):
    _, rows, classes = numbered_images(tmp_path)
    rows[3] = (rows[3][0], b"not an image at all", rows[3][2])
    write_table(str(tmp_path / "t.sqlite"), rows, classes)
    config = sqlite_config(tmp_path / "t.sqlite", backend, mode="eval", batch_size=5)
    with pytest.raises(BadImageError, match=r"t\.sqlite:a_red/n_03\.png'"):  # found where it is decoded
        delivered(build_loader({**config, "dataset": {"on_bad_image": "raise"}}, "train"))
    loader = build_loader(config, "train")  # on_bad_image: skip, the default
    assert len(delivered(loader)[0]) == 17 and [path for path, _ in loader.bad_samples] == [
        f"{tmp_path / 't.sqlite'}:a_red/n_03.png"]


class Flaky:
    """A source over rows that raises, or hangs, on one sample (read after the loader is built)."""

    def __init__(self, rows, classes, bad: int, hang: bool = False):
        self.rows, self.classes, self.bad, self.hang = rows, classes, bad, hang
        self.name = "flaky"
        self.armed = False

    def samples(self):
        return [name for name, _, _ in self.rows], [label for _, _, label in self.rows], self.classes

    def read(self, item):
        if self.armed and item == self.bad:
            if self.hang:
                threading.Event().wait()
            raise ConnectionError("the blob service reset the connection")
        return self.rows[item][1]

    def identity(self):
        return "flaky-1"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_source_that_raises_on_one_sample_is_named_or_skipped(tmp_path, backend):
    _, rows, classes = numbered_images(tmp_path)
    source = Flaky(rows, classes, bad=5)
    config = base_config(tmp_path, backend=backend, train={"mode": "eval", "batch_size": 6})
    loader = build_loader(config, "train", ["dataset.on_bad_image=raise"], source=source)
    source.armed = True
    with pytest.raises(BadImageError, match=r"flaky:a_red/n_05\.png.*read\(5\).*ConnectionError: the blob service"):
        delivered(loader)
    source.armed = False
    skipping = build_loader(config, "train", source=source)
    source.armed = True
    assert len(delivered(skipping)[0]) == 17 and skipping.bad_samples[0][0] == "flaky:a_red/n_05.png"


@pytest.mark.parametrize("backend, error", [("torch", RuntimeError), ("dali", TimeoutError)])
def test_a_source_that_hangs_on_one_sample_stops_at_workers_timeout(tmp_path, backend, error):
    _, rows, classes = numbered_images(tmp_path)
    source = Flaky(rows, classes, bad=8, hang=True)
    config = base_config(tmp_path, backend=backend, train={"mode": "eval", "batch_size": 6},
                         workers={"num_workers": 1, "timeout": 1})
    source.armed = True  # a source's samples are not read when its loader is built
    loader = build_loader(config, "train", source=source)
    with pytest.raises(error, match=r"workers\.timeout" + (r".*the loader has been reading flaky:b_green/n_02\.png"
                                                             if backend == "dali" else "")):
        delivered(loader)  # sample 8 is in the second batch


def test_a_closed_or_dropped_loader_lets_go_of_its_source(table):
    """The table of opened sources keeps a source only while a loader reads it: a long process
    that builds loader after loader does not keep every source it ever read."""
    import weakref

    from fastloader.sources.protocol import SourceReadError, opened
    _, db = table
    with build_loader(sqlite_config(db), "train") as loader:
        token = loader.index.reader
        assert opened(token).name == str(db)
    with pytest.raises(SourceReadError, match="is not open in this process"):
        opened(token)
    loader = build_loader(sqlite_config(db), "train")
    source = weakref.ref(opened(loader.index.reader))
    del loader
    assert source() is None


def test_a_source_whose_length_changes_between_epochs_is_refused(table):
    _, db = table
    loader = build_loader(sqlite_config(db), "train")
    delivered(loader)
    import sqlite3
    with sqlite3.connect(db) as connection:
        connection.execute("DELETE FROM images WHERE name = 'a_red/n_00.png'")
    connection.close()
    with pytest.raises(RuntimeError, match=r"had 18 samples when the loader was built and has 17 now"):
        delivered(loader)


@pytest.mark.parametrize("case, message", [
    (lambda db: {"source": "no_such_package.mod:make"}, r"train\.source: 'no_such_package\.mod:make': the module "
                                                        r"'no_such_package\.mod' does not import"),
    (lambda db: {"source": "fastloader.sources.sqlite_table:NoSuch"}, r"has no callable 'NoSuch'"),
    (lambda db: {"source": SQLITE, "source_args": {"path": str(db), "colour": 1}},
     r"train\.source_args: \['colour', 'path'\] do not fit .*SQLiteSource\(path: 'str', table: 'str' = 'images'.*"
     r"unexpected keyword argument 'colour'"),
    (lambda db: {"source": "builtins:dict"}, r"train\.source: builtins:dict: dict object is not a source: it lacks "
                                             r"name \(a str\), samples\(\), read\(\), identity\(\)"),
    (lambda db: {"source": "builtins:dict", "folder": "x"}, r"train\.folder: split 'train' reads its samples from "
                                                            r"train\.source; remove train\.folder"),
    (lambda db: {"source": "not a path"}, r"train\.source: must be 'package\.module:factory'"),
    (lambda db: {"folder": "train", "source_args": {"x": 1}}, r"train\.source_args: are the arguments of "
                                                              r"train\.source's factory"),
])
def test_a_source_that_cannot_be_made_is_named_with_the_fix(table, case, message):
    _, db = table
    config = base_config(db.parent, train=case(db))
    del config["val"]
    with pytest.raises(ConfigError, match=message):
        build_loader(config, "train")


def test_an_object_that_is_no_source_and_labels_out_of_range_are_named(tmp_path):
    config = base_config(tmp_path, train={"mode": "eval"})
    with pytest.raises(ConfigError, match=r"build_loader\(source=\.\.\.\): object object is not a source: it lacks "
                                          r"name \(a str\), samples\(\), read\(\), identity\(\)"):
        build_loader(config, "train", source=object())
    _, rows, classes = numbered_images(tmp_path)
    rows[4] = (rows[4][0], rows[4][1], 3)
    with pytest.raises(ConfigError, match=r"source 'flaky' \(train\): sample 4 \('a_red/n_04\.png'\): label 3 out "
                                          r"of range"):
        build_loader(config, "train", source=Flaky(rows, classes, bad=-1))
    rows[4] = rows[5]
    with pytest.raises(ConfigError, match=r"'a_red/n_05\.png' names two samples"):
        build_loader(config, "train", source=Flaky(rows, classes, bad=-1))


class Items(torch.utils.data.Dataset):
    """A map-style Dataset of (image, label), the image as `kind` gives it."""

    def __init__(self, rows, folder: Path, kind: str, targets: bool):
        self.rows, self.folder, self.kind = rows, folder, kind
        self.classes = ["a_red", "b_green", "c_blue"]
        if targets:
            self.targets = [label for _, _, label in rows]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, item):
        name, data, label = self.rows[item]
        if self.kind == "bytes":
            return data, label
        if self.kind == "path":
            return str(self.folder / name), label
        image = Image.open(io.BytesIO(data)).convert("RGB")
        if self.kind == "pil":
            return image, label
        if self.kind == "array":
            return np.asarray(image), label
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1), label  # CHW tensor


@pytest.mark.parametrize("kind, backend, targets", [
    ("bytes", "torch", True), ("path", "torch", False), ("pil", "torch", True), ("array", "torch", False),
    ("tensor", "torch", True), ("bytes", "dali", True), ("array", "dali", True)])
def test_a_datasets_items_of_each_kind_give_its_folders_pixels(tmp_path, kind, backend, targets):
    folders, rows, _ = numbered_images(tmp_path)
    split = {"mode": "eval", "batch_size": 18}
    config = base_config(tmp_path, backend=backend, train=split)
    loader = build_loader(config, "train", source=from_dataset(Items(rows, folders / "train", kind, targets)))
    images, labels = next(iter(loader))
    expected, expected_labels = next(iter(build_loader(base_config(folders, backend=backend, train=split), "train")))
    assert torch.equal(images, expected) and labels.tolist() == expected_labels.tolist()
    assert loader.classes == ("a_red", "b_green", "c_blue") and loader.index.path(7) == f"{loader.index.root}:07"


def test_the_commands_and_the_uint8_cache_read_a_source(table, tmp_path):
    folders, db = table
    config = sqlite_config(db, mode="eval", batch_size=6)
    path = tmp_path / "sqlite.yaml"
    path.write_text(json.dumps({**config, "dataset": {"cache": str(tmp_path / "cache")}}))
    env = cpu_only_env(tmp_path / "home")

    def run(*args):
        done = subprocess.run([sys.executable, "-m", "fastloader.cli", *args], capture_output=True, text=True,
                              env=env, timeout=240)
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    assert "18 images" in run("check", str(path))
    assert "split train: 18 images," in run("cache", str(path), "--split", "train", "--short-side", "40")
    run("pack", str(path), "--split", "train", "--out", str(tmp_path / "shards"))
    assert len(list((tmp_path / "shards").glob("*.tar"))) >= 1
    cached = build_loader({**config, "dataset": {"cache": str(tmp_path / "cache")}}, "train")
    assert cached.pixels_from == f"the cache {tmp_path / 'cache' / 'train'}"
    assert sorted(delivered(cached)[0]) == sorted(delivered(build_loader(config, "train"))[0])


# -- what a source's read() and samples() give (issues 56, 57, 60) ----------------------------------

class OneBuffer(Flaky):
    """A blob client's way: every read into one reused buffer (`how`: the same bytearray, resized for
    each object, or a memoryview of a larger one)."""

    def __init__(self, rows, classes, how: str):
        super().__init__(rows, classes, bad=-1)
        self.how = how
        self.buffer = bytearray(max(len(data) for _, data, _ in rows) + 4096)

    def read(self, item):
        data = self.rows[item][1]
        if self.how == "resized":
            self.buffer[:] = data  # resized in place: a buffer another holder exported cannot be
            return self.buffer
        self.buffer[:len(data)] = data
        return memoryview(self.buffer)[:len(data)]


@pytest.mark.parametrize("how", ["resized", "view"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_source_that_reads_into_one_reused_buffer_gives_each_sample_its_own_pixels(tmp_path, backend, how):
    """DALI took the source's buffer itself (no_copy): every sample of a batch decoded from the last
    read's bytes, silently; a resized buffer raised BufferError. What a read gives is copied now."""
    folders, rows, classes = numbered_images(tmp_path)
    config = base_config(tmp_path, backend=backend, train={"mode": "eval", "batch_size": 6})
    expected = delivered(build_loader(base_config(folders, backend=backend, train={"mode": "eval",
                                                                                      "batch_size": 6}), "train"))
    loader = build_loader(config, "train", source=OneBuffer(rows, classes, how))
    assert delivered(loader) == expected and loader.bad_samples == []


class Decoded16(Flaky):
    """Each sample as the PIL image Image.open gives for a 16-bit greyscale PNG (mode I;16)."""

    def read(self, item):
        return Image.open(io.BytesIO(self.rows[item][1]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_16_bit_pil_image_from_a_source_is_scaled_as_the_same_png_as_bytes_is(tmp_path, backend):
    values = [1000, 30000, 65535]
    rows = []
    for label, value in enumerate(values):
        buffer = io.BytesIO()
        Image.fromarray(np.full((24, 32), value, dtype=np.uint16)).save(buffer, format="PNG")
        rows.append((f"grey{label}.png", buffer.getvalue(), label))
    assert Image.open(io.BytesIO(rows[0][1])).mode == "I;16"
    config = base_config(tmp_path, backend=backend, train={"mode": "eval", "batch_size": 3})
    as_bytes = build_loader(config, "train", source=Flaky(rows, ["a", "b", "c"], bad=-1))
    as_images = build_loader(config, "train", source=Decoded16(rows, ["a", "b", "c"], bad=-1))
    (bytes_images, _), (pil_images, _) = next(iter(as_bytes)), next(iter(as_images))
    if backend == "torch":  # Pillow decodes the bytes: the same scaling
        assert torch.equal(bytes_images, pil_images)
    else:  # DALI decodes the bytes itself, rounding v / 257 where Pillow's path shifts: 1 grey level at most
        assert (bytes_images - pil_images).abs().max() <= 1 / 255 / 0.224 + 1e-6
    grey = (pil_images[:, 0, 16, 16] * 0.229 + 0.485) * 255  # the red channel back in 0..255
    assert grey.round().tolist() == [value >> 8 for value in values]  # not clipped to white (255)


class Huge(Flaky):
    """Sample 2 is a decoded image whose shape claims 40000 x 40000 x 3 (a broadcast: 3 bytes of memory)."""

    def read(self, item):
        if item == 2:
            return np.broadcast_to(np.zeros((1, 1, 3), dtype=np.uint8), (40000, 40000, 3))
        return self.rows[item][1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_decoded_image_of_bomb_size_is_refused_from_its_shape(tmp_path, backend):
    """Copied into a PPM before dataset.max_pixels was checked: 4.8 GB allocated first. Now refused,
    named, before a byte is copied."""
    import resource

    _, rows, classes = numbered_images(tmp_path)
    config = base_config(tmp_path, backend=backend, train={"mode": "eval", "batch_size": 6})
    loader = build_loader(config, "train", source=Huge(rows, classes, bad=-1))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert len(delivered(loader)[0]) == 17
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20  # KiB: not gigabytes
    (path, reason), = loader.bad_samples
    assert path == "flaky:a_red/n_02.png" and "a decoded image of 40000 x 40000 pixels" in reason
    assert "more than dataset.max_pixels (178,956,970)" in reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sqlite_table_rewritten_under_a_running_loader_stops_the_run_naming_it(table, backend):
    """The same row count, other rows at the old rowids (a rebuild with the rows in another order):
    another image under each label, silently. Each read now checks the row's name and label."""
    import sqlite3

    from fastloader.errors import SourceChanged

    _, db = table
    loader = build_loader(sqlite_config(db, backend, mode="eval", batch_size=2), "train")
    batches = iter(loader)
    next(batches)  # then, mid-epoch, the same names and labels written back in reverse order
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT name, image, label FROM images ORDER BY rowid DESC").fetchall()
        connection.execute("DELETE FROM images")
        connection.executemany("INSERT INTO images (rowid, name, image, label) VALUES (?, ?, ?, ?)",
                               [(rowid, *row) for rowid, row in enumerate(rows, 1)])
    connection.close()
    with pytest.raises(SourceChanged, match=r"train\.sqlite: table images's row \d+ holds '\w+/n_\d+\.png' \(label "
                                            r"\d\) now, and held '\w+/n_\d+\.png' \(label \d\) when the loader was "
                                            r"built: the table was rewritten"):
        list(batches)
    again = build_loader(sqlite_config(db, backend, mode="eval", batch_size=6), "train")
    with pytest.raises(SourceChanged, match="changed since the loader was built .its identity"):
        for _ in range(2):  # read before a rewrite in place of the same length, refused at the next epoch
            delivered(again)
            with sqlite3.connect(db) as connection:
                connection.execute("UPDATE images SET label = 2 - label")  # relabelled in place
            connection.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dataset_that_reorders_its_items_stops_the_run_naming_it(tmp_path, backend):
    """It lost two thirds of its samples as 'bad' and trained on; now the run stops at the first
    read that finds another label, on both backends."""
    from fastloader.errors import SourceChanged

    folders, rows, _ = numbered_images(tmp_path)
    dataset = Items(rows, folders / "train", "bytes", targets=True)
    config = base_config(tmp_path, backend=backend, train={"mode": "eval", "batch_size": 18})
    loader = build_loader(config, "train", source=from_dataset(dataset))
    dataset.rows = rows[::-1]
    with pytest.raises(SourceChanged, match="item 0's label is 2 now and was 0 when the loader was built: the "
                                            "dataset changed its items"):
        delivered(loader)


class Triples(Items):
    def __getitem__(self, item):
        image, label = super().__getitem__(item)
        return image, label, {"id": item}


class Dicts(Items):
    def __getitem__(self, item):
        image, label = super().__getitem__(item)
        return {"image": image, "label": label, "id": item}


class FloatLabels(Items):
    def __getitem__(self, item):
        image, label = super().__getitem__(item)
        return image, [0.3 / 0.1, 1.0, 1.5][label] if item in (0, 6, 12) else label


def test_a_datasets_items_are_pairs_or_image_label_dicts_and_labels_class_numbers(tmp_path):
    """A triple read 'too many values to unpack' at every read, and a train loader yielded empty
    batches for ever; float labels were truncated (0.3 / 0.1 became class 2). Now a triple and a
    float label are refused when the loader is built, naming the item; dicts with `image` and
    `label` keys (Hugging Face's items) are read as pairs."""
    folders, rows, _ = numbered_images(tmp_path)
    config = base_config(tmp_path, train={"mode": "eval", "batch_size": 18})
    with pytest.raises(ConfigError, match=r"item 0 is a tuple of 3 \(bytes, int, dict\); from_dataset takes "
                                          r"\(image, label\) pairs"):
        build_loader(config, "train", source=from_dataset(Triples(rows, folders / "train", "bytes", False)))
    with pytest.raises(ConfigError, match=r"item 0's label is 2\.9999999999999996 \(float\), not a class number"):
        build_loader(config, "train", source=from_dataset(FloatLabels(rows, folders / "train", "bytes", False)))
    dicts = build_loader(config, "train", source=from_dataset(Dicts(rows, folders / "train", "bytes", False)))
    pairs = build_loader(config, "train", source=from_dataset(Items(rows, folders / "train", "bytes", False)))
    assert delivered(dicts) == delivered(pairs)


class Gives(Flaky):
    """A source whose samples() gives `what(names, labels, classes)`."""

    def __init__(self, rows, classes, what):
        super().__init__(rows, classes, bad=-1)
        self.what = what

    def samples(self):
        return self.what(*super().samples())


@pytest.mark.parametrize("what, message", [
    (lambda n, labels, c: {"names": n, "labels": labels, "classes": c}, None),
    (lambda n, labels, c: ((name for name in n), labels, c), None),
    (lambda n, labels, c: {"files": n, "labels": labels},
     r"samples\(\) gave a dict with the keys \['files', 'labels'\]; give \(names, labels, classes\)"),
    (lambda n, labels, c: (n, labels), r"samples\(\) gave a tuple of 2; give \(names, labels, classes\)"),
    (lambda n, labels, c: (n, np.array([2**64 - 1] + labels[1:], dtype=np.uint64), c),
     r"sample 0 \('a_red/n_00\.png'\): label 18446744073709551615"),
    (lambda n, labels, c: ("a_red/n_00.png", labels, c), r"samples\(\) gave names as a str; give a sequence"),
])
def test_what_samples_gives_wrong_is_named_and_what_is_plainly_meant_is_taken(tmp_path, what, message):
    _, rows, classes = numbered_images(tmp_path)
    config = base_config(tmp_path, train={"mode": "eval", "batch_size": 18})
    source = Gives(rows, classes, what)
    if message is None:
        assert len(delivered(build_loader(config, "train", source=source))[0]) == 18
    else:
        with pytest.raises(ConfigError, match=r"source 'flaky' \(train\): " + message):
            build_loader(config, "train", source=source)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_source_whose_every_read_fails_is_an_error_not_an_epoch_of_empty_batches(tmp_path, backend, mode):
    """A train loader yielded len(loader) batches of shape [0, 3, H, W] every epoch after one warning."""
    _, rows, classes = numbered_images(tmp_path)
    source = Flaky(rows, classes, bad=-1)
    loader = build_loader(base_config(tmp_path, backend=backend, train={"mode": mode, "batch_size": 6}), "train",
                          source=source)
    source.read = lambda item: (_ for _ in ()).throw(ConnectionError("the blob service is down"))
    with pytest.raises(BadImageError, match=r"split 'train', epoch 0, rank 0: no sample could be read \(\d+ samples "
                                            r"failed so far, the first flaky:\w+/n_\d+\.png: .*ConnectionError: the "
                                            r"blob service is down\)"):
        for images, _ in loader:
            assert len(images) == 0


class FailsOnce(Flaky):
    """A blob service's reset connection: sample `bad`'s first read fails, later ones succeed."""

    def read(self, item):
        if self.armed and item == self.bad:
            self.armed = False
            raise ConnectionError("the blob service reset the connection")
        return self.rows[item][1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_read_that_fails_once_loses_its_sample_for_that_epoch_only(tmp_path, backend):
    """Both backends skipped it in that epoch; the torch backend read it again in the next (18 of 18),
    DALI left it out for the run (17 of 18) with no word. A read's failure now lasts its epoch."""
    _, rows, classes = numbered_images(tmp_path)
    source = FailsOnce(rows, classes, bad=5)
    loader = build_loader(base_config(tmp_path, backend=backend, train={"mode": "eval", "batch_size": 6}), "train",
                          source=source)
    source.armed = True
    counts = [len(delivered(loader)[1]) for _ in range(3)]
    assert counts == [17, 18, 18] and [path for path, _ in loader.bad_samples] == ["flaky:a_red/n_05.png"]


def test_source_args_are_shown_by_name_only_as_the_stores_options_are(table):
    """A source's arguments may hold a token or a connection string: `--set train.source_args.token=...`
    was shown in full in the cache's rebuild command, describe() and `bench --json`."""
    from fastloader import load_config
    from fastloader.config_dump import SECRET_PLACEHOLDER, config_to_dict, override_options

    _, db = table
    config = load_config(sqlite_config(db), ["train.source_args={path: " + str(db) + ", token: TOPSECRET-7}"])
    assert "TOPSECRET" not in repr(config_to_dict(config)) and "TOPSECRET" not in " ".join(override_options(config))
    assert config_to_dict(config)["train"]["source_args"] == {"path": "(set)", "token": "(set)"}
    import shlex
    assert f"token: '{SECRET_PLACEHOLDER}'" in shlex.split(" ".join(override_options(config)))[1]
    with build_loader(sqlite_config(db), "train") as loader:
        assert loader.describe()["config"]["train"]["source_args"] == {"path": "(set)"}


class Exits(Flaky):
    def read(self, item):
        if self.armed and item == self.bad:
            sys.exit(0)
        return self.rows[item][1]


@pytest.mark.parametrize("backend, workers", [("torch", 1), ("dali", 0)])
def test_a_source_whose_read_exits_stops_the_run_naming_it(tmp_path, backend, workers):
    """sys.exit() in a source's read(): torch said a worker 'exited unexpectedly', DALI named files."""
    from fastloader.errors import SourceError

    _, rows, classes = numbered_images(tmp_path)
    source = Exits(rows, classes, bad=5)
    source.armed = True  # before the workers fork (a source's read() is not called at build)
    config = base_config(tmp_path, backend=backend, workers={"num_workers": workers},
                         train={"mode": "eval", "batch_size": 6})
    loader = build_loader(config, "train", source=source)
    with pytest.raises(SourceError) as caught:
        delivered(loader)
    assert str(caught.value).startswith("flaky: read(5) of flaky:a_red/n_05.png called sys.exit(0): a source's read() "
                                        "runs in the loader's workers or threads, where it cannot end the process")


def test_a_sqlite_table_locked_by_a_writer_for_too_long_is_named_with_what_to_do(table, monkeypatch):
    """A bare `sqlite3.OperationalError: database is locked` came out of the epoch's length check."""
    from fastloader.errors import SourceError
    from fastloader.sources import sqlite_table

    monkeypatch.setattr(sqlite_table, "BUSY_S", 0.5)
    _, db = table
    loader = build_loader(sqlite_config(db, mode="eval", batch_size=6), "train")
    writer = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys, time\n"
                               "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                               "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(60)\n", str(db)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "locked"
        with pytest.raises(SourceError, match=r"train\.sqlite: the database is locked by another process's write "
                                              r"for more than 0\.5 s \(sqlite: database is locked\): let the writer "
                                              r"finish"):
            delivered(loader)  # the epoch's length check meets the lock
    finally:
        writer.kill()
        writer.wait()


class Mapped(Flaky):
    """A source that reads a file through an mmap it keeps open (cannot be pickled)."""

    def __init__(self, rows, classes, path):
        import mmap
        super().__init__(rows, classes, bad=-1)
        path.write_bytes(b"x" * 4096)
        with open(path, "rb") as handle:
            self.map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def test_where_workers_are_spawned_a_source_travels_to_them_or_is_refused_at_build(tmp_path, monkeypatch):
    """Off Linux (macOS, Windows) the torch backend's workers are spawned: a user's source failed in
    each ('the source is not open in this process', or "cannot pickle 'mmap.mmap'"), every sample bad
    and every batch empty with only warnings. A source that pickles is read there; one that does not
    is refused at build, with the reason and the fix. Real spawned workers here."""
    import multiprocessing

    import torch_loader.loader

    monkeypatch.setattr(torch_loader.loader, "fork_context", lambda: multiprocessing.get_context("spawn"))
    _, rows, classes = numbered_images(tmp_path)
    config = base_config(tmp_path, workers={"num_workers": 1}, train={"mode": "eval", "batch_size": 6})
    with build_loader(config, "train", source=Flaky(rows, classes, bad=-1)) as loader:
        assert len(delivered(loader)[1]) == 18 and loader.bad_samples == []
    with pytest.raises(ConfigError, match=r"the source 'flaky' cannot be pickled \(TypeError: cannot pickle "
                                          r"'mmap\.mmap' object\), and workers\.num_workers: 1 workers start by spawn "
                                          r"here"):
        build_loader(config, "train", source=Mapped(rows, classes, tmp_path / "mapped.bin"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_weights_file_names_a_sources_samples_as_samples_gives_them(table, backend, tmp_path, monkeypatch):
    """It wanted each name prefixed with the source's name taken as a path relative to dataset.root
    (for build_loader(source=obj): to the working folder), which changes with the folder the job runs
    in. Now the names samples() gave, from any folder."""
    _, db = table
    weights = tmp_path / "w.txt"
    weights.write_text("".join(f"{colour}/n_{i:02d}.png {0 if colour == 'a_red' else 1}\n"
                               for colour in ("a_red", "b_green", "c_blue") for i in range(6)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = sqlite_config(db, backend, weights=str(weights), epoch_size=60, batch_size=6)
    labels = delivered(build_loader(config, "train"))[1]
    assert len(labels) == 60 and 0 not in labels and {1, 2} == set(labels)  # red weighs 0


@pytest.fixture
def folder_and_table(tmp_path) -> tuple[Path, Path, list]:
    """The numbered dataset's train split as folders, its val split (colours of their own) as a table."""
    root = write_numbered_dataset(tmp_path / "folders", per_class=4, splits=("train", "val"))
    rows = [(f"{folder.name}/{path.name}", path.read_bytes(), label)
            for label, folder in enumerate(sorted((root / "val").iterdir())) for path in sorted(folder.iterdir())]
    write_table(str(tmp_path / "val.sqlite"), rows, [name for name in sorted(p.name for p in (root / "val").iterdir())])
    return root, tmp_path / "val.sqlite", rows


def joined_config(root: Path, db: Path, backend: str, **train) -> dict:
    return base_config(root, backend=backend, train={"batch_size": 4, "sources": [
        {"folder": "train", "name": "disk"},
        {"source": SQLITE, "source_args": {"path": str(db)}, "name": "table"}], **train})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_users_source_joins_a_folder_in_one_splits_sources_every_sample_once(folder_and_table, backend):
    """`sources:` takes your own source beside a folder (issue 59.1): the split reads both, every
    sample once with its own label, on both backends; the names say which source holds each."""
    root, db, rows = folder_and_table
    loader = build_loader(joined_config(root, db, backend, mode="eval", batch_size=5), "train")
    whole = build_loader(base_config(root, backend=backend, train={"mode": "eval", "batch_size": 5},
                                     val={"mode": "eval", "batch_size": 5}), "train")
    tabled = build_loader(sqlite_config(db, backend, mode="eval", batch_size=5), "train")
    assert loader.num_samples == 24 and loader.classes == ("a_red", "b_green", "c_blue")
    assert loader.index.entry_names == ("disk", "table") and loader.index.entry.tolist() == [0] * 12 + [1] * 12
    assert loader.index.relpath(0) == "disk/a_red/n_00.png" and loader.index.relpath(12) == "table/a_red/n_00.png"
    colours, labels = delivered(loader)
    expected = sorted(zip(*delivered(whole))) + sorted(zip(*delivered(tabled)))
    assert len(set(colours)) == 24 and sorted(zip(colours, labels)) == sorted(expected)


def test_weights_share_draws_between_a_folder_and_a_users_source(folder_and_table):
    root, db, _ = folder_and_table
    config = joined_config(root, db, "torch", epoch_size=2000, batch_size=100)
    config["train"]["sources"][0]["weight"], config["train"]["sources"][1]["weight"] = 3, 1
    loader = build_loader(config, "train")
    colours, _ = delivered(loader)
    from_table = set(delivered(build_loader(sqlite_config(db, "torch", mode="eval", batch_size=12), "train"))[0])
    share = sum(colour in from_table for colour in colours) / len(colours)
    assert len(colours) == 2000 and 0.2 < share < 0.3  # 1 part in 4 from the table


def test_a_users_source_among_sources_is_named_by_its_key_when_it_fails(folder_and_table):
    root, db, _ = folder_and_table
    config = joined_config(root, db, "torch")
    config["train"]["sources"][1]["source_args"] = {"path": str(db), "tabel": "images"}
    with pytest.raises(ConfigError, match=r"train\.sources\[1\]\.source_args: \['path', 'tabel'\] do not fit"):
        build_loader(config, "train")
    config["train"]["sources"][0]["source_args"] = {"path": str(db)}
    with pytest.raises(ConfigError, match=r"train\.sources\[0\]\.source_args: are the arguments of a source's own"):
        build_loader(config, "train")
