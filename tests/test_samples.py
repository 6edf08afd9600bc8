"""SampleIndex: ImageFolder labels, deterministic order, file lists, numpy storage, clear errors."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image

from fastloader import load_config
from fastloader.errors import ConfigError
from fastloader.samples import IndexBuilder, SampleIndex
from fastloader.schema import IMAGE_EXTENSIONS
from fastloader.sources.file_list import _first_repeat, read_file_list
from fastloader.sources.folder import scan_folder
from fastloader.sources.formats import build_index


def index_of_lists(root: str, classes, relpaths, labels) -> SampleIndex:
    """An index of these relative paths and labels, built as the formats build theirs."""
    builder = IndexBuilder()
    for path, label in zip(relpaths, labels, strict=True):
        builder.add(path, label)
    return builder.build(root, classes)


def touch_image(path, colour=(1, 2, 3)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), colour).save(path, format="PNG")


def test_folder_scan_follows_imagefolder_labels_and_sorted_order(tmp_path):
    split = tmp_path / "train"
    for rel in ["dog/b.JPG", "dog/a.jpeg", "dog/sub/c.Png", "cat/z.webp", "Zebra/1.png", "cat/notes.txt",
                "cat/.hidden/x.txt"]:
        touch_image(split / rel) if not rel.endswith(".txt") else (split / rel).parent.mkdir(parents=True,
                                                                                            exist_ok=True)
    (split / "cat" / "notes.txt").write_text("not an image")
    index = scan_folder(str(split), IMAGE_EXTENSIONS)
    assert index.classes == ("Zebra", "cat", "dog")  # sorted as strings, like torchvision
    assert [index.relpath(i) for i in range(len(index))] == [
        "Zebra/1.png", "cat/z.webp", "dog/a.jpeg", "dog/b.JPG", "dog/sub/c.Png"]
    assert index.labels.tolist() == [0, 1, 2, 2, 2]
    assert index.path(3) == str(split / "dog" / "b.JPG")


def test_index_is_three_numpy_arrays_not_python_strings(tmp_path):
    index = index_of_lists(str(tmp_path), ["a", "b"], ["a/1.jpg", "b/ü 2.jpg"], [0, 1])
    assert isinstance(index.path_bytes, np.ndarray) and index.path_bytes.dtype == np.uint8
    assert index.offsets.tolist() == [0, 7, 17]  # "ü" is two bytes
    assert index.labels.dtype == np.int64
    assert [index.relpath(i) for i in range(2)] == ["a/1.jpg", "b/ü 2.jpg"]
    assert index.nbytes == 17 + 3 * 8 + 2 * 8
    assert index.class_counts().tolist() == [1, 1]


def test_empty_class_folder_keeps_its_label_and_warns(tmp_path, caplog):
    touch_image(tmp_path / "val" / "a" / "1.png")
    (tmp_path / "val" / "b").mkdir()
    touch_image(tmp_path / "val" / "c" / "1.png")
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        index = scan_folder(str(tmp_path / "val"), IMAGE_EXTENSIONS)
    assert index.classes == ("a", "b", "c") and index.labels.tolist() == [0, 2]
    assert any("holds no image files" in r.message and "label 1" in r.message for r in caplog.records)


def test_explicit_class_list_fixes_labels_across_splits(tmp_path):
    touch_image(tmp_path / "val" / "c" / "1.png")
    config = load_config({"dataset": {"root": str(tmp_path), "classes": ["a", "b", "c"]}, "val": {}})
    index = build_index(config, config.split("val"))
    assert index.classes == ("a", "b", "c") and index.labels.tolist() == [2]


def test_missing_folders_and_empty_splits_are_explained(tmp_path):
    (tmp_path / "train" / "cls").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"split folder '.*/val' does not exist \(folders in dataset.root: "
                                          r"train\): make it \(.*\), set val.folder to the folder that holds"):
        config = load_config({"dataset": {"root": str(tmp_path)}, "val": {}})
        build_index(config, config.split("val"))
    with pytest.raises(ConfigError, match="dataset.root: folder '.*/nowhere' does not exist"):
        scan_folder(str(tmp_path / "nowhere" / "train"), IMAGE_EXTENSIONS)
    with pytest.raises(ConfigError, match="no image files under"):
        scan_folder(str(tmp_path / "train"), IMAGE_EXTENSIONS)
    (tmp_path / "flat").mkdir()
    touch_image(tmp_path / "flat" / "1.png")
    with pytest.raises(ConfigError, match="has no class folders"):
        scan_folder(str(tmp_path / "flat"), IMAGE_EXTENSIONS)


def test_file_list_with_spaces_comments_and_labels(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("# path label\n\nimgs/a b.jpg 1\nimgs/c.jpg   0\n/abs/d.jpg 3\n")
    index = read_file_list(str(listing), str(tmp_path))
    assert [index.relpath(i) for i in range(3)] == ["imgs/a b.jpg", "imgs/c.jpg", "/abs/d.jpg"]
    assert index.labels.tolist() == [1, 0, 3] and index.classes == ("0", "1", "2", "3")
    assert index.path(0) == str(tmp_path / "imgs/a b.jpg") and index.path(2) == "/abs/d.jpg"


def test_file_list_errors_name_file_and_line(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("a.jpg 0\nb.jpg\n")
    with pytest.raises(ConfigError, match=r"list.txt:2: expected 'relative/path label' \(the label an integer or a "
                                          r"class name\), got 'b.jpg'$"):
        read_file_list(str(listing), str(tmp_path))
    listing.write_text("a.jpg 0\nb.jpg cat\n")
    with pytest.raises(ConfigError, match=r"list.txt:2: line 1 gives an integer label and line 2 a class name: "
                                          r"without dataset.classes a list gives one kind; write every label as a "
                                          r"class name, or set dataset.classes"):
        read_file_list(str(listing), str(tmp_path))
    listing.write_text("a.jpg 5\n")
    with pytest.raises(ConfigError, match=r"list.txt:1: label 5 out of range \(dataset.classes has 2 names\)"):
        read_file_list(str(listing), str(tmp_path), classes=["x", "y"])
    listing.write_text("a.jpg cat\nb.jpg dgo\n")
    with pytest.raises(ConfigError, match=r"list.txt:2: class 'dgo' is not in dataset.classes \(closest: 'dog'\); "
                                          r"fix the label, or add the class to dataset.classes"):
        read_file_list(str(listing), str(tmp_path), classes=["cat", "dog"])
    listing.write_text("my photo.jpg\n")  # no label, a space in the name: never the class 'photo.jpg'
    with pytest.raises(ConfigError, match=r"list.txt:1: expected 'relative/path label' \(.*\), got 'my photo.jpg', "
                                          r"whose last word is a file, not a label: add the label after the path"):
        read_file_list(str(listing), str(tmp_path))


def test_a_file_list_of_class_names_takes_them_from_dataset_classes_or_from_the_lists(tmp_path):
    """The ImageNet way of writing a list (`n04243546/x.JPEG n04243546`): names are labels."""
    listing = tmp_path / "list.txt"
    listing.write_text("n04243546/x.JPEG n04243546\nn01440764/y.JPEG n01440764\nn04243546/z.JPEG n04243546\n")
    index = read_file_list(str(listing), str(tmp_path), classes=["n01440764", "n02102040", "n04243546"])
    assert index.labels.tolist() == [2, 0, 2] and index.classes == ("n01440764", "n02102040", "n04243546")
    index = read_file_list(str(listing), str(tmp_path))  # the list names the classes: sorted, as class folders
    assert index.labels.tolist() == [1, 0, 1] and index.classes == ("n01440764", "n04243546")
    other = tmp_path / "train.txt"  # another split's list has a class this one lacks: the labels stay aligned
    other.write_text("# path label\nn02102040/w.JPEG n02102040\nn01440764/v.JPEG n01440764\n")
    index = read_file_list(str(listing), str(tmp_path), other_lists=[str(other)])
    assert index.labels.tolist() == [2, 0, 2] and index.classes == ("n01440764", "n02102040", "n04243546")


def test_a_config_whose_file_lists_name_classes_labels_each_split_alike(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    (tmp_path / "train.txt").write_text("a/1.jpg cat\nb/2.jpg dog\nc/3.jpg emu\n")
    (tmp_path / "val.txt").write_text("c/4.jpg emu\na/5.jpg cat\n")
    config = load_config({"dataset": {"root": str(tmp_path)}, "train": {"file_list": str(tmp_path / "train.txt")},
                          "val": {"file_list": str(tmp_path / "val.txt")}})
    train, val = build_index(config, config.splits["train"]), build_index(config, config.splits["val"])
    assert train.classes == val.classes == ("cat", "dog", "emu")
    assert train.labels.tolist() == [0, 1, 2] and val.labels.tolist() == [2, 0]


def test_file_list_paths_are_normalized_to_one_name_per_file(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "root").symlink_to(tmp_path / "real")  # dataset.root through a link: its real path is under it too
    listing = tmp_path / "list.txt"
    listing.write_text(f"./imgs/a.jpg 0\nimgs//b.jpg 0\nimgs/x/../c.jpg 0\n{tmp_path}/root/imgs/d.jpg 1\n"
                       f"{tmp_path}/real/imgs/e.jpg 1\n/elsewhere/./f.jpg 1\n../g.jpg 1\n")
    index = read_file_list(str(listing), str(tmp_path / "root"))
    assert [index.relpath(i) for i in range(len(index))] == [
        "imgs/a.jpg", "imgs/b.jpg", "imgs/c.jpg", "imgs/d.jpg", "imgs/e.jpg", "/elsewhere/f.jpg", "../g.jpg"]
    assert index.path(3) == str(tmp_path / "root" / "imgs" / "d.jpg") and index.path(5) == "/elsewhere/f.jpg"


def test_a_file_named_on_two_lines_is_refused_with_both_lines(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("a.jpg 0\nb.jpg 1\n# a comment\nc.jpg 1\n./b.jpg 1\na.jpg 0\n")
    with pytest.raises(ConfigError, match=r"list.txt:5: names 'b.jpg' again \(first on line 2\), so one file would "
                                          r"be two samples; remove one of the two lines, or weigh the file with "
                                          r"<split>.weights"):
        read_file_list(str(listing), str(tmp_path))
    listing.write_text(f"a.jpg 0\n{tmp_path}/a.jpg 0\n")
    config = load_config({"dataset": {"root": str(tmp_path)}, "train": {"file_list": str(listing)}})
    with pytest.raises(ConfigError, match=r"^train.file_list: .*list.txt:2: names 'a.jpg' again \(first on line 1\)"
                                          r".* or weigh the file with train.weights$"):
        build_index(config, config.split("train"))


def test_a_name_given_twice_is_found_past_hash_collisions():
    index = index_of_lists("/r", ["0"], ["a", "b", "c", "b", "a"], [0] * 5)
    assert _first_repeat(index, np.array([7, 7, 3, 7, 7])) == 3  # one hash for a and b: their names decide
    assert _first_repeat(index.take([0, 1, 2]), np.array([7, 7, 7])) is None


def test_split_file_list_key_is_used_instead_of_scanning(tmp_path):
    touch_image(tmp_path / "data" / "x.png")
    (tmp_path / "train.txt").write_text("x.png 1\n")
    config_path = tmp_path / "c.yaml"
    config_path.write_text("dataset: {root: data, classes: [cats, dogs]}\ntrain: {file_list: train.txt}\n")
    config = load_config(config_path)
    index = build_index(config, config.split("train"))
    assert index.path(0) == str(tmp_path / "data" / "x.png") and index.classes == ("cats", "dogs")


def test_exclude_list_leaves_files_out_of_folder_and_file_list_splits(tmp_path, caplog):
    for rel in ["train/cat/a.png", "train/cat/b.png", "train/dog/c.png", "val/cat/d.png", "val/dog/e.png"]:
        touch_image(tmp_path / "data" / rel)
    exclude = tmp_path / "bad.txt"
    absolute = tmp_path / "data" / "val" / "dog" / "e.png"
    exclude.write_text(f"# written by fastloader check\ntrain/cat/b.png\n{absolute}\n")
    (tmp_path / "data" / "list.txt").write_text("train/cat/a.png 0\ntrain/cat/b.png 0\ntrain/dog/c.png 1\n")
    config = load_config({"dataset": {"root": str(tmp_path / "data"), "exclude": str(exclude)},
                          "train": {}, "val": {},
                          "listed": {"mode": "eval", "file_list": str(tmp_path / "data" / "list.txt")}})
    with caplog.at_level(logging.INFO, logger="fastloader"):
        train = build_index(config, config.split("train"))
    assert [train.relpath(i) for i in range(len(train))] == ["cat/a.png", "dog/c.png"]
    assert "1 left out by dataset.exclude" in caplog.text
    val = build_index(config, config.split("val"))
    assert [val.relpath(i) for i in range(len(val))] == ["cat/d.png"] and val.classes == ("cat", "dog")
    listed = build_index(config, config.split("listed"))
    assert [listed.relpath(i) for i in range(len(listed))] == ["train/cat/a.png", "train/dog/c.png"]
    missing = load_config({"dataset": {"root": str(tmp_path / "data"), "exclude": str(tmp_path / "nope.txt")},
                           "train": {}})
    with pytest.raises(ConfigError, match="dataset.exclude: file .*nope.txt' does not exist; write it with "
                                          "`fastloader check CONFIG --exclude-list"):
        build_index(missing, missing.split("train"))


def test_without_drops_samples_and_keeps_the_rest_in_order():
    index = index_of_lists("/r", ["a", "b"], ["a/1.jpg", "a/2.jpg", "b/é 3.jpg", "b/4.jpg"], [0, 0, 1, 1])
    kept = index.without([1, 3])
    assert [kept.relpath(i) for i in range(len(kept))] == ["a/1.jpg", "b/é 3.jpg"]
    assert kept.labels.tolist() == [0, 1] and kept.excluded == 2
    assert kept.fingerprint != index.fingerprint
    assert len(index.without([])) == 4


def test_a_batch_of_locations_is_each_samples_own_location():
    """The DALI feed asks for a batch's locations at once (SampleIndex.locations): each is what
    location(i) gives, for files (a path outside the root stays absolute, names that are not UTF-8
    keep their bytes), tar members (header digests, container identities) and parquet rows."""
    import dataclasses

    from fastloader.locations import Identity
    from fastloader.samples import ByteRanges
    odd = b"b/\xff.jpg".decode("utf-8", "surrogateescape")
    names = ["a/1.jpg", "b/é 2.jpg", "/elsewhere/3.jpg", odd, "a/5.jpg"]
    order = np.array([4, 0, 2, 3, 1, 2])
    for root in ("/r", "/r/", ""):
        index = index_of_lists(root, ["a", "b"], names, [0, 1, 0, 1, 0])
        assert index.locations(order) == [index.location(i) for i in order.tolist()]
    index = index_of_lists("/s", ["a", "b"], [f"s{i % 2}.tar:m{i}.jpg" for i in range(5)], [0, 1, 0, 1, 0])
    ranges = ByteRanges(("/s/s0.tar", "/s/s1.tar"), np.array([0, 1, 0, 1, 0], dtype=np.int32),
                        np.arange(5, dtype=np.int64) * 1024 + 512, np.arange(5, dtype=np.int64) + 100,
                        np.arange(5, dtype=np.int64) + 7, (Identity(1, 2, 3, 4), Identity(5, 6, 7, 8)))
    for kept in (ranges, dataclasses.replace(ranges, header=None, identities=None),
                 dataclasses.replace(ranges, table_row=np.array([0, 3, 0, 1, 2]), columns=("image", None))):
        shards = dataclasses.replace(index, ranges=kept)
        locations = shards.locations(order)
        assert locations == [shards.location(i) for i in order.tolist()]
        assert locations[0].start == 4 * 1024 + 512 and locations[0].file == "/s/s0.tar"
