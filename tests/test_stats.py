"""Stall accounting: every loader measures how long its consumer waited, per batch and per epoch."""
from __future__ import annotations

import logging
import re
import time

import pytest
from conftest import base_config
from test_resume import BACKENDS

from fastloader import build_loader


@pytest.mark.parametrize("backend", BACKENDS)
def test_stats_count_batches_images_and_the_waits_of_a_slow_and_a_busy_consumer(solid_root, backend, caplog):
    config = base_config(solid_root, backend=backend, workers={"num_workers": 2}, train={"batch_size": 3})
    loader = build_loader(config)
    with caplog.at_level(logging.INFO, logger="fastloader"):
        for _ in loader:  # a consumer with nothing to do: it waits for every batch
            pass
    eager = loader.stats
    assert (eager.epoch, eager.batches, eager.images) == (0, 5, 15)
    assert len(eager.batch_wait_s) == len(eager.batch_done_s) == 5
    assert eager.time_to_first_batch_s == eager.batch_wait_s[0] > 0
    assert eager.wait_s == pytest.approx(sum(eager.batch_wait_s[1:]))
    assert eager.elapsed_s == eager.batch_done_s[-1] >= eager.time_to_first_batch_s + eager.wait_s
    assert eager.images_per_second == pytest.approx(15 / eager.elapsed_s)
    assert f"{backend} loader, split 'train', epoch 0, rank 0: 15 images in 5 batches" in caplog.text

    for _ in loader:  # a consumer whose 'model step' takes 100 ms: the loader keeps up
        time.sleep(0.1)
    patient = loader.stats
    assert patient.epoch == 1 and patient.batches == 5
    assert patient.elapsed_s >= 0.4  # four steps between five batches
    assert patient.stall_fraction < 0.25 < eager.stall_fraction


def test_a_loop_left_early_has_its_own_stats_and_the_log_level_is_configurable(solid_root, caplog):
    loader = build_loader(base_config(solid_root, stats={"log_level": "none"}, train={"batch_size": 3}))
    with caplog.at_level(logging.DEBUG, logger="fastloader"):
        for step, _ in enumerate(loader):
            if step == 1:
                break
        assert loader.stats.batches == 2 and loader.stats.images == 6
        list(loader)
    assert loader.stats.batches == 5 and "images in" not in caplog.text
    warned = build_loader(base_config(solid_root, stats={"log_level": "warning"}, train={"batch_size": 3}))
    with caplog.at_level(logging.WARNING, logger="fastloader"):
        list(warned)
    assert "torch loader, split 'train', epoch 0, rank 0: 15 images in 5 batches" in caplog.text


def test_a_loop_of_one_batch_logs_the_batch_time_not_a_stall_of_nan(solid_root, caplog):
    """One batch has no time after it to measure a wait over: the line says so (torch backend, on the CPU)."""
    loader = build_loader(base_config(solid_root, train={"batch_size": 15}))  # the 15 train images: one batch
    with caplog.at_level(logging.INFO, logger="fastloader"):
        list(loader)
    assert loader.stats.batches == 1
    assert re.search(r"torch loader, split 'train', epoch 0, rank 0: 15 images in 1 batch, \d+\.\d\d s: \d+ "
                     r"images/s; its one batch took \d+\.\d\d s \(no later batch to measure a wait for\)$",
                     caplog.text, re.M), caplog.text
    assert "nan" not in caplog.text
