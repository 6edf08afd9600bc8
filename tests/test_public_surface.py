"""The public surface (docs/sources.md, fastloader.interfaces, fastloader.errors): one root for every
error the library raises on purpose, exported from `fastloader`; a source's read() before its
samples(); no user's method taken for the built-ins' private index. CPU only."""
from __future__ import annotations

import inspect
import sqlite3

import pytest
from conftest import base_config
from test_user_sources import numbered_images, sqlite_config

import fastloader
from fastloader import errors
from fastloader.sources.sqlite_table import SQLiteSource, write_table


def _error_types(module) -> list[type]:
    return [value for value in vars(module).values()
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__]


def test_every_error_type_of_the_errors_module_is_a_fastloader_error_and_exported():
    defined = _error_types(errors)
    assert len(defined) >= 10
    assert [error.__name__ for error in defined if not issubclass(error, fastloader.FastloaderError)] == []
    assert [error.__name__ for error in defined if getattr(fastloader, error.__name__, None) is not error] == []
    assert {"LockTimeout", "SourceReadError"} <= {error.__name__ for error in defined}


def test_every_exported_error_is_defined_in_the_errors_module():
    exported = [getattr(fastloader, name) for name in fastloader.__all__]
    stray = [value.__name__ for value in exported
             if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ != errors.__name__]
    assert stray == []


def test_dir_of_the_package_is_its_public_surface():
    """dir(fastloader) less Python's dunders is __all__: no submodule, no typing helper, nothing missing
    (Loader and with_global_rng are imported lazily, and listed all the same)."""
    shown = [name for name in dir(fastloader) if not (name.startswith("__") and name.endswith("__"))]
    assert sorted(shown) == sorted(name for name in fastloader.__all__ if name != "__version__")
    assert {"Loader", "with_global_rng", "build_loader", "AugmentError"} <= set(shown)
    assert not {"os", "Any", "Mapping", "config", "errors", "sources"} & set(shown)
    assert all(getattr(fastloader, name) is not None for name in fastloader.__all__)


def test_the_package_ships_its_type_marker():
    """py.typed (PEP 561): type checkers read the annotations of an installed fastloader."""
    from importlib.resources import files
    assert files("fastloader").joinpath("py.typed").is_file()


def test_a_store_that_fails_is_no_config_mistake_and_each_error_keeps_the_base_callers_caught():
    assert not issubclass(fastloader.StoreError, ValueError)  # a network failure: nothing to fix in the config
    assert issubclass(fastloader.LockTimeout, fastloader.StoreError)
    assert issubclass(fastloader.ConfigError, ValueError) and issubclass(fastloader.StateError, ValueError)
    assert issubclass(fastloader.SourceReadError, OSError)  # a sample's read: on_bad_image decides
    # a store's failure must not read as a bad file: every reader skips what raises OSError
    assert not issubclass(fastloader.StoreError, OSError)


def test_a_state_from_another_split_is_refused_with_a_state_error(tmp_path):
    root, rows, classes = numbered_images(tmp_path)
    config = base_config(root, backend="torch", train={"batch_size": 4}, workers={"num_workers": 0})
    del config["val"]
    state = fastloader.build_loader(config, "train").state_dict()
    state["split"] = "val"
    loader = fastloader.build_loader(config, "train")
    with pytest.raises(fastloader.StateError, match="loader state was saved for split 'val'"):
        loader.load_state_dict(state)
    with pytest.raises(fastloader.FastloaderError):
        loader.set_epoch(-1)


def test_a_sqlite_source_reads_before_its_samples_were_asked_for(tmp_path):
    """A worker may read first (SPDL's keys + load): read(i) is sample i's bytes either way."""
    _, rows, classes = numbered_images(tmp_path)
    write_table(str(tmp_path / "t.sqlite"), rows, classes)
    fresh = SQLiteSource(str(tmp_path / "t.sqlite"))
    assert [fresh.read(i) for i in (0, 5, len(rows) - 1)] == [rows[i][1] for i in (0, 5, len(rows) - 1)]
    indexed = SQLiteSource(str(tmp_path / "t.sqlite"))
    assert list(indexed.samples().names) == [row[0] for row in rows]
    with sqlite3.connect(str(tmp_path / "t.sqlite")) as db:  # rows swapped after the first read: named
        db.execute("UPDATE images SET name = 'moved' WHERE rowid = 2")
    with pytest.raises(fastloader.SourceChanged, match="row 2 holds 'moved'"):
        fresh.read(1)


class _WithOwnSampleIndex:
    """A user's source that happens to have a method named as the built-ins' private index once was."""

    def __init__(self, rows):
        self.rows, self.name = rows, "rows"

    def samples(self):
        return [row[0] for row in self.rows], [row[2] for row in self.rows], ["a", "b", "c"]

    def read(self, item):
        return self.rows[item][1]

    def identity(self):
        return "rows-1"

    def sample_index(self):
        raise AssertionError("a user's sample_index() is not part of the protocol and is never called")


def test_a_users_method_named_sample_index_is_left_alone(tmp_path):
    _, rows, classes = numbered_images(tmp_path)
    config = sqlite_config(tmp_path / "unused.sqlite")
    del config["train"]["source"], config["train"]["source_args"]
    config["workers"] = {"num_workers": 0}
    loader = fastloader.build_loader(config, "train", source=_WithOwnSampleIndex(rows[:12]))
    assert sorted(label for _, labels in loader for label in labels.tolist()) == sorted(r[2] for r in rows[:12])
