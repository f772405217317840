"""The figure helpers of ``make_gallery.py``, and its pictures of `visionblocks.ops`.

`save` lays out and writes every picture of the gallery and `compact`s it; `bare` and `rgb`
help draw images. The pictures: warps of a sample with its targets (drawn as
``make_warp_figure.py``, beside this module, draws them), per-pixel filters
(`visionblocks.ops.local_filter2d`) and local attention (`visionblocks.ops.local_attention2d`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from PIL import Image

MAX_BYTES, SEED = 250_000, 0


# Figure helpers ------------------------------------------------------------------------------
def compact(source: Path, target: Path, max_bytes: int = MAX_BYTES) -> Path:
    """Copy a PNG to ``target``, reducing its palette (no dithering) while it is too large."""
    if source.stat().st_size <= max_bytes:
        if source != target:
            shutil.copyfile(source, target)
        return target
    image = Image.open(source).convert("RGB")
    for colours in (256, 192, 128, 96, 64):
        quantized = image.quantize(colours, Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        quantized.save(target, optimize=True)
        if target.stat().st_size <= max_bytes:
            break
    return target


def save(fig: plt.Figure, path: Path) -> Path:
    """Lay out and save a figure at 100 dpi without a software stamp, then `compact` it."""
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return compact(path, path)


def bare(ax: plt.Axes, title: str | None = None, size: float = 10) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=size)


def rgb(image: torch.Tensor) -> np.ndarray:
    """A ``(3, H, W)`` tensor (uint8, or float in [0, 1]) as an ``(H, W, 3)`` array."""
    image = image.as_subclass(torch.Tensor)
    image = image if image.is_floating_point() else image.float() / 255
    return image.clamp(0, 1).permute(1, 2, 0).numpy()


# A warp of a sample with its boxes, masks and key points -------------------------------------
WARPS = {
    "rotate 25°, scale 0.85, shear 12°, shift": {"angle": 25.0, "scale": 0.85,
                                                 "shear": (12.0, 0.0), "translate": (10.0, 4.0)},
    "rotate -90°, scale 0.7": {"angle": -90.0, "scale": 0.7},
    "rotate 10°, scale 1.4: shapes leave the frame": {"angle": 10.0, "scale": 1.4},
}  # fmt: skip


def warp_picture(out: Path) -> None:
    """The sample of ``make_warp_figure.py`` and three warps of it, drawn as it draws them."""
    import make_warp_figure as wf

    from visionblocks.ops import affine_matrix
    from visionblocks.transforms import warp_sample

    image, target = wf.synthetic_sample()
    samples = [("source", image, target)]
    for title, options in WARPS.items():
        matrix = affine_matrix(center=((wf.W - 1) / 2, (wf.H - 1) / 2), **options)
        samples.append((title, *warp_sample(image, target, matrix, (wf.H, wf.W), fill=(235,) * 3)))
    fig, axes = plt.subplots(2, 2, figsize=(9, 7.4))
    for ax, (title, picture, sample) in zip(axes.flat, samples):
        wf.draw(ax, picture, sample, title, sample["boxes"].tolist())  # tight boxes, dashed
        for label in ax.texts:  # a name above a box at the top edge would cover the title
            label.set_clip_on(True)
        for mask in sample["masks"]:
            if mask.any():
                ax.contour(np.arange(wf.W) + 0.5, np.arange(wf.H) + 0.5, mask.numpy(),
                           levels=[0.5], colors="white", linewidths=1)  # fmt: skip
    fig.suptitle("warp_sample: one matrix moves the image, boxes (black), masks (white "
                 "outlines, dashed: their boxes) and key points (x)", fontsize=10)  # fmt: skip
    save(fig, out / "warp.png")


# Per-pixel filters and local attention -------------------------------------------------------
def shapes_image(scratch: Path) -> torch.Tensor:
    """A 160 x 160 synthetic COCO image (three shapes on a checkerboard), float in [0, 1]."""
    from visionblocks.data import make_synthetic_coco

    ann = make_synthetic_coco(scratch / "shapes", num_images=1, image_size=(160, 160), seed=4,
                              num_classes=6, min_objects=3, max_objects=4,
                              object_size=(0.25, 0.4), image_format="png", progress=False)  # fmt: skip
    pixels = np.array(Image.open(ann.parent / "images" / "000001.png").convert("RGB"))
    return torch.from_numpy(pixels).permute(2, 0, 1).float() / 255


def _taps(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column offsets of the ``k * k`` window taps, row-major, as ``(k*k, 1, 1)``."""
    r = torch.arange(k, dtype=torch.float32) - k // 2
    oy, ox = torch.meshgrid(r, r, indexing="ij")
    return oy.reshape(-1, 1, 1), ox.reshape(-1, 1, 1)


def _grid(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.meshgrid(torch.arange(float(h)), torch.arange(float(w)), indexing="ij")


def blur_kernels(h: int, w: int, k: int, zoom: bool) -> torch.Tensor:
    """``(1, k*k, H, W)`` kernels: Gaussians sharp in a middle band and blurrier above and
    below it (tilt-shift), or (``zoom``) lines pointing at the centre, longer farther out."""
    oy, ox = _taps(k)
    ys, xs = _grid(h, w)
    if zoom:
        dy, dx = ys - (h - 1) / 2, xs - (w - 1) / 2
        radius = (dy**2 + dx**2).sqrt().clamp(min=1e-6)
        along, across = (oy * dy + ox * dx) / radius, (oy * dx - ox * dy) / radius
        reach = k // 2 * radius / radius.max() + 0.5
        weights = torch.exp(-(across**2) / 0.7) * (along.abs() <= reach)
    else:
        sigma = 0.05 + k // 2 / 3 * ((ys - (h - 1) / 2).abs() / (h / 2) - 0.2).clamp(min=0) / 0.8
        weights = torch.exp(-(oy**2 + ox**2) / (2 * sigma**2))
    return (weights / weights.sum(0))[None]


def colour_kernels(x: torch.Tensor, k: int, colour: float, space: float) -> torch.Tensor:
    """Bilateral kernels of a ``(1, 3, H, W)`` image: Gaussian in the colour difference (standard
    deviation ``colour``) and in the distance (``space``), zero outside the image."""
    from visionblocks.ops import sliding_windows

    inside = sliding_windows(torch.ones_like(x[:, :1]), k)[:, 0]  # taps inside the image
    oy, ox = _taps(k)
    distance = ((sliding_windows(x, k) - x[:, :, None]) ** 2).sum(1)
    weights = inside * torch.exp(-distance / (2 * colour**2) - (oy**2 + ox**2) / (2 * space**2))
    return weights / weights.sum(1, keepdim=True)


def local_filter_picture(image: torch.Tensor, out: Path) -> None:
    """One image through three kinds of per-pixel kernels, and the kernels at three pixels."""
    from visionblocks.ops import local_filter2d

    x, (h, w) = image[None], image.shape[-2:]
    noisy = x + 0.08 * torch.randn(x.shape, generator=torch.Generator().manual_seed(SEED))
    kernels = {
        "tilt-shift (Gaussian, sigma by row)": (blur_kernels(h, w, 19, zoom=False), 19, x),
        "zoom blur (lines towards the centre)": (blur_kernels(h, w, 19, zoom=True), 19, x),
        "colour-guided smoothing of the noisy image": (colour_kernels(noisy, 9, 0.2, 3.0), 9, noisy),
    }  # fmt: skip
    # Divided by the kernel weight inside the image: no dark frame from the zeros outside.
    panels = [(t, local_filter2d(src, ker, k) / local_filter2d(torch.ones_like(x[:, :1]), ker, k))
              for t, (ker, k, src) in kernels.items()]  # fmt: skip
    panels = [("input", x), *panels[:2], ("input + Gaussian noise (std 0.08)", noisy), panels[2]]
    points = ((20, 25), (80, 75), (115, 100))  # (row, column): corner, centre, by the star
    fig = plt.figure(figsize=(10, 7.4))
    grid = fig.add_gridspec(2, 3)
    for index, (title, picture) in enumerate(panels):
        ax = fig.add_subplot(grid[index // 3, index % 3])
        ax.imshow(rgb(picture[0]))
        bare(ax, title)
    for n, (row, col) in enumerate(points, start=1):
        fig.axes[0].plot(col, row, "o", ms=11, mfc="white", mec="black")
        fig.axes[0].text(col, row, str(n), ha="center", va="center", fontsize=8)
    cells = grid[1, 2].subgridspec(3, 3, wspace=0.08, hspace=0.25)
    for r, (title, (ker, k, _)) in enumerate(kernels.items()):
        for c, (row, col) in enumerate(points):
            ax = fig.add_subplot(cells[r, c])
            ax.imshow(ker[0, :, row, col].view(k, k).numpy(), cmap="magma")
            bare(ax, f"kernel at {c + 1}" if r == 0 else None, size=8)
            ax.set_ylabel(title.split(" ")[0] if c == 0 else "", fontsize=8)
    fig.suptitle("local_filter2d: every pixel filtered with its own kernel", fontsize=11)
    save(fig, out / "local-filter.png")


def attention_weights(image: torch.Tensor, query: tuple[int, int], k: int) -> np.ndarray:
    """The ``k x k`` attention weights of one query pixel (NaN: taps outside the image).

    Queries and keys are ``[f, 1]`` and ``[f, -|f|^2 / 2]`` with ``f`` the pixel's colour and
    position (scaled), so the logits are ``-|f_q - f_k|^2 / 2`` up to a constant per query:
    a pixel attends to nearby pixels of its own colour. One-hot values (one channel per
    pixel of the query's window) make the output the weights themselves.
    """
    from visionblocks.ops import local_attention2d

    (h, w), (row, col), half = image.shape[-2:], query, k // 2
    y0, y1, x0, x1 = max(0, row - half), min(h, row + half + 1), max(0, col - half), min(w, col + half + 1)  # fmt: skip
    f = torch.cat([image * 12.0, torch.stack(_grid(h, w)) / 10.0])[:, y0:y1, x0:x1]
    channels = (y1 - y0) * (x1 - x0)
    q, key = torch.zeros(2, 1, channels, y1 - y0, x1 - x0)
    q[0, : len(f)], q[0, len(f)] = f * channels**0.5, channels**0.5  # undo the 1/sqrt(D)
    key[0, : len(f)], key[0, len(f)] = f, -(f**2).sum(0) / 2
    values = torch.eye(channels).view(1, channels, y1 - y0, x1 - x0)
    weights = local_attention2d(q, key, values, k)[0, :, row - y0, col - x0]
    assert abs(weights.sum().item() - 1) < 1e-4, "attention weights must sum to 1"
    shown = np.full((k, k), np.nan)
    shown[y0 - row + half : y1 - row + half, x0 - col + half : x1 - col + half] = (
        weights.view(y1 - y0, x1 - x0).numpy()
    )  # fmt: skip
    return shown


def local_attention_picture(image: torch.Tensor, out: Path) -> None:
    """Attention weights of three query pixels over their 25 x 25 windows."""
    k, queries = 25, ((100, 84), (72, 56), (154, 152))  # diamond, background, corner
    fig = plt.figure(figsize=(10, 5.2))
    grid = fig.add_gridspec(2, 4, width_ratios=(1.9, 1, 1, 1))
    ax = fig.add_subplot(grid[:, 0])
    ax.imshow(rgb(image))
    bare(ax, f"queries and their {k} x {k} windows")
    ax.set(xlim=(-0.5, image.shape[-1] - 0.5), ylim=(image.shape[-2] - 0.5, -0.5))
    padded = torch.nn.functional.pad(image, (k, k, k, k), value=float("nan"))
    for n, (row, col) in enumerate(queries, start=1):
        ax.add_patch(plt.Rectangle((col - k / 2, row - k / 2), k, k, fill=False, ec="w", lw=1.5))
        ax.plot(col, row, "+", color="white", ms=10, mew=2)
        ax.text(col - k / 2 + 1, row - k / 2 - 1, str(n), color="white", fontsize=10, va="bottom")
        top, bottom = fig.add_subplot(grid[0, n]), fig.add_subplot(grid[1, n])
        crop = padded[:, row + k - k // 2 : row + k + k // 2 + 1, col + k - k // 2 : col + k + k // 2 + 1]  # fmt: skip
        top.imshow(np.nan_to_num(rgb(crop), nan=0.85))
        bare(top, f"window {n}")
        bottom.imshow(attention_weights(image, (row, col), k), cmap="magma").cmap.set_bad("0.85")
        bare(bottom, f"weights of query {n}")
        for a in (top, bottom):
            a.plot(k // 2, k // 2, "+", color="cyan", ms=9, mew=1.5)
    fig.suptitle("local_attention2d: queries and keys from colour and position; grey taps are "
                 "outside the image (masked)", fontsize=10)  # fmt: skip
    save(fig, out / "local-attention.png")
