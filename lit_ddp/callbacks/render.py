"""Figures for the dashboard drawn with Pillow (already a dependency): an image grid with captions and a
labelled confusion matrix. Both return (3, H, W) uint8 tensors, what every sink's ``image`` takes.
"""

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

FONT_SIZE = 11


def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default(size=FONT_SIZE)  # Pillow's embedded font: no system font needed


def _text_width(draw: ImageDraw.ImageDraw, text: str, font) -> int:
    left, _, right, _ = draw.textbbox((0, 0), text, font=font)
    return right - left


def _to_tensor(img: Image.Image) -> Tensor:
    return torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1).contiguous()


def image_grid(images: Tensor, captions: Sequence[str], ncol: int = 8, tile: int = 64) -> Tensor:
    """(B, C, H, W) uint8 images (C = 1 or 3) → one (3, H', W') uint8 grid, each image ``tile`` px wide
    (nearest-neighbour when enlarging, so 32 px images stay crisp) with its caption underneath."""
    b, c, h, w = images.shape
    x = images.expand(b, 3, h, w) if c == 1 else images[:, :3]
    th = round(tile * h / w)
    mode = "nearest" if th >= h else "area"
    x = F.interpolate(x.float(), size=(th, tile), mode=mode).round().clamp(0, 255).to(torch.uint8)
    font, pad, caption_h = _font(), 2, FONT_SIZE + 4
    ncol = min(ncol, b)
    nrow = -(-b // ncol)
    cell_w, cell_h = tile + 2 * pad, th + caption_h + 2 * pad
    canvas = Image.new("RGB", (ncol * cell_w, nrow * cell_h), "white")
    draw = ImageDraw.Draw(canvas)
    for i in range(b):
        col, row = i % ncol, i // ncol
        left, top = col * cell_w + pad, row * cell_h + pad
        canvas.paste(Image.fromarray(x[i].permute(1, 2, 0).cpu().numpy()), (left, top))
        text = captions[i]
        while len(text) > 1 and _text_width(draw, text, font) > tile:  # truncate long class names
            text = text[:-1]
        draw.text((left + (tile - _text_width(draw, text, font)) // 2, top + th + 1), text, "black", font)
    return _to_tensor(canvas)


def confusion_figure(matrix: Tensor, class_names: Sequence[str]) -> Tensor:
    """(C, C) counts, rows = true class, columns = predicted → a (3, H, W) uint8 heat map: each cell
    shaded by its share of the true class (white 0 → blue 1), with the count written in it, and each
    row's accuracy (recall) on the right."""
    counts = matrix.detach().cpu().long()
    n = counts.shape[0]
    names = [str(s) for s in class_names] if len(class_names) == n else [str(i) for i in range(n)]
    rows = counts.sum(dim=1, keepdim=True)
    rate = counts.double() / rows.clamp(min=1)
    font = _font()
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    cell = max(26, _text_width(probe, str(int(counts.max())), font) + 6)
    label_w = max(_text_width(probe, s, font) for s in names) + 8
    title_h, acc_w = FONT_SIZE + 10, 44
    top, left = title_h + label_w, label_w  # predicted-class labels are written vertically above the grid
    width, height = left + n * cell + acc_w, top + n * cell + FONT_SIZE + 10
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    total = int(counts.sum())
    draw.text((4, 3), f"rows: true class, columns: predicted ({total} images)", "black", font)

    # Column labels: drawn horizontally on a strip, turned 90° anticlockwise, pasted above the grid.
    strip = Image.new("RGB", (label_w, n * cell), "white")
    for j, name in enumerate(names):
        y = j * cell + (cell - FONT_SIZE) // 2 - 1
        ImageDraw.Draw(strip).text((4, y), name, "black", font)
    canvas.paste(strip.rotate(90, expand=True), (left, title_h))

    for i, name in enumerate(names):
        y0 = top + i * cell
        draw.text(
            (left - 4 - _text_width(draw, name, font), y0 + (cell - FONT_SIZE) // 2 - 1), name, "black", font
        )
        for j in range(n):
            r = float(rate[i, j])
            colour = tuple(int(255 - r * (255 - c)) for c in (8, 48, 107))  # white → dark blue
            x0 = left + j * cell
            draw.rectangle((x0, y0, x0 + cell - 1, y0 + cell - 1), fill=colour, outline=(220, 220, 220))
            text = str(int(counts[i, j]))
            ink = "white" if r > 0.5 else "black"
            tx = x0 + (cell - _text_width(draw, text, font)) // 2
            draw.text((tx, y0 + (cell - FONT_SIZE) // 2 - 1), text, ink, font)
        acc = float(rate[i, i]) if int(rows[i]) else float("nan")
        draw.text((left + n * cell + 4, y0 + (cell - FONT_SIZE) // 2 - 1), f"{acc:.2f}", "black", font)
    draw.text((left + n * cell + 4, top - FONT_SIZE - 4), "acc", "black", font)
    return _to_tensor(canvas)
