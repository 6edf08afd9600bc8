"""torch's private DataLoader internals the torch backend reads (torch_loader/live_iterator.py), held
against the installed torch: a torch release not checked, or one whose iterator lost an attribute,
fails here by name rather than degrading a dead worker's message in a user's run. CPU only."""

import torch
import torch.utils.data

from torch_loader import live_iterator


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.tensor([index * index])


def test_the_installed_torch_is_one_the_adapter_was_checked_against():
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert release in live_iterator.CHECKED_AGAINST, (
        f"torch {torch.__version__} is not in torch_loader/live_iterator.py's CHECKED_AGAINST "
        f"{live_iterator.CHECKED_AGAINST}: read its _MultiProcessingDataLoaderIter for the ATTRIBUTES, then add it")


def test_a_live_iterator_has_every_attribute_the_adapter_reads_and_shuts_down_through_it():
    loader = torch.utils.data.DataLoader(_Squares(), batch_size=2, num_workers=2,
                                         multiprocessing_context="fork")
    live = iter(loader)
    try:
        missing = [name for name in live_iterator.ATTRIBUTES if not hasattr(live, name)]
        assert missing == []
        processes = live_iterator.workers(live)
        assert len(processes) == 2 and all(process.is_alive() for process in processes)
        assert [int(x) for x in next(live).flatten()] == [0, 1]
        awaited = live_iterator.awaited_workers(live)
        assert len(awaited) == 1 and awaited[0] in processes  # the next batch's worker, from torch's bookkeeping
        live_iterator.release_sigchld(live)
        assert live._worker_pids_set is False
    finally:
        live_iterator.shut_down(live)
    assert live_iterator.is_shut_down(live)
    assert not any(process.is_alive() for process in processes)


def test_a_dead_worker_is_abandoned_without_waiting_on_its_locks():
    loader = torch.utils.data.DataLoader(_Squares(), batch_size=2, num_workers=2,
                                         multiprocessing_context="fork")
    live = iter(loader)
    processes = live_iterator.workers(live)
    live_iterator.release_sigchld(live)
    processes[0].kill()
    processes[0].join(timeout=5)
    live_iterator.shut_down(live)  # not torch's shutdown: a worker is dead
    assert live._shutdown is True
    assert not any(process.is_alive() for process in processes)
