"""The user's own transforms (docs/transforms.md): a sample hook, a batch hook and a DALI graph
function, with one meaning on both backends (DALI: its CPU flavour here; the GPU flavour's lines
are in test_cuda.py). Their draws are the samples' (the same with any number of workers, on either
backend, after a resume), the state names them, and what a hook does wrong stops the run naming
the hook, the sample and what was expected.

The hooks are in tests/user_hooks.py, named by path as a user's config names them.
"""
from __future__ import annotations

import json
import pickle
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import user_hooks
from conftest import (
    REPO,
    base_config,
    cpu_only_env,
    identities,
    processes_end,
    write_numbered_dataset,
    write_textured_dataset,
)

from fastloader import build_loader, with_global_rng
from fastloader.errors import ConfigError, HookError
from fastloader.hooks import load_hook

BACKENDS = ["torch", "dali"]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    return write_numbered_dataset(tmp_path_factory.mktemp("numbered"), per_class=4)


@pytest.fixture(scope="module")
def textured(tmp_path_factory):
    return write_textured_dataset(tmp_path_factory.mktemp("textured"), per_class=4)


def config(root, backend="torch", workers=0, train=None, val=None, **sections):
    return base_config(root, backend=backend, workers={"num_workers": workers},
                       train={"batch_size": 4, "transform": {"size": 32}, **(train or {})},
                       val={"batch_size": 4, "transform": {"size": 32}, **(val or {})}, **sections)


def hooked(root, backend="torch", workers=0, split="train", **transform):
    section = {"transform": {"size": 32, **transform}}
    return config(root, backend, workers, **{split: section})


def stamped_values(images: torch.Tensor) -> list[int]:
    """The grey value user_hooks.stamp wrote in each image's first row, read back from the normalized batch."""
    rgb = images[:, :, 0, :].float().mean(dim=2) * torch.tensor(STD) + torch.tensor(MEAN)
    return torch.round(rgb[:, 0] * 255).to(torch.int64).tolist()


def expected_stamps(loader, epoch: int = 0) -> list[int]:
    """What stamp draws for the samples the loader plans for an epoch, from their seeds."""
    seeds = np.concatenate([plan[:, 1] for plan in loader.order.batches(epoch)])
    values = []
    for seed in seeds.tolist():
        generator = torch.Generator()
        generator.manual_seed(seed)
        values.append(int(torch.randint(0, 256, (1,), generator=generator)))
    return values


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_sample_hook_draws_from_the_samples_seed_on_both_backends_with_any_workers(numbered, split):
    runs = {}
    for backend, workers in (("torch", 0), ("torch", 2), ("dali", 1)):
        loader = build_loader(hooked(numbered, backend, workers, split, sample_hook="user_hooks:stamp"), split)
        runs[backend, workers] = [v for images, _ in loader for v in stamped_values(images)]
        assert runs[backend, workers] == expected_stamps(loader), (backend, workers)
    assert runs["torch", 0] == runs["torch", 2] == runs["dali", 1]
    assert len(set(runs["torch", 0])) > len(runs["torch", 0]) // 2  # a draw per sample, not one for all
    in_place = build_loader(hooked(numbered, "dali", 1, split, sample_hook="user_hooks:in_place"), split)
    assert [v for images, _ in in_place for v in stamped_values(images)] == runs["dali", 1]  # its own copy


def test_a_sample_hook_sees_the_crop_after_the_flips_and_ops_and_the_rest_is_untouched(numbered):
    plain = build_loader(config(numbered), "train")
    hooked_loader = build_loader(hooked(numbered, sample_hook="user_hooks:identity"), "train")
    for (a, la), (b, lb) in zip(plain, hooked_loader):
        assert torch.equal(a, b) and torch.equal(la, lb)
    stamped = build_loader(hooked(numbered, sample_hook="user_hooks:stamp"), "train")
    plain.set_epoch(0)
    for (a, _), (b, _) in zip(plain, stamped):  # only the first row changed: the hook runs before normalizing
        assert torch.equal(a[:, :, 1:], b[:, :, 1:]) and not torch.equal(a[:, :, 0], b[:, :, 0])


@pytest.mark.parametrize("given", ["config", "object"])
def test_a_torchvision_v2_compose_as_a_sample_hook_is_bit_identical_across_runs_and_workers(textured, given):
    def run(workers, backend="torch"):
        if given == "config":
            loader = build_loader(hooked(textured, backend, workers, sample_hook="user_hooks:RAND_AUGMENT"), "train")
        else:
            loader = build_loader(config(textured, backend, workers), "train", sample_hook=user_hooks.RAND_AUGMENT)
        assert loader.hooks.sample.name.startswith("with_global_rng(")
        return torch.cat([images for images, _ in loader])
    one, again, two = run(1), run(1), run(2)
    assert torch.equal(one, again) and torch.equal(one, two)
    plain = torch.cat([images for images, _ in build_loader(config(textured), "train")])
    changed = [not torch.equal(a, b) for a, b in zip(one, plain)]
    assert 0 < sum(changed) and len(set(map(tuple, one[:, :, 3, 3].tolist()))) > 1  # per-sample draws
    dali = run(1, "dali")
    assert torch.equal(dali, run(1, "dali"))


def test_with_global_rng_seeds_the_global_generators_from_the_samples_and_restores_them():
    drawn = []

    def draws(image):
        import random
        drawn.append((float(torch.rand(1)), random.random(), float(np.random.rand())))
        return image
    hook = with_global_rng(draws)
    image = torch.zeros(3, 4, 4, dtype=torch.uint8)
    torch.manual_seed(1)
    expected_next = torch.rand(1)
    torch.manual_seed(1)
    for seed in (5, 6, 5):
        generator = torch.Generator()
        generator.manual_seed(seed)
        hook(image, generator)
    assert drawn[0] == drawn[2] != drawn[1]
    assert torch.equal(torch.rand(1), expected_next)
    compose = with_global_rng(user_hooks.RAND_AUGMENT)  # a class, so that spawned workers can unpickle it
    unpickled = pickle.loads(pickle.dumps(compose))
    assert unpickled.hook_name == "with_global_rng(torchvision.transforms.v2._container:Compose)"


@pytest.fixture
def two_busy_loops():
    """Two processes spinning beside the test, as a loaded machine: thread faults show under load."""
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


def trainers_draws(batches, per_batch: int = 300) -> list[tuple]:
    """A trainer's own seeded draws from Python's, numpy's and torch's global generators, `per_batch`
    of each after each batch (or item) `batches` yields."""
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    drawn = []
    for _ in batches:
        drawn += [(random.random(), float(np.random.rand()), float(torch.rand(1))) for _ in range(per_batch)]
    return drawn


@pytest.mark.parametrize("backend,workers", [("torch", 0), ("torch", 2), ("dali", 2)])
def test_a_hook_drawing_from_the_global_generators_leaves_the_trainers_draws_alone(numbered, backend, workers,
                                                                                   two_busy_loops):
    """with_global_rng reseeds the global generators per sample: on DALI's threads it did so under
    the trainer's draws on the main thread (issue 68: ~11k of 14,400 draws differed). Its draws are
    still the sample's, the same on both backends. The DALI backend's CPU flavour."""
    loader = build_loader(config(numbered, backend, workers), "train", sample_hook=user_hooks.GLOBAL_STAMP)
    epochs = 3
    stamps = []

    def batches():
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, _ in loader:
                stamps.extend(stamped_values(images))
                yield
    drawn = trainers_draws(batches())
    assert len(drawn) == 300 * epochs * len(loader)
    assert drawn == trainers_draws(range(epochs * len(loader)))  # as without a loader beside it
    assert stamps == [value for epoch in range(epochs) for value in expected_stamps(loader, epoch)]
    pids = loader._sample_hook.apart.pids if backend == "dali" else []
    loader.close()
    assert processes_end(pids)


def test_a_torch_loaders_workers_fork_while_a_dali_loader_runs_a_global_rng_hook(numbered, two_busy_loops):
    """A lock that with_global_rng held on DALI's threads was copied held into a torch loader's
    forked workers, which then hung on it until 3 x workers.timeout and were blamed as stuck
    decoders (issue 68). The DALI backend's CPU flavour beside the torch backend."""
    import threading

    dali = build_loader(config(numbered, "dali", 2), "train", sample_hook=user_hooks.GLOBAL_STAMP)
    stop, dali_batches = threading.Event(), []

    def run_dali():
        while not stop.is_set():
            for images, _ in dali:
                dali_batches.append(len(images))
                if stop.is_set():
                    break
    running = threading.Thread(target=run_dali)
    running.start()
    try:
        while len(dali_batches) < 2:
            time.sleep(0.05)
        cfg = config(numbered, "torch", 2)
        cfg["workers"].update(timeout=2, persistent=False)
        torch_loader = build_loader(cfg, "train", sample_hook=user_hooks.GLOBAL_STAMP)
        for epoch in range(3):  # each loop forks its workers anew, while DALI's threads run the hook
            torch_loader.set_epoch(epoch)
            stamps = [value for images, _ in torch_loader for value in stamped_values(images)]
            assert stamps == expected_stamps(torch_loader, epoch)
    finally:
        stop.set()
        running.join(60)
        dali.close()
    assert not running.is_alive()


@pytest.mark.parametrize("hook, said", [
    ("GLOBAL_FAILS", r" raised KeyError: 'the global key' on sample '\S+/n_\d\d\.png' \(seed \d+\)\. A hook's error "
                     r"stops the run.*global_fails"),
    ("GLOBAL_DIES", r": its process \d+ ended \(killed by SIGKILL\) while it ran on sample '\S+/n_\d\d\.png'")])
def test_a_global_rng_hook_that_fails_or_dies_in_its_dali_process_is_named(numbered, hook, said):
    """On DALI such a hook runs in processes of its own: what it raises there, or its process's
    end, stops the run naming it and the sample. The DALI backend's CPU flavour."""
    loader = build_loader(config(numbered, "dali", 2), "train", sample_hook=getattr(user_hooks, hook))
    with pytest.raises(HookError, match=re.compile(r"build_loader\(sample_hook=\.\.\.\) with_global_rng\(user_hooks:"
                                                   r"global_\w+\)" + said, re.S)):
        next(iter(loader))
    loader.close()


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_batch_hook_gets_the_batchs_seeds_on_both_backends_before_the_mixing(numbered, split):
    runs = {}
    extra = {"mixup": {"mixup_alpha": 0.2}} if split == "train" else {}
    for backend, workers in (("torch", 0), ("torch", 2), ("dali", 1)):
        cfg = config(numbered, backend, workers, **{split: {"transform": {"size": 32, "batch_hook":
                                                                          "user_hooks:batch_stamp"}, **extra}})
        user_hooks.SEEN.clear()
        loader = build_loader(cfg, split)
        seeds = np.concatenate([plan[:, 1] for plan in loader.order.batches(0)])
        out = [(images, labels) for images, labels in loader]
        stamps = torch.cat([images[:, :, 0, 0] for images, _ in out])
        if split == "val":  # no mixing: each pixel is its own sample's seed
            assert torch.equal(stamps, torch.from_numpy(seeds % 251).float().view(-1, 1).expand(-1, 3) / 251)
        else:
            assert out[0][1].dtype == torch.float32  # soft targets: the mixing ran after the hook
        if workers == 0:  # the hook saw normalized images and int64 labels, before any mixing
            assert user_hooks.SEEN[0] == (torch.float32, (4, 3, 32, 32), torch.int64, (4,))
        runs[backend, workers] = torch.cat([images for images, _ in out])
    assert torch.equal(runs["torch", 0], runs["torch", 2])
    assert torch.equal(runs["torch", 0][:, :, 0, 0], runs["dali", 1][:, :, 0, 0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_hook_may_return_new_tensors(numbered, backend):
    plain = torch.cat([images for images, _ in build_loader(config(numbered, backend, 1), "val")])
    loader = build_loader(config(numbered, backend, 1, val={"transform": {"size": 32, "batch_hook":
                                                                          "user_hooks:batch_new_tensors"}}), "val")
    assert torch.equal(torch.cat([images for images, _ in loader]), plain.flip(1))


def test_a_dali_graph_function_adds_its_op_seeded_per_sample(numbered):
    flipped = config(numbered, "dali", dali={"graph_hook": "user_hooks:graph_flip", "graph_hook_args": {"every": 2}})
    loader = build_loader(flipped, "val")
    plain = build_loader(config(numbered, "dali"), "val")
    seeds = np.concatenate([plan[:, 1] for plan in loader.order.batches(0)])
    out = torch.cat([images for images, _ in loader])
    reference = torch.cat([images for images, _ in plain])
    even = torch.from_numpy(seeds % 2 == 0)
    assert torch.equal(out[even], reference[even].flip(2)) and torch.equal(out[~even], reference[~even])
    assert loader.state_dict()["hooks"] == {"graph_hook": "user_hooks:graph_flip"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_two_ranks_each_ranks_hook_draws_are_its_own_samples(numbered, backend):
    stamps = []
    for rank in range(2):
        cfg = {**hooked(numbered, backend, sample_hook="user_hooks:stamp"),
               "distributed": {"rank": rank, "world_size": 2}}
        loader = build_loader(cfg, "train")
        stamps.append([v for images, _ in loader for v in stamped_values(images)])
        assert stamps[rank] == expected_stamps(loader) and len(stamps[rank]) == len(loader) * 4
    assert stamps[0] != stamps[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_replays_the_hooks_draws_and_refuses_other_hooks_unless_forced(numbered, backend, caplog):
    cfg = hooked(numbered, backend, sample_hook="user_hooks:stamp")
    whole = [v for images, _ in build_loader(cfg, "train") for v in stamped_values(images)]
    loader = build_loader(cfg, "train")
    batches = iter(loader)
    first = stamped_values(next(batches)[0])
    state = loader.state_dict()
    assert state["hooks"] == {"sample_hook": "user_hooks:stamp"}
    resumed = build_loader(cfg, "train")
    resumed.load_state_dict(state)
    assert first + [v for images, _ in resumed for v in stamped_values(images)] == whole
    other = build_loader(hooked(numbered, backend, sample_hook="user_hooks:VERSIONED"), "train")
    with pytest.raises(ValueError, match=r"other hooks \(sample_hook: user_hooks:stamp then, user_hooks:VERSIONED@2 "
                                         r"now\).*force_hooks=True"):
        other.load_state_dict(state)
    none = build_loader(config(numbered, backend), "train")
    with pytest.raises(ValueError, match="sample_hook: user_hooks:stamp then, none now"):
        none.load_state_dict(state)
    none.load_state_dict(state, force_hooks=True)
    assert "as force_hooks asks" in caplog.text
    assert sum(len(labels) for _, labels in none) == len(whole) - len(first)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hook_that_raises_stops_the_run_naming_it_the_sample_and_its_traceback(numbered, backend):
    cfg = hooked(numbered, backend, 1, sample_hook="user_hooks:fails")
    cfg["dataset"]["on_bad_image"] = "skip"  # a hook's error is never taken for a bad file
    loader = build_loader(cfg, "train")
    with pytest.raises(HookError, match=r"train\.transform\.sample_hook user_hooks:fails raised KeyError: 'the key' on "
                                        r"sample '.*n_\d\d\.png' \(seed -?\d+\)(.|\n)*user_hooks\.py.*in fails"):
        next(iter(loader))
    assert loader.bad_samples == []


def test_a_sample_hooks_error_beside_a_graph_function_names_the_sample_hook(numbered):
    """A sample hook that raises, in a graph that also has a graph function: the error names the
    sample hook that raised, not the graph function (DALI reports both as an operator's failure;
    the graph function was blamed for any such failure before it). Device: CPU (DALI's CPU flavour)."""
    cfg = hooked(numbered, "dali", 1, sample_hook="user_hooks:fails")
    cfg["dali"] = {"graph_hook": "user_hooks:graph_identity"}
    loader = build_loader(cfg, "train")
    with pytest.raises(HookError) as raised:
        next(iter(loader))
    loader.close()
    said = str(raised.value)
    assert said.startswith("train.transform.sample_hook user_hooks:fails raised KeyError: 'the key'"), said[:300]
    assert "graph_identity" not in said, said[:300]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hook, said", [("shrinks", r"returned a uint8 tensor \[3, 8, 8\] on cpu"),
                                        ("floats", r"returned a float32 tensor \[3, 32, 32\] on cpu")])
def test_a_sample_hook_of_the_wrong_shape_or_dtype_is_named_at_the_first_batch(numbered, backend, hook, said):
    loader = build_loader(hooked(numbered, backend, 0 if backend == "torch" else 1, sample_hook=f"user_hooks:{hook}"),
                          "train")
    with pytest.raises(HookError, match=f"user_hooks:{hook} {said} for sample .*a uint8 torch tensor of the shape it "
                                        r"is given, \[3, 32, 32\]"):
        next(iter(loader))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hook, said", [("batch_wrong_labels", r"returned a tuple of 2 \(.*float32 tensor \[4\]"),
                                        ("batch_fails", r"raised ValueError: batch hook bug on a batch of 4 samples")])
def test_a_batch_hook_that_fails_or_gives_the_wrong_labels_is_named(numbered, backend, hook, said):
    loader = build_loader(config(numbered, backend, 1, train={"transform": {"size": 32, "batch_hook":
                                                                            f"user_hooks:{hook}"}}), "train")
    with pytest.raises(HookError, match=f"train.transform.batch_hook user_hooks:{hook} {said}"):
        next(iter(loader))


def test_a_stalled_dali_pipeline_names_the_hook_running_while_the_feed_reads_beside_it(numbered):
    """DALI runs a sample hook on its own threads while the driver thread feeds the next batches: a
    read that ends after the hook began must not erase it from what a stall names (one shared slot
    did, and a hung hook was reported as DALI stuck, on a loaded machine). The CPU flavour."""
    import threading

    from dali_loader.user_ops import PythonSampleHook
    from fastloader.hooks import Hook

    started, release = threading.Event(), threading.Event()

    def waits(image, generator):
        started.set()
        release.wait(30)
        return image

    loader = build_loader(hooked(numbered, "dali", 0, sample_hook="user_hooks:identity"), "train")
    reader, in_progress = loader._reader, loader._reader.in_progress
    hook = PythonSampleHook(Hook(waits, "sample_hook", "train.transform.sample_hook", "tests:waits"),
                            loader.index.path, in_progress)
    running = threading.Thread(target=hook, args=(np.zeros((8, 8, 3), np.uint8), np.array([3, 7])))
    running.start()
    try:
        assert started.wait(10)
        assert reader.read(loader.order.batches(0)[0][:1]).data  # the driver thread reads a sample meanwhile
        words = in_progress.stuck_words()
    finally:
        release.set()
        running.join(10)
        loader.close()
    assert re.fullmatch(r"the loader has been running train\.transform\.sample_hook tests:waits on sample "
                        r"\S+/n_03\.png for \d+ s", words), words
    assert in_progress.stuck_words().startswith("the feed is not reading a sample")  # nothing runs now


def test_a_sample_hook_that_hangs_is_named_by_workers_timeout_and_the_process_still_exits(numbered, tmp_path):
    """torch: the worker is named and killed. DALI: the hook hangs on a DALI thread, which nothing
    can stop; the loader names it, and the process exits (DALI's own exit hook would wait for that
    thread for ever), in a process of its own here."""
    cfg = hooked(numbered, "torch", 1, sample_hook="user_hooks:hangs")
    cfg["workers"]["timeout"] = 0.5
    with pytest.raises(RuntimeError, match=r"The workers run your train\.transform\.sample_hook user_hooks:hangs too"):
        next(iter(build_loader(cfg, "train")))
    cfg = {**cfg, "backend": "dali"}
    script = ("import json, sys; from fastloader import build_loader\n"
              f"loader = build_loader(json.loads({json.dumps(json.dumps(cfg))}), 'train')\n"
              "try:\n    next(iter(loader))\nexcept TimeoutError as error:\n    print(error)\n")
    env = cpu_only_env(tmp_path / "cache", PYTHONPATH=f"{Path(user_hooks.__file__).parent}:{REPO}")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"running train\.transform\.sample_hook user_hooks:hangs on sample .*n_\d\d\.png", done.stdout)


def test_hook_paths_and_places_that_cannot_work_fail_at_build_naming_the_key(numbered):
    with pytest.raises(ConfigError, match=r"train\.transform\.sample_hook: 'no_such_module:f': the module "
                                          r"'no_such_module' does not import"):
        build_loader(hooked(numbered, sample_hook="no_such_module:f"), "train")
    with pytest.raises(ConfigError, match=r"val\.transform\.batch_hook: 'user_hooks:nothing': user_hooks has no "
                                          r"callable 'nothing'"):
        build_loader(config(numbered, val={"transform": {"size": 32, "batch_hook": "user_hooks:nothing"}}), "val")
    with pytest.raises(ConfigError, match=r"must be 'package\.module:function'"):
        build_loader(hooked(numbered, sample_hook="not a path"), "train")
    with pytest.raises(ConfigError, match=r"dali\.graph_hook user_hooks:graph_flip adds operators to a DALI graph, "
                                          r"and split 'train' is read by the torch backend.*set backend: dali"):
        build_loader(config(numbered, dali={"graph_hook": "user_hooks:graph_flip"}), "train")
    with pytest.raises(ConfigError, match=r"build_loader\(sample_hook=\.\.\.\): a int is not callable"):
        build_loader(config(numbered), "train", sample_hook=3)


@pytest.mark.parametrize("hook, said", [("graph_not_a_node", r"returned a bool; a graph function returns the images' "
                                                             r"DataNode"),
                                        ("graph_resizes", r"gave images of 8x8 pixels.*the size it is given, 32x32")])
def test_a_graph_function_that_gives_no_images_or_another_size_is_named(numbered, hook, said):
    with pytest.raises(HookError, match=f"dali.graph_hook user_hooks:{hook} {said}"):
        next(iter(build_loader(config(numbered, "dali", dali={"graph_hook": f"user_hooks:{hook}"}), "val")))


def test_where_workers_are_spawned_a_hook_that_cannot_pickle_fails_at_build(numbered, monkeypatch):
    import torch_loader.loader
    monkeypatch.setattr(torch_loader.loader, "fork_context", lambda: None)  # what macOS and Windows get
    with pytest.raises(ConfigError, match=r"build_loader\(sample_hook=\.\.\.\) .*<lambda> cannot be pickled.*spawn.*"
                                          r"top level of a module"):
        build_loader(config(numbered, workers=1), "train", sample_hook=lambda image, generator: image)
    by_path = load_hook("user_hooks:stamp", "sample_hook", "train.transform.sample_hook", "test")
    assert pickle.loads(pickle.dumps(by_path)).function is user_hooks.stamp  # imported again by its path


def test_the_hooks_on_a_colour_coded_split_keep_every_sample_once(numbered):
    loader = build_loader(config(numbered, "torch", 2, train={"transform": {
        "size": 32, "sample_hook": "user_hooks:identity", "batch_hook": "user_hooks:batch_identity"}}), "train")
    colours = [colour for images, _ in loader for colour in identities(images)]
    assert len(colours) == len(set(colours)) == len(loader) * 4


def test_a_graph_function_that_leaves_the_seeds_unused_builds_without_dalis_warning(numbered):
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = build_loader(config(numbered, "dali", dali={"graph_hook": "user_hooks:graph_identity"}), "val")
    assert [str(w.message) for w in caught if "is not used" in str(w.message)] == []
    assert sum(len(labels) for _, labels in loader) == loader.num_samples


def test_check_names_each_hook_and_a_path_that_does_not_import(tmp_path, capsys):
    """check said "no problems" for a sample hook that a loader would refuse at build."""
    from fastloader.cli import main
    config = tmp_path / "c.yaml"
    config.write_text("dataset: {root: builtin:sample}\ntrain: {transform: {sample_hook: 'user_hooks:stamp'}}\n"
                      "val: {transform: {batch_hook: 'user_hooks:nothing'}}\n")
    assert main(["check", str(config)]) == 1
    out = capsys.readouterr().out
    assert "  hook: train.transform.sample_hook user_hooks:stamp" in out
    assert re.search(r"problem: .*val\.transform\.batch_hook: 'user_hooks:nothing': user_hooks has no callable "
                     r"'nothing'", out)


@pytest.mark.parametrize("backend, workers, erase", [("torch", 1, 0.0), ("torch", 0, 0.5), ("dali", 1, 0.5)])
def test_a_batch_hook_may_keep_what_it_is_given(numbered, backend, workers, erase):
    """The torch workers ran the hook on a view of a batch buffer they reuse: a hook that kept its
    input (a memory bank) found it holding another batch later. DALI's stayed. Now both: the hook's
    input is its own, never written again, random erasing included (it runs after the hook)."""
    user_hooks.KEPT.clear()
    cfg = config(numbered, backend, workers, train={"batch_size": 4, "transform": {
        "size": 32, "erase_prob": erase, "batch_hook": "user_hooks:batch_keeps"}})
    with build_loader(cfg, "train") as loader:
        for _ in range(3):  # more batches than a worker has buffers: each is reused
            assert sum(len(labels) for _, labels in loader) == len(loader) * 4


@pytest.mark.parametrize("hook", ["batch_channels_last", "batch_expanded"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_hooks_output_is_laid_out_as_the_loader_gives_batches(numbered, backend, hook):
    """DALI passed the hook's tensor through as it came (channels_last, an expanded view: in-place
    ops on the batch failed) where the torch backend copied it into its batch. Both lay it out as
    output.channels_last says."""
    loader = build_loader(config(numbered, backend, 1, val={"transform": {"size": 32, "batch_hook":
                                                                          f"user_hooks:{hook}"}}), "val")
    for images, _ in loader:
        assert images.is_contiguous() and images.stride()[-1] == 1
        images.add_(1.0)  # the trainer's in-place ops work on it


def test_a_hooks_record_tells_apart_hooks_of_one_type_and_stays_across_runs():
    """Every torchvision Compose recorded as `with_global_rng(...:Compose)`, every partial as
    `functools:partial`, every lambda alike: a state saved with one Compose loaded silently into a
    loader with another. Now the record carries what tells them apart, the same in every process."""
    import functools

    from torchvision.transforms import v2

    from fastloader.hooks import load_hook

    def record(function):
        return load_hook(function, "sample_hook", "train.transform.sample_hook", "<test>").record()

    weak, strong = v2.Compose([v2.RandomHorizontalFlip(0.5)]), v2.Compose([v2.RandomHorizontalFlip(0.9)])
    assert record(weak) != record(strong) and record(weak) == record(v2.Compose([v2.RandomHorizontalFlip(0.5)]))
    assert record(weak).startswith("with_global_rng(torchvision.transforms.v2._container:Compose)#")
    assert record(functools.partial(user_hooks.stamp)) != record(functools.partial(user_hooks.stamp, generator=None))
    assert record(lambda image, generator: image) != record(lambda image, generator: image.flip(-1))
    assert record(user_hooks.stamp) == "user_hooks:stamp"  # a module's function: its name says it
    script = ("import sys; sys.path.insert(0, 'tests'); from torchvision.transforms import v2; "
              "from fastloader.hooks import load_hook; print(load_hook(v2.Compose([v2.RandomHorizontalFlip(0.5)]), "
              "'sample_hook', 'k', 'w').record())")
    other_process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                                   timeout=120)
    assert other_process.stdout.strip() == record(weak), other_process.stderr


@pytest.mark.parametrize("backend, workers", [("torch", 1), ("torch", 0), ("dali", 1)])
@pytest.mark.parametrize("hook, kind, said", [
    ("exits", "sample_hook", r"called sys\.exit\(3\)"), ("interrupts", "sample_hook", "raised KeyboardInterrupt"),
    ("batch_exits", "batch_hook", r"called sys\.exit\('stop'\)")])
def test_a_hook_that_exits_or_interrupts_is_the_hooks_failure_in_its_own_words(numbered, backend, workers, hook,
                                                                               kind, said):
    """torch said a worker 'exited unexpectedly ... the out-of-memory killer'; DALI named files. And a
    HookError from a torch worker came wrapped in torch's 'Caught HookError in DataLoader worker
    process 0. Original Traceback' and some 20 frames: now the sentence alone, on both backends."""
    loader = build_loader(hooked(numbered, backend, workers, **{kind: f"user_hooks:{hook}"}), "train")
    with pytest.raises(HookError) as caught:
        next(iter(loader))
    text = str(caught.value)
    assert re.match(rf"train\.transform\.{kind} user_hooks:{hook} {said} on ", text), text[:300]
    assert "cannot end the process" in text and "Caught HookError" not in text
    assert loader.bad_samples == []


def test_a_hook_module_that_exits_while_it_is_imported_is_a_config_error_naming_the_key(tmp_path, numbered):
    """argparse at a module's top level: build_loader raised SystemExit, so `fastloader show` and
    `bench` exited 0 having done nothing, and `check` stopped half-way with status 0."""
    (tmp_path / "parses_args.py").write_text("import argparse\nargparse.ArgumentParser().parse_args(['--nope'])\n"
                                             "def hook(image, generator):\n    return image\n")
    config = tmp_path / "exits.yaml"
    config.write_text(json.dumps(hooked(numbered, "torch", 0, sample_hook="parses_args:hook")))
    env = cpu_only_env(tmp_path / "cache")
    for command in (["show", str(config), "--out", str(tmp_path / "grid.png")], ["check", str(config)]):
        result = subprocess.run([sys.executable, "-m", "fastloader.cli", *command], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=240)
        out = result.stdout + result.stderr
        assert result.returncode == 2 if command[0] == "show" else result.returncode != 0, (command, out[-2000:])
        assert "train.transform.sample_hook: 'parses_args:hook': the module 'parses_args' exited while it was " \
               "imported (sys.exit(2)" in out, out[-2000:]
        assert "Traceback" not in out


def test_the_command_line_finds_a_hook_module_in_the_working_folder_or_beside_the_config(tmp_path, numbered):
    """A script finds a module beside it; `fastloader show` (a console script) found neither one in
    the working folder nor one beside the config."""
    beside = tmp_path / "configs"
    beside.mkdir()
    (beside / "beside_hooks.py").write_text("def hook(image, generator):\n    return image\n")
    config = beside / "hooked.yaml"
    config.write_text(json.dumps(hooked(numbered, "torch", 0, sample_hook="beside_hooks:hook")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([sys.executable, "-m", "fastloader.cli", "show", str(config), "--out",
                             str(tmp_path / "grid.png")], cwd=elsewhere, env=cpu_only_env(tmp_path / "cache"),
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("hook, dali_said", [("graph_gives_seeds", "The number of dimensions 0 does not match"),
                                             ("graph_gives_grey", "per_channel_arg_size")])
def test_a_graph_function_returning_the_wrong_datanode_is_named_not_dalis_raw_error(numbered, hook, dali_said):
    """The seeds' DataNode, or a grey image: DALI's 'Critical error in pipeline ... crop_mirror_normalize'
    or a probe of every file of the batch. Now the function, what was expected, and DALI's words."""
    loader = build_loader(config(numbered, "dali", dali={"graph_hook": f"user_hooks:{hook}"}), "val")
    with pytest.raises(HookError) as caught:
        next(iter(loader))
    text = str(caught.value)
    assert text.startswith(f"dali.graph_hook user_hooks:{hook} returned a DataNode the rest of the graph cannot "
                           f"take as the images: a graph function returns its images' DataNode changed, HWC uint8 of "
                           f"3 channels"), text
    assert dali_said in text and loader.bad_samples == []
