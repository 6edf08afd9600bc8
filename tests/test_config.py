"""Config: every key checked, every error names where, what and how to fix it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from fastloader import load_config
from fastloader.errors import ConfigError


def write(tmp_path: Path, data: dict, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(config, overrides=None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(config, overrides)
    return str(caught.value)


def test_imagenette_config_parses_with_train_and_eval_splits():
    config = load_config(REPO / "configs" / "imagenette.yaml")
    assert sorted(config.splits) == ["train", "val"]
    train, val = config.split("train"), config.split("val")
    assert (train.mode, train.shuffle, train.drop_last) == ("train", True, True)
    assert (val.mode, val.shuffle, val.drop_last) == ("eval", False, False)
    assert train.transform.scale == (0.08, 1.0) and train.transform.hflip == 0.5
    assert val.transform.crop_pct == 0.875 and val.transform.size == 224
    assert config.output.dtype == "float32" and config.output.channels_last is False
    # A relative root is relative to the config file's folder, whatever the working directory.
    assert config.dataset.root == str(REPO / "data" / "imagenette2-320")


def test_config_is_frozen():
    config = load_config(REPO / "configs" / "sample.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.split("train").transform.size = 3


def test_unknown_key_names_the_file_the_key_and_the_closest_valid_key(tmp_path):
    path = write(tmp_path, {"dataset": {"root": "x"}, "train": {"bach_size": 3}})
    message = error_of(path)
    assert str(path) in message
    assert "unknown key 'train.bach_size'" in message
    assert "did you mean 'train.batch_size'?" in message


def test_key_in_the_wrong_section_is_pointed_to_its_place(tmp_path):
    message = error_of(write(tmp_path, {"dataset": {"root": "x"}, "train": {"hflip": 0.5}}))
    assert "unknown key 'train.hflip'" in message and "<split>.transform.hflip" in message


def test_misspelled_section_is_not_taken_for_a_split(tmp_path):
    message = error_of(write(tmp_path, {"dataset": {"root": "x"}, "normalise": {"mean": [0, 0, 0]}}))
    assert "unknown key 'normalise'" in message and "did you mean 'normalize'?" in message


@pytest.mark.parametrize("key, value, expected", [
    ("train.batch_size", "big", "train.batch_size: expected an integer, got 'big'"),
    ("train.batch_size", True, "train.batch_size: expected an integer, got true"),
    ("train.batch_size", 0, "train.batch_size: must be an integer in [1, 65536], got 0"),
    ("train.transform.scale", [0.9, 0.1], "train.transform.scale: must be 0 < min <= max <= 1, got [0.9, 0.1]"),
    ("train.transform.scale", [0.5], "train.transform.scale: expected a list of 2 numbers, got 1 values"),
    ("train.transform.hflip", 1.5, "train.transform.hflip: must be a probability in [0, 1], got 1.5"),
    ("normalize.mean", [124, 116, 104], "normalize.mean: must be in 0..1 units (pixel / 255)"),
    ("normalize.std", [0.2, 0.2], "normalize.std: expected a list of 3 numbers, got 2 values"),
    ("output.dtype", "bfloat", "output.dtype: expected one of 'float32', 'float16', 'bfloat16', got 'bfloat'; "
                               "did you mean 'bfloat16'?"),
    ("workers.num_workers", -1, "workers.num_workers: must be 'auto' or an integer in [0, 1024], got -1"),
    ("workers.num_workers", "many", "workers.num_workers: expected an integer or one of 'auto', got 'many'"),
    ("backend", "jax", "backend: expected one of 'auto', 'dali', 'torch', got 'jax'"),
])
def test_wrong_type_or_range_names_the_dotted_key_and_the_value(tmp_path, key, value, expected):
    raw = {"dataset": {"root": "x"}, "train": {}}
    section, *rest = key.split(".")
    node = raw.setdefault(section, {}) if rest else raw
    for part in rest[:-1]:
        node = node.setdefault(part, {})
    node[rest[-1] if rest else key] = value
    path = write(tmp_path, raw)
    message = error_of(path)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_eval_split_refuses_drop_last_and_train_only_keys(tmp_path):
    message = error_of(write(tmp_path, {"dataset": {"root": "x"}, "val": {"drop_last": True}}))
    assert "val.drop_last: must be false in eval mode" in message
    message = error_of(write(tmp_path, {"dataset": {"root": "x"}, "val": {"transform": {"scale": [0.5, 1]}}}))
    assert "val.transform.scale: applies only to train mode" in message
    message = error_of(write(tmp_path, {"dataset": {"root": "x"}, "train": {"transform": {"crop_pct": 0.9}}}))
    assert "train.transform.crop_pct: applies only to eval mode" in message


def test_split_mode_defaults_follow_the_split_name_and_can_be_set(tmp_path):
    config = load_config(write(tmp_path, {"dataset": {"root": "x"}, "train": {}, "test": {},
                                          "holdout": {"mode": "eval"}, "train_eval": {"mode": "eval"}}))
    assert config.split("train").mode == "train" and config.split("test").mode == "eval"
    assert config.split("holdout").mode == "eval"
    assert config.split("train_eval").mode == "eval" and config.split("train_eval").shuffle is False


def test_a_split_typo_fails_in_a_file_and_in_overrides_naming_the_closest_split(tmp_path):
    path = write(tmp_path, {"dataset": {"root": "x"}, "train": {"batch_size": 64}, "trian": {"batch_size": 8}})
    message = error_of(path)
    assert message.startswith(f"{path}: split section 'trian' does not state its mode; did you mean 'train'?")
    assert "'trian.mode: train' or 'eval'" in message
    imagenette = REPO / "configs" / "imagenette.yaml"
    for overrides in (["trian.batch_size=8"], {"trian.batch_size": 8}):
        message = error_of(imagenette, overrides)
        assert message.startswith("override 'trian.batch_size': split section 'trian' does not state its mode; "
                                  "did you mean 'train'?"), message
    assert "did you mean 'val'?" in error_of(imagenette, ["vla.batch_size=8"])
    assert "did you mean" not in error_of(imagenette, ["holdout.batch_size=8"])
    # a new split that says what it is, and a conventional name, are accepted
    assert load_config(imagenette, ["holdout.mode=eval", "holdout.batch_size=8"]).split("holdout").batch_size == 8
    assert load_config(imagenette, ["test.batch_size=8"]).split("test").mode == "eval"


def test_origins_say_where_the_backend_came_from(monkeypatch):
    monkeypatch.delenv("FASTLOADER_BACKEND", raising=False)
    path = REPO / "configs" / "imagenette.yaml"
    assert load_config(path).origin("backend") == str(path)
    assert load_config(path, ["backend=dali"]).origin("backend") == "override 'backend'"
    assert load_config(load_config(path), {"backend": "torch"}, origin="the command's --backend").origin(
        "backend") == "the command's --backend"
    assert load_config({"dataset": {"root": "x"}}).origin("backend") == "the default, as <dict> does not set it"
    monkeypatch.setenv("FASTLOADER_BACKEND", "torch")
    assert load_config(path, ["backend=dali"]).origin("backend") == "environment variable FASTLOADER_BACKEND"


def test_missing_dataset_and_missing_split_are_explained(tmp_path):
    assert "dataset: missing" in error_of(write(tmp_path, {"train": {}}))
    config = load_config(write(tmp_path, {"dataset": {"root": "x"}, "train": {}}))
    with pytest.raises(ConfigError, match=r"no split 'tran' \(splits defined: train\); did you mean 'train'\?"):
        config.split("tran")


def test_overrides_as_mapping_and_as_yaml_strings():
    path = REPO / "configs" / "imagenette.yaml"
    from_dict = load_config(path, {"train.batch_size": 32, "backend": "torch", "train.transform.scale": [0.5, 1]})
    from_strings = load_config(path, ["train.batch_size=32", "backend=torch", "train.transform.scale=[0.5, 1]"])
    assert from_dict == from_strings
    assert from_dict.split("train").batch_size == 32 and from_dict.backend == "torch"
    assert from_dict.split("train").transform.scale == (0.5, 1.0)


def test_override_errors_name_the_override_not_the_file():
    path = REPO / "configs" / "imagenette.yaml"
    message = error_of(path, ["train.bach_size=32"])
    assert message.startswith("override 'train.bach_size': unknown key 'train.bach_size'")
    assert "did you mean 'train.batch_size'" in message
    assert "override 'train.batch_size': train.batch_size: expected an integer, got 'x'" in error_of(
        path, {"train.batch_size": "x"})
    assert "expected 'dotted.key=value'" in error_of(path, ["train.batch_size"])


def test_override_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(REPO / "configs" / "imagenette.yaml", {"dataset.root": "data/in"})
    assert config.dataset.root == str(tmp_path / "data/in")


def test_dict_config_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config({"dataset": {"root": "rel"}, "train": {}})
    assert config.source == "<dict>" and config.dataset.root == "rel"


def test_environment_variable_forces_the_backend(monkeypatch):
    path = REPO / "configs" / "imagenette.yaml"
    monkeypatch.setenv("FASTLOADER_BACKEND", "torch")
    assert load_config(path).backend == "torch"
    assert load_config(path, {"backend": "dali"}).backend == "torch"
    monkeypatch.setenv("FASTLOADER_BACKEND", "tensorflow")
    assert "environment variable FASTLOADER_BACKEND: backend: expected one of" in error_of(path)


def test_loaded_config_round_trips_through_load_config_with_overrides():
    config = load_config(REPO / "configs" / "imagenette.yaml")
    again = load_config(config, {"seed": 5})
    assert again.seed == 5 and again.splits == config.splits and again.dataset == config.dataset


def test_invalid_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    assert f"{bad}: not valid YAML" in error_of(bad)
    assert "config file 'nope.yaml' not found" in error_of("nope.yaml")


def test_a_yaml_syntax_error_is_one_line_with_the_file_line_column_and_what_was_expected(tmp_path):
    unclosed, tab = tmp_path / "unclosed.yaml", tmp_path / "tab.yaml"
    unclosed.write_text("train:\n  batch_size: [1, 2\n  folder: x\n")
    tab.write_text("train:\n\tfolder: x\n")
    assert error_of(unclosed) == (f"{unclosed}: not valid YAML at line 3, column 9: expected ',' or ']', but got ':' "
                                  f"(while parsing a flow sequence that starts on line 2, column 15)")
    assert error_of(tab) == (f"{tab}: not valid YAML at line 2, column 1: found character '\\t' that cannot start "
                             f"any token (while scanning for the next token); indent with spaces: YAML does not "
                             f"allow tabs there")


def test_a_config_path_that_is_no_text_file_names_the_file_and_what_it_is(tmp_path):
    import gzip

    from PIL import Image
    photo, archive = tmp_path / "photo.yaml", tmp_path / "config.yaml.gz"
    Image.new("RGB", (4, 4)).save(photo, format="PNG")
    archive.write_bytes(gzip.compress(b"dataset: {root: data}\n"))
    configs, empty = tmp_path / "configs", tmp_path / "empty"
    configs.mkdir(), empty.mkdir()
    write(configs, {"dataset": {"root": "x"}}, "small.yaml")
    fix = "Pass the path of a YAML file such as configs/sample.yaml."
    expected = {photo: f"config file '{photo}' is a PNG image, not YAML text (byte 0x89 at offset 0 is not UTF-8). "
                       f"{fix}",
                archive: f"config file '{archive}' is a gzip archive, not YAML text (byte 0x8b at offset 1 is not "
                         f"UTF-8). {fix}",
                configs: f"config file '{configs}' is a folder, not a YAML file. Pass a YAML file in it, such as "
                         f"'{configs / 'small.yaml'}'.",
                empty: f"config file '{empty}' is a folder, not a YAML file. It holds no .yaml file. {fix}"}
    for path, message in expected.items():
        assert error_of(path) == message


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:12"])
def test_output_device_takes_auto_cpu_cuda_and_cuda_n(device):
    """The value only: whether GPU N exists is checked when a loader is built (test_bad_config.py)."""
    assert load_config({"dataset": {"root": "x"}}, {"output.device": device}).output.device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1.5", "CUDA"])
def test_output_device_refuses_anything_else_naming_the_forms_it_takes(device):
    assert error_of({"dataset": {"root": "x"}}, {"output.device": device}) == (
        f"override 'output.device': output.device: must be auto, cpu, cuda or cuda:N (N a GPU index, e.g. "
        f"cuda:1), got {device!r}")


SPLIT_VALUES = {  # a value of each split key other than its default, as a file would set it
    "batch_size": 3, "batch_sizes": None, "shuffle": None, "drop_last": False, "block_size": None,
    "folder": "elsewhere", "file_list": None, "shards": None, "files": None, "source": None, "source_args": None,
    "sources": None, "held_out": None, "weights": None, "class_weights": "sqrt", "epoch_size": 77, "aug_repeats": 3,
    "label_smoothing": 0.25, "view_ops": None,
}
"""Keys set to None here are set by the test below with the keys they need beside them."""


def test_every_split_key_a_file_sets_is_kept_none_takes_its_default_silently(tmp_path):
    """The split keys are read from SplitConfig's fields: a new field cannot be left out of the
    reading (before, a hand-written tuple of keys dropped a key the tuple lacked, which then took
    its default without a word). This table must name every field, so a new key gets a case here."""
    from fastloader.config_build import SPLIT_VALUE_KEYS
    from fastloader.schema import SplitConfig
    fields = [f.name for f in dataclasses.fields(SplitConfig)
              if f.name not in ("name", "mode", "transform", "mixup", "views")]  # views: read over the transform
    assert sorted(SPLIT_VALUES) == sorted(fields) == sorted(SPLIT_VALUE_KEYS)
    (tmp_path / "list.txt").write_text("a/x.png 0\n")
    (tmp_path / "weights.txt").write_text("a/x.png 1\n")
    cases = [{key: value for key, value in SPLIT_VALUES.items() if value is not None},
             {"file_list": str(tmp_path / "list.txt"), "weights": str(tmp_path / "weights.txt")},
             {"shards": "s-{0..1}.tar", "shuffle": "block", "block_size": "1GB"}, {"shuffle": False},
             {"files": "t.parquet"},
             {"source": "fastloader.sources.sqlite_table:SQLiteSource", "source_args": {"path": "db.sqlite"}},
             {"sources": [{"folder": "a"}]}, {"held_out": {"of": "val", "count": 2}},
             {"batch_size": 4, "batch_sizes": (4, 2), "transform": {"sizes": [16, 32]}},
             {"view_ops": "per_view", "views": [{"count": 2}]}]
    set_keys = set()
    for case in cases:
        dataset = {"root": str(tmp_path), "format": "webdataset" if "shards" in case else "folder"}
        other = {"val": {}} if "held_out" in case else {}  # the split it is held out of
        split = load_config({"dataset": dataset, "train": case, **other}).split("train")
        for key, value in case.items():
            if key in ("transform", "views"):  # beside batch_sizes, which pairs with its sizes; beside view_ops
                continue
            kept = getattr(split, key)
            if key == "sources":
                kept = [{"folder": kept[0].folder}]
            if key == "held_out":
                kept = {"of": kept.of, "count": kept.count}
            if key in ("shards", "files", "file_list", "weights"):  # made absolute
                kept = [Path(path).name for path in ((kept,) if isinstance(kept, str) else kept)]
                value = [Path(value).name]
            assert kept == value, key
            set_keys.add(key)
    assert set_keys == set(fields)
