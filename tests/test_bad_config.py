"""Every way a config or a dataset folder can be wrong gets one clear message, on both backends
(errors are raised before a backend is built, so both must give the same)."""
from __future__ import annotations

import logging
import re

import pytest
import torch
from conftest import base_config, write_solid_dataset

from fastloader import build_loader
from fastloader.errors import BadImageError, ConfigError

BACKENDS = ["torch", "dali"]


def folder_without_classes(root):
    (root / "val").mkdir(parents=True)
    (root / "val" / "stray.jpg").write_bytes(b"")


def folder_without_images(root):
    (root / "val" / "a").mkdir(parents=True)
    (root / "val" / "a" / "notes.txt").write_text("no images here")


def folder_without_split(root):
    (root / "train" / "a").mkdir(parents=True)


def file_list_with_a_missing_file(root):
    write_solid_dataset(root, per_class=2, splits=("val",))
    (root / "list.txt").write_text("val/a_red/img_00.png 0\nval/a_red/gone.png 0\nval/b_green/img_01.png 1\n")


def file_list_with_a_label_out_of_range(root):
    write_solid_dataset(root, per_class=2, splits=("val",))
    (root / "list.txt").write_text("val/a_red/img_00.png 0\nval/b_green/img_01.png 7\n")


def every_file_broken(root):
    (root / "val" / "a").mkdir(parents=True)
    for name in ("x.jpg", "y.jpg"):
        (root / "val" / "a" / name).write_bytes(b"<html>404</html>")


CASES = {
    # name: (prepare the folder, config sections, error type, message fragment)
    "missing root": (None, {"dataset": {"root": "/nonexistent/imagenet"}}, ConfigError,
                     "dataset.root: folder '/nonexistent/imagenet' does not exist; set dataset.root"),
    "root without class folders": (folder_without_classes, {}, ConfigError, "has no class folders; expected"),
    "missing split folder": (folder_without_split, {}, ConfigError,
                             "split folder .*val' does not exist \\(folders in dataset.root: train\\): make it "
                             "\\(.*set val.folder"),
    "no images at all": (folder_without_images, {}, ConfigError, "val.folder: no image files under .*check "
                                                                   "dataset.root and dataset.extensions"),
    "every file broken": (every_file_broken, {}, BadImageError,
                          "none of the 2 files in .* can be decoded \\(the first, "
                          ".*x.jpg': not an image: an HTML or XML page"),
    "batch_size 0": (None, {"val": {"batch_size": 0}}, ConfigError,
                     "val.batch_size: must be an integer in \\[1, 65536\\], got 0"),
    "batch_size -3": (None, {"val": {"batch_size": -3}}, ConfigError,
                      "val.batch_size: must be an integer in \\[1, 65536\\], got -3"),
    "unknown backend": (None, {"backend": "tensorrt"}, ConfigError, "backend: expected one of 'auto', 'dali', 'torch', "
                                                                     "got 'tensorrt'"),
    "wrong type": (None, {"val": {"batch_size": "large"}}, ConfigError,
                   "val.batch_size: expected an integer, got 'large'"),
    "unknown key": (None, {"val": {"bacth_size": 8}}, ConfigError, "unknown key 'val.bacth_size'; did you mean "
                                                                    "'val.batch_size'\\?"),
    "mean of the wrong length": (None, {"normalize": {"mean": [0.5, 0.5]}}, ConfigError,
                                 "normalize.mean: expected a list of 3 numbers, got 2 values"),
    "std of the wrong length": (None, {"normalize": {"std": [0.2, 0.2, 0.2, 0.2]}}, ConfigError,
                                "normalize.std: expected a list of 3 numbers, got 4 values"),
    "label out of range": (file_list_with_a_label_out_of_range, {"val": {"file_list": "LIST"}, "dataset": {
        "classes": ["a_red", "b_green", "c_blue"]}}, ConfigError, "list.txt:2: label 7 out of range \\(dataset.classes "
                                                                  "has 3 names\\)"),
    "unknown on_bad_image": (None, {"dataset": {"on_bad_image": "ignore"}}, ConfigError,
                             "dataset.on_bad_image: expected one of 'skip', 'raise', got 'ignore'"),
    "mixing in an eval split": (None, {"val": {"mixup": {"mixup_alpha": 0.2}}}, ConfigError,
                                "val.mixup: applies only to train mode, and split 'val' has mode: eval: eval batches "
                                "are never repeated, mixed or smoothed; remove val.mixup, or set val.mode: train"),
    "label smoothing in an eval split": (None, {"val": {"label_smoothing": 0.1}}, ConfigError,
                                         "val.label_smoothing: applies only to train mode.*remove val.label_smoothing"),
    "repeats in an eval split": (None, {"val": {"aug_repeats": 3}}, ConfigError,
                                 "val.aug_repeats: applies only to train mode.*remove val.aug_repeats"),
}

TRAIN_CASES = {  # the train split's keys, the message fragment
    "negative mixup alpha": ({"mixup": {"mixup_alpha": -0.2}},
                             "train.mixup.mixup_alpha: must be a number >= 0 \\(0 turns mixup off\\), got -0.2"),
    "negative cutmix alpha": ({"mixup": {"cutmix_alpha": -1}},
                              "train.mixup.cutmix_alpha: must be a number >= 0 \\(0 turns cutmix off\\), got -1.0"),
    "prob above 1": ({"mixup": {"prob": 1.5}}, "train.mixup.prob: must be a probability in \\[0, 1\\], got 1.5"),
    "switch_prob below 0": ({"mixup": {"switch_prob": -0.1}},
                            "train.mixup.switch_prob: must be a probability in \\[0, 1\\], got -0.1"),
    "unknown mode": ({"mixup": {"mode": "pairs"}},
                     "train.mixup.mode: expected one of 'batch', 'pair', 'elem', got 'pairs'; did you mean 'pair'\\?"),
    "cutmix_minmax reversed": ({"mixup": {"cutmix_minmax": [0.8, 0.2]}},
                               "train.mixup.cutmix_minmax: must be null or 0 < min < max <= 1, got \\[0.8, 0.2\\]"),
    "label smoothing of 1": ({"label_smoothing": 1.0}, "train.label_smoothing: must be in \\[0, 1\\), got 1.0"),
    "aug_repeats 0": ({"aug_repeats": 0},
                      "train.aug_repeats: must be an integer in \\[1, 1024\\] \\(1: no repeats\\), got 0"),
    "unknown mixup key": ({"mixup": {"alpha": 0.2}}, "unknown key 'train.mixup.alpha'; did you mean"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", TRAIN_CASES)
def test_each_bad_mixing_or_repeats_key_gets_one_clear_message(tmp_path, case, backend):
    keys, fragment = TRAIN_CASES[case]
    root = write_solid_dataset(tmp_path / "data", per_class=1, splits=("train",))
    with pytest.raises(ConfigError, match=fragment):
        build_loader(base_config(root, backend=backend, train=keys), "train")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_each_bad_config_gets_one_clear_message(tmp_path, case, backend):
    prepare, sections, error, fragment = CASES[case]
    root = tmp_path / "data"
    if prepare is None:
        write_solid_dataset(root, per_class=1, splits=("val",))
    else:
        prepare(root)
    if "file_list" in sections.get("val", {}):
        sections = {**sections, "val": {"file_list": str(root / "list.txt")}}
    config = base_config(root, **{"backend": backend, **sections})
    with pytest.raises(error, match=fragment):
        build_loader(config, "val")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_class_folder_keeps_its_label_and_warns(tmp_path, backend, caplog):
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("val",))
    (root / "val" / "b_empty").mkdir()
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        loader = build_loader(base_config(root, backend=backend), "val")
    assert loader.classes == ("a_red", "b_empty", "b_green", "c_blue")
    assert sorted(label for _, labels in loader for label in labels.tolist()) == [0, 0, 2, 2, 3, 3]
    assert any("b_empty holds no image files" in r.message and "label 1 is kept" in r.message for r in caplog.records)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dataset_smaller_than_one_batch_with_drop_last_is_an_empty_epoch_and_a_warning(tmp_path, backend, caplog):
    root = write_solid_dataset(tmp_path / "data", per_class=1, splits=("train",))  # 3 images
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        loader = build_loader(base_config(root, backend=backend, train={"batch_size": 8}), "train")
    assert len(loader) == 0 and list(loader) == [] and list(loader) == []
    assert any("yields no batch per epoch" in r.message and "lower train.batch_size or set train.drop_last: false"
               in r.message for r in caplog.records)


@pytest.mark.parametrize("policy", ["skip", "raise"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_list_naming_a_missing_file(tmp_path, backend, policy):
    root = tmp_path / "data"
    file_list_with_a_missing_file(root)
    config = base_config(root, backend=backend, dataset={"on_bad_image": policy},
                         val={"file_list": str(root / "list.txt")})
    gone = str(root / "val" / "a_red" / "gone.png")
    if policy == "raise":
        with pytest.raises(BadImageError, match=f"cannot use image '{gone}': missing \\(no such file\\)"):
            build_loader(config, "val")
        return
    loader = build_loader(config, "val")
    assert [label for _, labels in loader for label in labels.tolist()] == [0, 1]
    assert loader.bad_samples == [(gone, "missing (no such file)")]


def gpu_problems() -> list[str]:
    """output.device values no loader can have here: a GPU index one past the last GPU torch sees, and
    on a machine without a GPU also plain cuda."""
    count = torch.cuda.device_count()
    return [f"cuda:{count}"] + (["cuda"] if count == 0 else [])


@pytest.mark.parametrize("device", gpu_problems())
def test_a_gpu_torch_does_not_see_is_an_error_naming_the_value_the_gpus_and_where_it_was_set(tmp_path, device):
    """On a machine without a GPU: cuda and cuda:0; on a GPU machine: cuda:N one past its last GPU."""
    root = write_solid_dataset(tmp_path / "data", per_class=1, splits=("val",))
    path = tmp_path / "c.yaml"
    path.write_text(f"dataset: {{root: {root}}}\nbackend: torch\nval: {{}}\n")
    count = torch.cuda.device_count()
    fix = ("set output.device: auto or cpu" if count == 0 else
           f"set output.device to {'cuda:0' if count == 1 else f'cuda:0 to cuda:{count - 1}'}, cuda (the local "
           f"rank's GPU) or auto")
    problem = f"output.device: {device}, but torch sees {count} CUDA GPU{'' if count == 1 else 's'}"
    with pytest.raises(ConfigError) as from_override:  # --set output.device=... blames the override
        build_loader(path, "val", overrides=[f"output.device={device}"])
    assert str(from_override.value).startswith(f"override 'output.device': {problem}")
    assert str(from_override.value).endswith(fix)
    path.write_text(path.read_text() + f"output: {{device: '{device}'}}\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{path}: {problem}')}"):  # in the file: the file
        build_loader(path, "val")


def test_a_dataset_root_set_by_an_override_is_blamed_on_the_override(tmp_path):
    root = write_solid_dataset(tmp_path / "data", per_class=1, splits=("val",))
    path = tmp_path / "c.yaml"
    path.write_text(f"dataset: {{root: {root}}}\nbackend: torch\noutput: {{device: cpu}}\nval: {{}}\n")
    with pytest.raises(ConfigError, match="^override 'dataset.root': dataset.root: folder '/nonexistent/data' does "
                                          "not exist"):
        build_loader(path, "val", overrides=["dataset.root=/nonexistent/data"])
    with pytest.raises(ConfigError, match=f"^override 'dataset.cache': dataset.cache: folder "
                                          f"'{re.escape(str(tmp_path / 'nope'))}' does not exist"):
        build_loader(path, "val", overrides=[f"dataset.cache={tmp_path / 'nope'}"])


# ---------------------------------------------------------------------------------------------
# Exponential configs (issue 33, item 10): a YAML alias bomb and a brace range past the limit fail
# in seconds, naming the key, instead of expanding for minutes. Real files, the real command.
# ---------------------------------------------------------------------------------------------


def alias_bomb(levels: int = 9) -> str:
    """train.shards as nine nested aliases of nine items each: 9**9 (387 million) shard names."""
    anchors = ["&a0 [" + ", ".join(["x.tar"] * 9) + "]"]
    anchors += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "dataset: {format: webdataset}\ntrain:\n  shards: [" + ", ".join(anchors) + "]\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bomb", ["aliases", "braces"])
def test_an_exponential_config_fails_in_seconds_naming_the_key(tmp_path, bomb):
    import subprocess
    import sys
    import time

    from conftest import REPO, cpu_only_env
    config = tmp_path / "bomb.yaml"
    config.write_text(alias_bomb() if bomb == "aliases" else
                      "dataset: {format: webdataset}\ntrain: {shards: 'x-{0..99999999}{0..99999999}.tar'}\n")
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "fastloader.cli", "check", str(config)], cwd=REPO,
                            capture_output=True, text=True, env=cpu_only_env(tmp_path / "cache"), timeout=60)
    assert time.monotonic() - started < 30  # the process starts torch in about 5 s; the bomb took 289 s
    assert result.returncode == 2, result.stderr[-2000:]
    if bomb == "aliases":
        assert (f"fastloader: error: {config}: the config holds more than 100,000 values once its YAML aliases are "
                f"expanded (at train.shards[") in result.stderr
    else:
        assert (f"fastloader: error: {config}: train.shards: '{tmp_path}/x-{{0..99999999}}{{0..99999999}}.tar' "
                f"expands to 10,000,000,000,000,000 paths, more than 1,000,000; a split takes at most 1,000,000 "
                f"shards") in result.stderr


def test_aliases_shared_by_a_dict_config_and_an_override_are_bounded_too(tmp_path):
    items: list = ["x.tar"] * 9
    for _ in range(9):
        items = [items] * 9  # shared references: cheap in memory, 387 million values walked whole
    with pytest.raises(ConfigError, match="<dict>: the config holds more than 100,000 values"):
        build_loader({"dataset": {"format": "webdataset"}, "train": {"shards": items}})
    override = "train.shards=" + alias_bomb().split("shards: ", 1)[1].strip()  # `--set` parses YAML too
    with pytest.raises(ConfigError, match="override 'train.shards': the config holds more than 100,000 values"):
        build_loader({"dataset": {"format": "webdataset"}}, overrides=[override])


def test_dataset_classes_takes_a_file_of_names_relative_to_the_config(tmp_path):
    """Item 14 of issue 33: `dataset.classes` refused the path of the classes file `fastloader pack` writes."""
    root = write_solid_dataset(tmp_path / "data", per_class=1, splits=("val",))
    (tmp_path / "names.txt").write_text("a_red\nb_green\n\nc_blue\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"dataset: {{root: {root}, classes: names.txt}}\nbackend: torch\noutput: {{device: cpu}}\n"
                      "val: {}\n")
    assert build_loader(config, "val").classes == ("a_red", "b_green", "c_blue")
    (tmp_path / "twice.txt").write_text("a_red\na_red\n")
    for value, message in (("nope.txt", f"override 'dataset.classes': dataset.classes: '{tmp_path / 'nope.txt'}' "
                                        f"does not exist; give the class names as a list, or the file of them"),
                           ("twice.txt", "the file '.*twice.txt' cannot serve as class names: it names 'a_red' "
                                         "twice; each class once, in label order")):
        with pytest.raises(ConfigError, match=message):
            build_loader(config, "val", overrides=[f"dataset.classes={tmp_path / value}"])
    with pytest.raises(ConfigError, match="dataset.classes: must be a list of distinct, non-empty class names"):
        build_loader(config, "val", overrides=["dataset.classes=[a_red, a_red]"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_val_split_without_one_of_trains_class_folders_keeps_every_label_and_says_so(tmp_path, backend, caplog):
    """val/ lacked b_green: its c_blue images were labelled 1 (train's b_green), silently (issue 41.9)."""
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("train", "val"))
    for image in (root / "val" / "b_green").iterdir():
        image.unlink()
    (root / "val" / "b_green").rmdir()
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        val = build_loader(base_config(root, backend=backend), "val")
        train = build_loader(base_config(root, backend=backend), "train")
    assert val.classes == train.classes == ("a_red", "b_green", "c_blue")
    assert sorted(label for _, labels in val for label in labels.tolist()) == [0, 0, 2, 2]
    assert f"{root / 'val'} has no class folder 'b_green', which train has" in caplog.text
    assert "its label 1, with no samples here" in caplog.text


def test_a_missing_val_folder_is_not_told_to_read_trains_folder(tmp_path):
    """"set val.folder to one of them" offered train's folder for val (issue 41.17)."""
    root = write_solid_dataset(tmp_path / "data", per_class=2, splits=("train",))
    with pytest.raises(ConfigError) as raised:
        build_loader(base_config(root), "val")
    message = str(raised.value)
    assert f"split folder {str(root / 'val')!r} does not exist (folders in dataset.root: train): make it (" in message
    assert ("set val.folder to the folder that holds the split's own images, hold it out of train (val.held_out: "
            "{of: train, fraction: 0.1}), or remove the split 'val'") in message  # docs/config.md, held out
    assert "one of them" not in message


def test_every_unknown_key_is_said_at_once(tmp_path):
    """Three typos were three runs, each naming one."""
    config = {"dataset": {"root": str(tmp_path), "rooot": 1}, "train": {"batchsize": 1, "transform": {"sizee": 8}}}
    with pytest.raises(ConfigError) as caught:
        build_loader(config, "train")
    assert str(caught.value).splitlines() == [
        "3 unknown keys:", "  <dict>: unknown key 'dataset.rooot'; did you mean 'dataset.root'?",
        "  <dict>: unknown key 'train.batchsize'; did you mean 'train.batch_size'?",
        "  <dict>: unknown key 'train.transform.sizee'; did you mean 'train.transform.size'?"]
    with pytest.raises(ConfigError, match=r"^<dict>: unknown key 'dataset\.rooot'; did you mean 'dataset\.root'\?$"):
        build_loader({"dataset": {"rooot": 1}, "train": {"batch_size": 1}}, "train")  # not 'dataset.root: missing'


def test_a_split_named_otherwise_overrides_as_a_string_and_a_split_that_is_no_name_are_named(tmp_path):
    config = {"dataset": {"root": str(tmp_path)}, "train": {"batch_size": 1}, "val": {"batch_size": 1}}
    with pytest.raises(ConfigError, match=r"no split 'validation' \(splits defined: train, val\); did you mean "
                                          r"'val'\?"):
        build_loader(config, "validation")
    with pytest.raises(ConfigError, match=r"overrides 'train\.batch_size=3': a string, where a list of "
                                          r"'dotted\.key=value' strings or a dict is wanted: "
                                          r"overrides=\['train\.batch_size=3'\]"):
        build_loader(config, "train", "train.batch_size=3")
    with pytest.raises(ConfigError, match=r"split 0 is no split name \(a int\); name the split, one of train, val"):
        build_loader(config, 0)


def test_a_config_given_a_source_in_code_needs_no_dataset_section(tmp_path):
    """docs/sources.md said so; build_loader(config, split, source=obj) still demanded dataset.root."""
    from PIL import Image

    from fastloader.sources.sqlite_table import SQLiteSource, write_table

    rows = []
    for label, colour in enumerate([(200, 0, 0), (0, 200, 0)]):
        buffer = __import__("io").BytesIO()
        Image.new("RGB", (16, 12), colour).save(buffer, format="PNG")
        rows.append((f"{label}.png", buffer.getvalue(), label))
    write_table(str(tmp_path / "t.sqlite"), rows, ["red", "green"])
    config = {"output": {"device": "cpu"}, "workers": {"num_workers": 0},
              "train": {"mode": "eval", "batch_size": 2, "transform": {"size": 8}}}
    with build_loader(config, "train", source=SQLiteSource(str(tmp_path / "t.sqlite"))) as loader:
        assert [labels.tolist() for _, labels in loader] == [[0, 1]]
    with pytest.raises(ConfigError, match="dataset: missing"):
        build_loader(config, "train")  # without the source, it says what is missing
