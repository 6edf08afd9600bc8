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


def test_torchs_private_api_is_used_only_through_the_adapter():
    """torch's private names and the wording of its errors appear in live_iterator.py alone, so a torch
    release is checked against one file (issue 71)."""
    import re
    from pathlib import Path
    repo = Path(live_iterator.__file__).resolve().parent.parent
    private = re.compile(r"torch\._(?!_|dynamo)|\._new_shared\b|\"DataLoader worker \(pid\" in|DataLoader timed out"
                         r"|in DataLoader worker process")  # names, and torch's error wordings parsed
    users = sorted(str(path.relative_to(repo)) for package in ("fastloader", "dali_loader", "torch_loader")
                   for path in (repo / package).rglob("*.py")
                   if path.name != "live_iterator.py" and any(
                       private.search(line) for line in path.read_text().splitlines()
                       if not line.lstrip().startswith("#")))
    assert users == []


def test_the_adapters_kernels_storage_and_wordings_work_on_the_installed_torch():
    kernels = live_iterator.uint8_resize_kernels()
    assert "bicubic" in kernels
    image = torch.arange(3 * 8 * 8, dtype=torch.uint8).reshape(1, 3, 8, 8)
    assert tuple(kernels["bicubic"](image, [4, 4], False).shape) == (1, 3, 4, 4)
    storage = live_iterator.shared_storage(64)
    assert storage.nbytes() == 64 and storage.is_shared()
    assert live_iterator.reports_dead_worker(RuntimeError("DataLoader worker (pid 12) exited unexpectedly"))
    assert live_iterator.is_poll_timeout(RuntimeError("DataLoader timed out after 1 seconds"))
    wrapped = RuntimeError("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent "
                           "call last):\n  File ...\nbuiltins.RuntimeError: the hook said no\n")
    assert live_iterator.worker_error_message(wrapped) == "the hook said no"
