"""The DALI feed's pieces, each alone (dali_loader/feed.py's docstring): the batch reader returns a
batch as one value and keeps nothing of it but the bad-samples record; that record's two lifetimes;
the inputs built from a batch are a pure function of it; and reading on into the next epoch keeps
only what a new loop begins with, by the rule both backends share (fastloader/read_ahead.py).
Device: CPU (the reader and the inputs run on the host in both flavours)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")

from conftest import base_config, write_textured_dataset  # noqa: E402

from dali_loader.bad_samples import BadSamples  # noqa: E402
from dali_loader.inputs import batch_inputs  # noqa: E402
from fastloader import build_loader  # noqa: E402
from fastloader.order import EpochOrder  # noqa: E402
from fastloader.read_ahead import epochs_after, in_flight_prefix  # noqa: E402


@pytest.fixture
def loader(tmp_path):
    root = write_textured_dataset(tmp_path / "d", per_class=3, splits=("train",))
    config = base_config(root, backend="dali", dataset={"screen": False, "on_bad_image": "skip"},
                         train={"batch_size": 4, "transform": {"size": 32}})
    with build_loader(config, "train") as built:
        yield built


def test_the_batch_reader_returns_a_batch_as_a_value_and_records_only_what_is_bad(loader):
    reader, bad = loader._reader, loader._reader.bad
    planned = loader.order.batches(0)[0]
    broken = int(planned[1, 0])
    path = loader.index.path(broken)
    whole = open(path, "rb").read()
    open(path, "wb").write(whole[: len(whole) // 3])  # cut short after screening: found by the read
    first = reader.read(planned)
    assert len(first.batch) == len(planned) and broken not in first.batch[:, 0].tolist()  # its slot refilled
    assert first.batch[1, 1] == planned[1, 1]  # the substitute keeps the slot's seed
    assert [sample for sample, _ in first.notes.skipped] == [broken] and "truncated" in first.notes.skipped[0][1]
    assert [bytes(data) for data in first.data[:1]] == [open(loader.index.path(int(planned[0, 0])), "rb").read()]
    assert first.sizes.shape == (len(planned), 2) and first.slab is None
    open(path, "wb").write(whole)  # mended: this epoch still leaves it out, unread; the next reads it again
    again = reader.read(planned)
    assert np.array_equal(again.batch, first.batch) and again.notes.skipped == first.notes.skipped
    assert broken in bad and bad.why(broken) == first.notes.skipped[0][1]
    bad.new_epoch()
    assert broken not in bad and np.array_equal(reader.read(planned).batch, planned)


def test_refused_samples_stay_out_for_the_run_and_found_ones_for_their_epoch():
    bad = BadSamples()
    bad.found(3, "truncated")
    bad.refuse({5: "DALI could not decode it"})
    assert 3 in bad and 5 not in bad  # a refusal takes effect from the next epoch (a rebuilt pipeline's)
    bad.new_epoch()
    assert 3 not in bad and bad.why(5) == "DALI could not decode it" and len(bad) == 1
    assert bad.none_of([1, 2, 3]) and not bad.none_of([4, 5])


def test_a_batchs_inputs_are_a_pure_function_of_the_batch(loader):
    plan = loader._feed.inputs
    planned = loader.order.batches(0)[0]
    sizes = np.array([[40 + 3 * row, 50 + row] for row in range(len(planned))], dtype=np.int64)
    first = batch_inputs(plan, planned, planned, sizes)
    assert len(first) >= 2  # train: the crop boxes and at least the flips
    for _ in range(2):  # called again, in any order: the same arrays
        assert all(np.array_equal(a, b) for a, b in zip(batch_inputs(plan, planned, planned, sizes), first))
    half = batch_inputs(plan, planned, planned[:2], sizes[:2])
    assert all(np.array_equal(a, b[:2]) for a, b in zip(half, first))  # each row drawn from its own seed alone


def test_reading_ahead_keeps_only_what_the_next_loop_begins_with():
    order = EpochOrder(10, 2, mode="train", shuffle=True, drop_last=False, seed=7)
    ahead = epochs_after(order, 0)
    guessed = [next(ahead) for _ in range(7)]
    expected = list(order.batches(1)) + list(order.batches(2))[:2]  # epoch 1, then on into epoch 2
    assert all(np.array_equal(a, b) for a, b in zip(guessed, expected))
    assert in_flight_prefix(guessed[:3], list(order.batches(1))) == 3  # the usual next loop: all kept
    assert in_flight_prefix(guessed[:3], list(order.batches(1))[1:]) == 0  # a resumed position: none
    assert in_flight_prefix(guessed[:3], list(order.batches(1))[:2]) == 2  # a loop shorter than what is in flight
