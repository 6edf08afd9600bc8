"""The Loader's pieces on their own (contract.py builds the Loader from them): the epoch cursor and
the bad-sample record keep their rules without a loader around them. No device: pure bookkeeping."""
from __future__ import annotations

import logging

import pytest

from fastloader.epoch_cursor import EpochCursor
from fastloader.errors import BadImageError, StateError
from fastloader.skipped_files import SkippedFiles


def test_the_cursor_runs_epoch_0_first_then_the_next_unless_one_is_set():
    cursor = EpochCursor()
    assert cursor.next_epoch == 0
    assert cursor.start_loop() == (0, 0, 1)
    assert cursor.next_epoch == 1
    assert cursor.start_loop() == (1, 0, 2)
    cursor.choose(7)
    assert cursor.next_epoch == 7 and cursor.start_loop() == (7, 0, 3)


def test_the_cursor_resumes_a_restored_position_once_and_only_the_newest_loop_moves_it():
    cursor = EpochCursor()
    cursor.restore(3, 96)
    assert (cursor.next_epoch, cursor.resume_position) == (3, 96)
    epoch, start, old = cursor.start_loop()
    assert (epoch, start, cursor.resume_position) == (3, 96, 0)  # the next loop starts afresh
    cursor.advance(old, 32)
    assert cursor.position == 128
    _, _, new = cursor.start_loop()  # the old loop is abandoned (a `break`), still referenced
    cursor.advance(old, 32)
    assert cursor.position == 0
    cursor.advance(new, 16)
    assert cursor.position == 16


@pytest.mark.parametrize("epoch", [-1, 2 ** 63, 1.0, True, "3"])
def test_the_cursor_refuses_an_epoch_that_is_no_int64_count(epoch):
    with pytest.raises(StateError, match=r"epoch must be an integer in \[0, 2\*\*63 - 1\]"):
        EpochCursor().choose(epoch)


def test_a_skipped_file_is_listed_and_logged_once_but_counted_in_each_epoch(caplog):
    skipped = SkippedFiles("torch", "train", 0, train=True)
    assert skipped.add("a.jpg", "header refused")  # left out when the loader was built
    with caplog.at_level(logging.DEBUG, logger="fastloader"):
        skipped.new_epoch()
        skipped.skip("a.jpg", "truncated")
        skipped.skip("b.jpg", "truncated")
        skipped.skip("b.jpg", "truncated")
        skipped.say_epoch(0)
        skipped.new_epoch()
        skipped.skip("b.jpg", "truncated")
        skipped.say_epoch(1)
    assert skipped.samples == [("a.jpg", "header refused"), ("b.jpg", "truncated")]
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped")] == [
        "skipped b.jpg: truncated (dataset.on_bad_image: skip; listed in loader.bad_samples)"]
    epochs = [(r.levelno, r.getMessage()) for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert epochs == [
        (logging.WARNING, "torch loader, split 'train', epoch 0, rank 0: files that cannot be decoded: 2 (1 new this "
                          "epoch), their batch slots refilled with other samples of the split; loader.bad_samples "
                          "lists 2 so far"),
        (logging.DEBUG, "torch loader, split 'train', epoch 1, rank 0: files that cannot be decoded: 1 (0 new this "
                        "epoch), their batch slots refilled with other samples of the split; loader.bad_samples "
                        "lists 2 so far")]


def test_an_epoch_that_read_nothing_names_its_first_failure():
    skipped = SkippedFiles("dali", "val", 1, train=False)
    skipped.add("old.jpg", "refused at the build")  # not this epoch's
    skipped.new_epoch()
    skipped.skip("x.jpg", "no JPEG marker")
    skipped.skip("y.jpg", "truncated")
    error = skipped.nothing_read(4)
    assert isinstance(error, BadImageError)
    assert str(error).startswith("dali loader, split 'val', epoch 4, rank 1: no sample could be read (2 samples "
                                 "failed so far, the first x.jpg: no JPEG marker)")
