"""`fastloader show`: a grid of samples as the model sees them, de-normalized and captioned.

Looking at the batches is the quickest check that crops, flips, labels and normalization are what
the config says. The pixels shown are the loader's own output mapped back through mean/std, so a
wrong normalization or a wrong label shows up here rather than as a slow training run. With mixup,
cutmix or label smoothing on, the labels are soft targets: each tile is captioned with its two
largest weights ("class: weight", one line each), so a blend or a pasted box shows next to how much
of each class the loss will see.

Only the standard library is imported at module level: cli.py imports every command module to
build its parser, and `fastloader --help` must not wait for torch or Pillow.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from ..words import plural

HELP = "save a grid of augmented samples, de-normalized and captioned with their classes"
EXAMPLES = """  fastloader show configs/sample.yaml --out grid.png
  fastloader show configs/sample.yaml --out val.png --split val --n 25 --backend dali
  fastloader show configs/sample.yaml --out epoch3.png --epoch 3 --seed 1
  fastloader show configs/sample.yaml --out ops.png --ops --set train.transform.auto_augment=rand-m9-mstd0.5-inc1
"""

MIN_TILE = 128
"""Tiles smaller than SMALL_TILE are scaled up (nearest neighbour) to at least this many pixels."""
SMALL_TILE = 96
"""Below this side a caption of the default font no longer fits, so the tile is enlarged."""
PAD = 4
"""Pixels between tiles and around the grid."""
HEADER_HEIGHT = 20
"""The band at the top holding the one-line header."""
CAPTION_HEIGHT = 16
"""The band under each tile holding one line of caption (the default font is about 12 px high)."""
OPS_LINES = 2
"""Caption lines under each tile for its ops with --ops (cut with '..' beyond)."""
SOFT_LINES = 2
"""Caption lines of a tile with a soft target: its two largest class weights."""
BACKGROUND = (255, 255, 255)
TEXT = (20, 20, 20)


@dataclass(frozen=True)
class Layout:
    """Where everything goes: a grid of `columns` x `rows` tiles of `tile_w` x `tile_h` pixels."""

    count: int
    columns: int
    rows: int
    tile_w: int
    tile_h: int
    caption_lines: int = 1

    @property
    def caption_height(self) -> int:
        return CAPTION_HEIGHT * self.caption_lines

    @property
    def grid_size(self) -> tuple[int, int]:
        """(width, height) of header + tiles + captions, before any widening for the header."""
        return (PAD + self.columns * (self.tile_w + PAD),
                HEADER_HEIGHT + self.rows * (self.tile_h + self.caption_height + PAD))

    def tile_origin(self, i: int) -> tuple[int, int]:
        """Top-left corner of tile i; tiles fill rows left to right, in the loader's order."""
        row, column = divmod(i, self.columns)
        return PAD + column * (self.tile_w + PAD), HEADER_HEIGHT + row * (self.tile_h + self.caption_height + PAD)


def make_layout(count: int, height: int, width: int, caption_lines: int = 1, columns: int | None = None) -> Layout:
    """An about-square grid (columns = ceil(sqrt(n)), or `columns`: a sample's views in a row) with
    tiles scaled up when too small to caption."""
    columns = columns or max(1, math.ceil(math.sqrt(count)))
    rows = max(1, math.ceil(count / columns))
    factor = upscale_factor(height, width)
    return Layout(count, columns, rows, width * factor, height * factor, caption_lines)


def upscale_factor(height: int, width: int) -> int:
    """An integer factor, so that nearest-neighbour scaling keeps every pixel a clean block."""
    side = min(height, width)
    return 1 if side >= SMALL_TILE else math.ceil(MIN_TILE / side)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, metavar="PATH", help="PNG file to write (folders are created)")
    parser.add_argument("--split", default="train", help="split section to read (default: train)")
    parser.add_argument("--n", type=_positive, default=16, help="samples to show (default: 16)")
    parser.add_argument("--backend", choices=("auto", "torch", "dali"), help="override the config's backend")
    parser.add_argument("--seed", type=_non_negative, help="override the config's seed, to see other draws")
    parser.add_argument("--epoch", type=_non_negative, default=0,
                        help="epoch to draw from: its order and crops follow (seed, epoch) (default: 0)")
    parser.add_argument("--ops", action="store_true",
                        help="caption each tile with its flips and ops, e.g. 'hflip rotate(-27.3) posterize(1)'")


def run(args) -> int:
    from .. import build_loader
    from ..config import load_config
    from ..errors import BadImageError
    from . import no_batch_error
    config = load_config(args.config, args.overrides)
    for option, key, value in (("--backend", "backend", args.backend), ("--seed", "seed", args.seed)):
        if value is not None:  # shorthands for --set that win over it, and that the log names as the command
            config = load_config(config, {key: value}, origin=f"the command's {option} {value}")
    with build_loader(config, split=args.split) as loader:
        if len(loader) == 0:
            raise no_batch_error(loader)
        loader.set_epoch(args.epoch)
        images, labels = first_samples(loader, args.n)
        views = loader.views
        names = [f"{g.name}{'' if g.count == 1 else f' {k}'}" for g in views.groups for k in range(g.count)] \
            if views else None
        if len(labels) == 0:
            raise BadImageError(f"split '{args.split}' yielded no sample in epoch {args.epoch}: its files could not "
                                f"be decoded ({len(loader.bad_samples)} in loader.bad_samples; the warnings above "
                                f"name them); `fastloader check {args.config}` lists them")
        pixels = denormalize(images, loader.config.normalize.mean, loader.config.normalize.std)
        header = (f"{Path(args.config).name} split {args.split}, backend {loader.backend}, "
                  f"epoch {args.epoch}, seed {loader.config.seed}")
        soft = labels.is_floating_point()
        captions = soft_captions(labels, loader.classes) if soft else [
            [f"{int(label)}: {loader.classes[int(label)]}"] for label in labels]
        if names:  # a row per sample: each of its views, captioned with its view's name and the class
            captions = [[f"{name}: {loader.classes[int(label)]}"] for label in labels for name in names]
        backend, available = loader.backend, loader.num_samples
        ops = sample_ops(loader, args.epoch, labels) if args.ops else None
    label_lines = SOFT_LINES if soft else 1
    layout = make_layout(len(captions), pixels.shape[1], pixels.shape[2], label_lines + (OPS_LINES if ops else 0),
                         columns=len(names) if names else None)
    canvas = render(pixels, captions, header, layout, ops)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(out, format="PNG", optimize=True)
    if len(labels) < args.n:
        print(f"split '{args.split}' yields {plural(len(captions), 'sample')} in epoch {args.epoch} "
              f"({available} in the split), fewer than --n {args.n}: showing them all")
    soft_words = ", captioned with their soft targets' top-2 classes" if soft else ""
    shown = f"{plural(len(labels), 'sample')} x {len(names)} views" if names else plural(len(captions), "sample")
    print(f"wrote {args.out}: {shown} of split '{args.split}' (backend {backend}), "
          f"{layout.columns}x{layout.rows} tiles of {layout.tile_w}x{layout.tile_h} px{soft_words}")
    return 0


def soft_captions(targets, classes) -> list[list[str]]:
    """Each soft target's two largest weights, "class: weight", largest first (one line each)."""
    weights, labels = targets.float().topk(min(SOFT_LINES, targets.shape[1]), dim=1)
    return [[f"{classes[int(c)]}: {float(w):.2f}" for w, c in zip(row_w, row_c)]
            for row_w, row_c in zip(weights, labels)]


def sample_ops(loader, epoch: int, labels) -> list[str] | None:
    """Each shown sample's flips and ops, drawn from its seed as the loader drew them; None, said
    why, where there are none (eval) or where a skipped file makes the samples differ from the plan."""
    import numpy as np

    from ..draws import ops_text
    if loader.augmentation is None:
        print(f"--ops: split '{loader.split.name}' is in eval mode: no random flips or ops to caption")
        return None
    plan = np.concatenate(loader.order.batches(epoch))[:len(labels)]
    # a skipped file shifts the samples shown: int labels show it; soft targets (mixed) cannot
    skipped = loader._skipped.in_epoch if labels.is_floating_point() else not np.array_equal(
        loader.index.labels[plan[:, 0]], labels.numpy())
    if skipped:
        print("--ops: a file was skipped, so the samples shown are not those planned; ops captions left out")
        return None
    if loader.views is not None:  # each view's ops, drawn by its group from its seed; tiles sample by sample
        seeds = loader.views.seeds(plan[:, 1])
        texts = [[ops_text(*row) for row in zip(*group.augmenter.draw_ops(seeds[view]))]
                 for view, group in enumerate(loader.views.group_of_view)]
        return [texts[view][i] for i in range(len(plan)) for view in range(len(texts))]
    hflip, vflip, op, param = loader.augmentation.draw_ops(plan[:, 1])
    return [ops_text(*row) for row in zip(hflip, vflip, op, param)]


def first_samples(loader, n: int):
    """The first n samples of the loader's epoch, across batches; stops early so no more is decoded."""
    import torch
    images, labels, taken = [], [], 0
    for batch_images, batch_labels in loader:
        keep = rows = min(n - taken, len(batch_labels))
        if isinstance(batch_images, list):  # views: each sample's views in a row, at the largest view's size
            if not keep:
                continue  # an empty batch: none of its files could be decoded
            batch_images = _views_in_rows(batch_images, len(batch_labels))
            rows = keep * len(batch_images) // len(batch_labels)
        images.append(batch_images[:rows].detach().cpu())
        labels.append(batch_labels[:keep].detach().cpu())
        taken += keep
        if taken >= n:
            break
    if not labels:
        return torch.empty(0, 3, 1, 1), torch.empty(0, dtype=torch.int64)
    side = max(batch.shape[-1] for batch in images)  # a size per batch (transform.sizes): shown at the largest
    images = [batch if batch.shape[-1] == side else
              torch.nn.functional.interpolate(batch.float(), size=(side, side), mode="nearest").to(batch.dtype)
              for batch in images]
    return torch.cat(images), torch.cat(labels)


def _views_in_rows(groups, count: int):
    """A batch's view groups ([views * B, 3, S, S] each, crop-major) as one tensor of every sample's
    views in turn (sample 0's views, then sample 1's), each scaled (nearest) to the largest size."""
    import torch
    side = max(group.shape[-1] for group in groups)
    views = [group[k * count:(k + 1) * count] for group in groups for k in range(len(group) // max(1, count))]
    views = [view if view.shape[-1] == side else
             torch.nn.functional.interpolate(view.float(), size=(side, side), mode="nearest").to(view.dtype)
             for view in views]
    return torch.stack(views, dim=1).flatten(0, 1)


def denormalize(images, mean, std):
    """Normalized float [N, 3, H, W] (any dtype or memory format) -> uint8 [N, H, W, 3] for Pillow.

    Computed in float32: half and bfloat16 lack the precision to land on the right uint8 value.
    """
    import torch
    x = images.to(device="cpu", dtype=torch.float32)
    x = x * torch.tensor(std).view(1, 3, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1)
    x = (x.clamp(0, 1) * 255).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).contiguous()  # NHWC in memory whatever the input's layout was


def render(pixels, captions: list[list[str]], header: str, layout: Layout, ops: list[str] | None = None):
    """The grid as a Pillow image: header, then tiles in order, each captioned with its lines ("label:
    class", or a soft target's "class: weight" lines), and its ops wrapped over the lines below."""
    from PIL import Image, ImageDraw, ImageFont
    font = ImageFont.load_default()
    draw_probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    width, height = layout.grid_size
    width = max(width, int(draw_probe.textlength(header, font=font)) + 2 * PAD)  # never cut the header
    canvas = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    draw.text((PAD, 4), header, fill=TEXT, font=font)
    for i, lines in enumerate(captions):
        x, y = layout.tile_origin(i)
        tile = Image.fromarray(pixels[i].numpy())
        if tile.size != (layout.tile_w, layout.tile_h):
            tile = tile.resize((layout.tile_w, layout.tile_h), Image.Resampling.NEAREST)
        canvas.paste(tile, (x, y))
        ops_lines = wrap_text(draw, ops[i], font, layout.tile_w, layout.caption_lines - len(lines)) if ops else []
        for line, text in enumerate([fit_text(draw, text, font, layout.tile_w) for text in lines] + ops_lines):
            draw.text((x, y + layout.tile_h + 2 + CAPTION_HEIGHT * line), text, fill=TEXT, font=font)
    return canvas


def wrap_text(draw, text: str, font, width: int, lines: int) -> list[str]:
    """Words over at most `lines` lines of `width` pixels, the last cut with '..' if needed."""
    out, words = [], text.split()
    while words and len(out) < lines - 1:
        taken = 1
        while taken < len(words) and draw.textlength(" ".join(words[:taken + 1]), font=font) <= width:
            taken += 1
        out.append(fit_text(draw, " ".join(words[:taken]), font, width))
        words = words[taken:]
    return out + ([fit_text(draw, " ".join(words), font, width)] if words else [])


def fit_text(draw, text: str, font, width: int) -> str:
    """The text, cut with '..' where it is wider than the tile (ASCII: the default font has no ellipsis)."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "..", font=font) > width:
        text = text[:-1]
    return text + ".."
