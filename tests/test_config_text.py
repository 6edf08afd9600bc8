"""A config file means one thing: YAML's silent last-wins for a key given twice, and keys that YAML
reads as numbers or null, are refused with the line and the fix, not trained with or crashed on."""
from __future__ import annotations

import pytest

from fastloader.config import load_config
from fastloader.errors import ConfigError


def write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {root: builtin:sample}\n" + text)
    return path


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    path = write(tmp_path, "train:\n  batch_size: 4\n  batch_size: 8\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == (f"{path}: the key 'batch_size' is given twice, on line 3 and on line 4; YAML would "
                                 f"keep only the last without a word: delete one of them")


def test_a_key_given_twice_in_a_flow_mapping_or_an_override_value_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="'size' is given twice"):
        load_config(write(tmp_path, "train: {transform: {size: 64, size: 32}}\n"))
    with pytest.raises(ConfigError, match="'size' is given twice"):
        load_config(write(tmp_path, ""), overrides=["train.transform={size: 64, size: 32}"])


def test_a_merge_key_may_still_be_overridden(tmp_path):
    config = load_config(write(tmp_path, "train: &t {mode: train, batch_size: 4}\n"
                                         "val: {<<: *t, mode: eval, batch_size: 8}\n"))
    assert config.splits["train"].batch_size == 4
    assert config.splits["val"].batch_size == 8


@pytest.mark.parametrize("key, shown, read_as", [("1", "1", "int"), ("null", "null", "null"), ("2.5", "2.5", "float")])
def test_a_top_level_key_that_is_no_name_is_refused_naming_it(tmp_path, key, shown, read_as):
    path = write(tmp_path, f"{key}: 2\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: the key {shown} at the top level is not a name (YAML reads it as "
                                        f"{read_as})")
    assert f'quote it ("{shown}")' in str(raised.value)


def test_a_nested_key_that_is_no_name_is_refused_naming_its_section(tmp_path):
    with pytest.raises(ConfigError, match=r"the key 3 under train is not a name"):
        load_config(write(tmp_path, "train:\n  batch_size: 4\n  3: x\n"))


@pytest.mark.parametrize("text", ["transform: {size: 64}\n", "batch_size: 32\nval: {batch_size: 4}\n"])
def test_a_splits_key_at_the_top_level_says_to_indent_it_under_a_split(tmp_path, text):
    """A top-level `transform:` was told it "does not state its mode" (issue 41.17)."""
    key = text.split(":")[0]
    split = "val" if "val" in text else "train"
    with pytest.raises(ConfigError, match=rf"{key}: is a split's key, not a top-level one: indent it under the split "
                                          rf"it is for, e\.g\. '{split}:' then '  {key}: \.\.\.'"):
        load_config(write(tmp_path, text))


def test_a_split_of_shards_and_parquet_sources_needs_no_dataset_root(tmp_path):
    """It said "dataset.root: missing; it has no default", with no fix (issue 41.17)."""
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {}\ntrain:\n  sources:\n    - {shards: 'x-{000000..000001}.tar'}\n"
                    "    - {format: parquet, files: y.parquet}\n")
    config = load_config(path)
    assert config.dataset.root == str(tmp_path)
    assert config.splits["train"].sources[0].shards == (str(tmp_path / "x-{000000..000001}.tar"),)


def test_a_missing_dataset_root_says_what_to_set_it_to(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {}\n")
    with pytest.raises(ConfigError, match=r"dataset\.root: missing; it has no default; set it to the folder that "
                                          r"holds the split folders"):
        load_config(path)
