"""Several views of each sample (train.views, docs/views.md) on both backends (DALI: its CPU
flavour here; the GPU flavour's line is in test_cuda.py): one tensor per view group, crop-major;
each view its group's crop, drawn from its own seed, the same on both backends and after a resume;
the hooks run per view; what views cannot mean is refused at load, naming the key."""
from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
import torch
import user_hooks
from conftest import base_config, write_textured_dataset

import torch_loader.views as torch_views
from fastloader import build_loader, load_config
from fastloader.errors import ConfigError
from fastloader.sources.formats import build_index
from fastloader.views import ViewPlan
from torch_loader.loader import normalizer_of, sample_transform

BACKENDS = ["torch", "dali"]
GROUPS = [{"count": 2, "size": 32, "scale": [0.4, 1.0], "name": "global"},
          {"count": 3, "size": 16, "scale": [0.05, 0.4], "name": "local", "gaussian_blur_prob": 0.5}]


@pytest.fixture(scope="module")
def textured(tmp_path_factory):
    return write_textured_dataset(tmp_path_factory.mktemp("textured"), per_class=4, splits=("train",))


def views_config(root, backend="torch", workers=0, groups=GROUPS, dataset=None, **train):
    transform = train.pop("transform", {})
    return base_config(root, backend=backend, workers={"num_workers": workers}, dataset=dataset or {},
                       train={"batch_size": 4, "transform": {"size": 32, **transform}, "views": groups, **train})


def backend_or_skip(backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is installed on Linux x86_64 / aarch64 only")


def epoch(loader) -> tuple[list[list[torch.Tensor]], list[int]]:
    batches, labels = [], []
    for images, batch_labels in loader:
        batches.append(images)
        labels += batch_labels.tolist()
    return batches, labels


DINO_OPS = {"color_jitter": [0.4, 0.4, 0.2, 0.1], "color_jitter_prob": 0.8, "grayscale_prob": 0.2}
DINO_GROUPS = [{**GROUPS[0], "gaussian_blur_prob": 1.0, "solarize_prob": 0.5}, GROUPS[1]]


@pytest.mark.parametrize("backend, ops, stacked", [("torch", False, True), ("dali", False, False),
                                                   ("torch", True, True), ("dali", True, False), ("dali", True, True)])
def test_each_view_is_its_groups_crop_from_its_own_seed_crop_major(textured, backend, ops, stacked, monkeypatch):
    """Device: CPU. View k of sample i is row k * B + i of its group's tensor, and it is what the
    group's transform gives for the sample alone with the view's seed (torch: pixel for pixel; DALI
    within the backends' train tolerance); with DINOv2's per-view ops too, which the torch backend
    runs on a group's views of the batch at once, in chunks (here of 5 views), and DALI view by view
    or, stacked, on a group's views as the frames of one sequence (dali_loader/view_ops.py)."""
    backend_or_skip(backend)
    monkeypatch.setattr(torch_views, "STACK_BYTES", 5 * 3 * 32 * 32 * 4)
    raw = views_config(textured, backend, view_ops="stacked" if stacked else "per_view",
                       **({"transform": DINO_OPS, "groups": DINO_GROUPS} if ops else {}))
    with build_loader(raw, "train") as loader:
        if backend == "torch":  # the ops wait for the collate, stacked
            assert loader._dataloader.collate_fn.transform.stacked_ops
        assert loader.views is not None and "views=[2 x 32 px (global), 3 x 16 px (local)]" in repr(loader)
        assert loader.describe()["views"] == {"global": [2, 32], "local": [3, 16]}
        plan = loader.order.batches(0)[0]
        images, labels = next(iter(loader))
    assert [tuple(g.shape) for g in images] == [(8, 3, 32, 32), (12, 3, 16, 16)] and labels.shape == (4,)
    config = load_config(raw)
    index = build_index(config, config.split("train"))
    views = ViewPlan(config.split("train"), config.normalize.mean)
    seeds = views.seeds(plan[:, 1])
    normalizer = normalizer_of(config, torch.device("cpu"))
    worst = 0.0
    for group, tensor in zip(views.groups, images):
        alone = sample_transform(group.split, use_draft=False)
        for k in range(group.count):
            for i, (sample, _) in enumerate(plan.tolist()):
                expected = torch.empty(3, group.size, group.size)
                normalizer.into(expected, alone(index.path(sample), int(seeds[group.first + k, i])))
                got = tensor[k * len(plan) + i]
                if backend == "torch":
                    assert torch.equal(got, expected), (group.name, k, i)
                worst = max(worst, float((got - expected).abs().mean()))
    assert worst < 0.15, worst  # DALI: the backends' per-image train bound (docs/semantics.md)
    assert labels.tolist() == [int(index.label(s)) for s in plan[:, 0]]


def test_the_views_of_a_sample_differ_and_replay_by_seed_and_epoch(textured):
    """Device: CPU. Views of one sample are different crops; the same seed and epoch give the same
    views in a new loader; the next epoch gives others."""
    raw = views_config(textured)
    first, _ = epoch(build_loader(raw, "train"))
    again, _ = epoch(build_loader(raw, "train"))
    assert all(torch.equal(a, b) for x, y in zip(first, again) for a, b in zip(x, y))
    loader = build_loader(raw, "train")
    loader.set_epoch(1)
    later, _ = epoch(loader)
    assert not torch.equal(first[0][0], later[0][0])
    global_views = first[0][0]
    assert not torch.equal(global_views[0], global_views[4])  # sample 0's two global views


def test_each_loader_runs_its_view_ops_as_its_own_config_says(textured):
    """Device: CPU. <split>.view_ops is each loader's own: two torch loaders in one process, one per
    view and one stacked, each run their ops their way and give the same pixels (it was a module flag
    that a benchmark flipped for the whole process). DALI's graph stacks only the groups of a config
    that asks. Without views the key is refused, by name."""
    raw = views_config(textured, transform=DINO_OPS, groups=DINO_GROUPS)
    per_view = build_loader({**raw, "train": {**raw["train"], "view_ops": "per_view"}}, "train")
    stacked = build_loader(raw, "train")
    with per_view, stacked:
        one_way, other_way = per_view._dataloader, stacked._dataloader
        assert not one_way.dataset.transform.stacked_ops and one_way.collate_fn.transform is None
        assert other_way.dataset.transform.stacked_ops and other_way.collate_fn.transform is not None
        one, labels = epoch(per_view)
        other, same_labels = epoch(stacked)
    assert labels == same_labels
    assert all(torch.equal(a, b) for x, y in zip(one, other) for a, b in zip(x, y))
    if importlib.util.find_spec("nvidia.dali") is not None:
        from dali_loader.views import stacked_groups
        for ops, expected in (("auto", (False, False)), ("stacked", (True, True)), ("per_view", (False, False))):
            config = load_config({**raw, "train": {**raw["train"], "view_ops": ops}})
            assert stacked_groups(ViewPlan(config.split("train"), config.normalize.mean)) == expected, ops
    plain = base_config(textured, train={"batch_size": 4, "view_ops": "stacked"})
    with pytest.raises(ConfigError, match=r"train\.view_ops: .* has no views; remove train\.view_ops"):
        load_config(plain)


@pytest.mark.parametrize("stacked", [False, True])
def test_the_backends_agree_on_every_view_and_label(textured, stacked):
    """Device: CPU (DALI's CPU flavour). One epoch, every group, within the train tolerance; DALI's
    ops view by view or on each group's views stacked."""
    backend_or_skip("dali")
    raw = views_config(textured, view_ops="stacked" if stacked else "per_view",
                       transform={"color_jitter": [0.4, 0.4, 0.2, 0.1], "color_jitter_prob": 0.8,
                                  "grayscale_prob": 0.2}, groups=[
        {**GROUPS[0], "solarize_prob": 0.5}, GROUPS[1]])
    out = {backend: epoch(build_loader({**raw, "backend": backend}, "train")) for backend in BACKENDS}
    assert out["torch"][1] == out["dali"][1]
    for torch_batch, dali_batch in zip(out["torch"][0], out["dali"][0]):
        for a, b in zip(torch_batch, dali_batch):
            per_image = (a - b).abs().mean(dim=(1, 2, 3))
            assert per_image.mean() < 0.05 and per_image.max() < 0.2, per_image


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_epoch_replays_the_rest_of_the_views(textured, backend):
    """Device: CPU. A state saved after one batch resumes with exactly the views of the rest."""
    backend_or_skip(backend)
    raw = views_config(textured, backend)
    whole, labels = epoch(build_loader(raw, "train"))
    loader = build_loader(raw, "train")
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    resumed = build_loader(raw, "train")
    resumed.load_state_dict(state)
    rest, rest_labels = epoch(resumed)
    assert rest_labels == labels[4:] and len(rest) == len(whole) - 1
    assert all(torch.equal(a, b) for x, y in zip(whole[1:], rest) for a, b in zip(x, y))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hook", ["stamp", "GLOBAL_STAMP"])
def test_the_sample_hook_runs_on_every_view_with_the_views_seed(textured, backend, hook):
    """Device: CPU. user_hooks.stamp writes a grey value drawn from its generator: each view's is
    the draw of Generator(the view's seed); GLOBAL_STAMP draws it from torch's global generator
    (with_global_rng: on DALI in processes of its own, each view's graph branch calling them)."""
    backend_or_skip(backend)
    raw = views_config(textured, backend, transform={"sample_hook": f"user_hooks:{hook}"})
    with build_loader(raw, "train") as loader:
        plan = loader.order.batches(0)[0]
        images, _ = next(iter(loader))
    seeds = loader.views.seeds(plan[:, 1])
    for group, tensor in zip(loader.views.groups, images):
        rgb = tensor[:, 0, 0, :].float().mean(dim=1) * 0.229 + 0.485
        got = torch.round(rgb * 255).to(torch.int64).tolist()
        expected = [int(torch.randint(0, 256, (1,), generator=torch.Generator().manual_seed(int(seed))))
                    for k in range(group.count) for seed in seeds[group.first + k]]
        assert got == expected, group.name


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_batch_hook_and_erasing_run_per_view_with_the_views_seeds(textured, backend):
    """Device: CPU. batch_stamp writes each image's seed into pixel (0, 0): every view's rows get
    their view's seeds; erasing set on the local group erases local views only."""
    backend_or_skip(backend)
    groups = [GROUPS[0], {**GROUPS[1], "erase_prob": 1.0, "erase_area": [0.3, 0.5]}]
    raw = views_config(textured, backend, groups=groups, transform={"batch_hook": "user_hooks:batch_stamp"})
    with build_loader(raw, "train") as loader:
        plan = loader.order.batches(0)[0]
        images, _ = next(iter(loader))
    seeds = loader.views.seeds(plan[:, 1])
    for group, tensor in zip(loader.views.groups, images):
        expected = np.concatenate([seeds[group.first + k] % 251 for k in range(group.count)]) / 251
        got = tensor[:, 0, 0, 0].numpy()
        kept = got != 0 if group.name == "local" else np.ones(len(got), dtype=bool)  # erased after the hook
        assert kept.sum() >= len(got) // 2 and np.allclose(got[kept], expected[kept], atol=1e-6), group.name
    zeros = [(tensor == 0).all(dim=1).float().mean(dim=(1, 2)) for tensor in images]
    assert (zeros[1] > 0.25).all() and (zeros[0] < 0.05).all(), zeros


def test_two_ranks_share_the_views_of_one_rank_between_them(textured):
    """Device: CPU. Rank r's views are the views its samples get on one rank (same seeds)."""
    raw = views_config(textured)
    loader = build_loader(raw, "train")
    whole = {int(s): [t[k * 4 + i] for t, g in zip(images, loader.views.groups) for k in range(g.count)]
             for plan, (images, _) in zip(loader.order.batches(0), loader) for i, s in enumerate(plan[:, 0])}
    for rank in range(2):
        ranked = build_loader({**raw, "distributed": {"rank": rank, "world_size": 2}}, "train")
        for plan, (images, _) in zip(ranked.order.batches(0), ranked):
            for i, sample in enumerate(plan[:, 0].tolist()):
                mine = [t[k * 4 + i] for t, g in zip(images, ranked.views.groups) for k in range(g.count)]
                if sample in whole and np.array_equal(ranked.order.batches(0)[0][:, 1], plan[:, 1]):
                    assert all(torch.equal(a, b) for a, b in zip(mine, whole[sample]))
        assert len(ranked) * 2 <= len(loader) * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bad_file_is_refilled_in_every_view(tmp_path, backend):
    """Device: CPU. Under on_bad_image: skip a file found bad when it is read (not screened) gives
    its slot to a substitute, views and all: every group keeps count * B rows."""
    backend_or_skip(backend)
    root = write_textured_dataset(tmp_path, per_class=4, splits=("train",))
    bad = sorted((root / "train" / "a_red").iterdir())[0]
    bad.write_bytes(np.random.default_rng(1).bytes(4000))
    raw = views_config(root, backend, dataset={"root": str(root), "on_bad_image": "skip", "screen": False})
    with build_loader(raw, "train") as loader:
        batches, labels = epoch(loader)
        assert len(labels) == 12 and [path for path, _ in loader.bad_samples] == [str(bad)]
        assert all(len(group) == count * 4 for images in batches for group, count in zip(images, (2, 3)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_from_the_uint8_cache(textured, tmp_path, backend):
    """Device: CPU. The uint8 cache's pixels give each view as the files do (torch: the same pixels)."""
    backend_or_skip(backend)
    from fastloader.cache_write import build_split_cache
    raw = views_config(textured, backend)
    files, _ = epoch(build_loader(raw, "train"))
    config = load_config(raw)  # a short side above every image's: the cache holds them as they are
    split = config.split("train")
    build_split_cache(config, split, build_index(config, split), str(tmp_path / "cache"), 512, workers=0)
    cached, _ = epoch(build_loader({**raw, "dataset": {**raw["dataset"], "cache": str(tmp_path / "cache")}}, "train"))
    for a_batch, b_batch in zip(files, cached):
        for a, b in zip(a_batch, b_batch):
            assert (a - b).abs().mean(dim=(1, 2, 3)).max() < (1e-6 if backend == "torch" else 0.15)


def test_dali_decodes_each_sample_once_for_all_views(textured):
    """Device: CPU. One decoder operator in the graph, one slice per view."""
    backend_or_skip("dali")
    with build_loader(views_config(textured, "dali"), "train") as loader:
        graph = loader._pipeline.pipe.serialize().decode("latin-1")
    assert len(re.findall(r"decoders__Image\b", graph)) == 1 and "ImageSlice" not in graph
    assert len(re.findall(r"\bSlice\b", graph)) == 5


def test_dali_cpu_flavour_reuses_its_view_groups_memory_and_never_a_batch_the_trainer_keeps(textured):
    """Device: CPU (DALI's CPU flavour). Its view groups are copied into host buffers reused from
    batch to batch (views.HostBuffers): a trainer that drops each batch gets the same few buffers
    again, with the pixels of a loader that allocates every batch; one that keeps every batch of
    an epoch gets each intact, none written over by a later one."""
    backend_or_skip("dali")
    raw = views_config(textured, "dali", batch_size=2)
    with build_loader(raw, "train") as loader:
        loader._view_buffers, buffers = None, loader._view_buffers
        fresh = [[group.clone() for group in images] for images, _ in loader]  # a fresh tensor a batch
        loader._view_buffers = buffers
        addresses = set()
        loader.set_epoch(0)
        for batch, (images, _) in enumerate(loader):  # each batch dropped before the next
            assert all(torch.equal(a, b) for a, b in zip(images, fresh[batch])), batch
            addresses.update(group.data_ptr() for group in images)
        del images
        assert len(fresh) == 6 and sum(buffers.made.values()) <= 2 * loader.prefetch_depth
        assert len(addresses) <= sum(buffers.made.values())  # the same buffers, batch after batch
        loader.set_epoch(0)
        kept = [images for images, _ in loader]  # every batch held at once
        assert all(torch.equal(a, b) for batch, images in enumerate(kept) for a, b in zip(images, fresh[batch]))
        assert sum(buffers.made.values()) <= 2 * loader.prefetch_depth  # the rest were fresh tensors


BAD = [
    ({"views": [{"count": 0, "size": 96}]}, "train.views[0].count: must be an integer in [1, 64], got 0"),
    ({"views": [{"count": 2, "size": 0}]}, "train.views[0].size: must be an integer in [1, 8192], got 0"),
    ({"views": [{"count": 2, "szie": 96}]}, "unknown key 'train.views[0].szie'; did you mean 'train.views[0].size'?"),
    ({"views": [{"count": 2, "sizes": [96, 128]}]}, "train.views[0].sizes: is the split's, not a view group's"),
    ({"views": [{"count": 40}, {"count": 30}]}, "train.views: asks for 70 views of each sample; at most 64"),
    ({"views": [{"name": "a"}, {"name": "a"}]}, "train.views[1].name: 'a' names two view groups"),
    ({"views": []}, "train.views: expected a list of view groups"),
    ({"views": [{"count": 2}], "aug_repeats": 3}, "train.aug_repeats: repeats each sample with a new crop"),
    ({"views": [{"count": 2}], "mixup": {"mixup_alpha": 0.8}}, "train.mixup: mixing has no meaning yet with"),
    ({"views": [{"count": 2}], "label_smoothing": 0.1}, "train.label_smoothing: soft targets are not given"),
    ({"views": [{"count": 2}], "transform": {"sizes": [32, 64]}}, "train.transform.sizes: a size schedule has no"),
    ({"views": [{"count": 2}], "transform": {"progressive": {"min_size": 16, "start_epoch": 0, "end_epoch": 2}}},
     "train.transform.progressive: a size"),
]


@pytest.mark.parametrize("train,message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_what_views_cannot_mean_fails_at_load_naming_the_key(textured, train, message):
    with pytest.raises(ConfigError) as caught:
        load_config(base_config(textured, train={"batch_size": 4, **train}))
    assert message in str(caught.value)


def test_views_in_an_eval_split_are_refused_with_the_fix(textured):
    with pytest.raises(ConfigError, match=r"val.views: applies only to train mode, and split 'val' has mode: eval.*"
                                          r"remove val.views, or set val.mode: train"):
        load_config(base_config(textured, val={"batch_size": 4, "views": [{"count": 2}]}))


def test_a_view_group_inherits_the_splits_transform_and_overrides_its_own_keys(textured):
    config = load_config(views_config(textured, transform={"color_jitter": 0.4, "hflip": 0.0}))
    glob, local = config.split("train").views
    assert glob.transform.color_jitter == local.transform.color_jitter == 0.4 and glob.transform.hflip == 0.0
    assert (glob.transform.size, local.transform.size) == (32, 16) and local.transform.gaussian_blur_prob == 0.5
    assert glob.transform.gaussian_blur_prob == 0.0 and glob.name == "global"
    assert user_hooks  # the hooks module the tests above name by path


def test_the_torch_backend_decodes_each_sample_once_for_all_its_views(textured, monkeypatch):
    """Device: CPU. One decoder call per sample however many views (the decoder counted, not
    replaced), and its region is the union of the views' boxes."""
    import torch_loader.views as views_module
    calls = []
    real = views_module.load_region

    def counted(where, choose_crop, size, **options):
        decoded = real(where, choose_crop, size, **options)
        calls.append(decoded.crop)
        return decoded
    monkeypatch.setattr(views_module, "load_region", counted)
    with build_loader(views_config(textured), "train") as loader:
        images, labels = next(iter(loader))
    assert len(calls) == len(labels) == 4 and sum(len(group) for group in images) == 5 * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_from_tar_shards_and_parquet_are_the_folders_views(textured, tmp_path, backend):
    """Device: CPU. The same samples as tar shards and as parquet rows give the same views as the
    folder, label for label (the views come after the byte seam: any source gives them)."""
    from shardfiles import pack_folder_split
    from tablefiles import split_as_parquet
    backend_or_skip(backend)
    raw = views_config(textured, backend, shuffle=False)
    folder, labels = epoch(build_loader(raw, "train"))
    pack_folder_split(textured / "train", tmp_path / "shards", "train", per_shard=5)
    split_as_parquet(textured / "train", tmp_path / "parquet", files=2, row_group_size=4)
    for fmt, key, files in (("webdataset", "shards", "train-{000000..000002}.tar"),
                            ("parquet", "files", "train-*.parquet")):
        folder_of = tmp_path / ("shards" if fmt == "webdataset" else "parquet")
        other = {**raw, "dataset": {"root": str(folder_of), "format": fmt},
                 "train": {**raw["train"], key: files}}
        batches, other_labels = epoch(build_loader(other, "train"))
        assert other_labels == labels, fmt
        for a_batch, b_batch in zip(folder, batches):
            for a, b in zip(a_batch, b_batch):
                assert (a - b).abs().mean(dim=(1, 2, 3)).max() < 1e-6, fmt


def test_the_build_log_says_each_view_group_on_a_line_of_its_own(textured, caplog):
    """DINOv2's recipe logged one line of some 1,200 characters: the loader's line and each group's."""
    import logging

    from conftest import REPO

    config = load_config(str(REPO / "configs" / "recipes" / "dinov2.yaml"), {"dataset.root": str(textured),
                                                                              "output.device": "cpu",
                                                                              "workers.num_workers": 0})
    with caplog.at_level(logging.INFO, logger="fastloader"), build_loader(config, "train"):
        pass
    lines = [r.message for r in caplog.records if "views " in r.message]
    assert len(lines) == 3 and max(len(line) for line in lines) < 500, [len(line) for line in lines]
    assert [line.split(",")[0] for line in lines] == ["split 'train': views global1: 1 x 224 px",
                                                     "split 'train': views global2: 1 x 224 px",
                                                     "split 'train': views local: 8 x 96 px"]
