"""Unfold-based local ops without the unfolded tensor: check, time and use them.

1. `local_filter2d` and `local_attention2d` give what the plain ``F.unfold`` implementation
   gives (the unfold view is `sliding_windows`), with and without the Triton kernels where
   they can run.
2. Their time and peak memory against the unfold implementation on a feature map.
3. `Involution2d` and `LocalAttention2d` as layers of a small network, one training step.
It prints its results and writes no files.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING

from _args import example_parser, positive_int

if TYPE_CHECKING:
    import torch

QUICK = os.environ.get("VISIONBLOCKS_QUICK") == "1"

EPILOG = """\
environment:
  VISIONBLOCKS_QUICK=1  small sizes (1 x 16 x 32 x 32 instead of 2 x 64 x 128 x 128): a
                        smoke test, what tests/docs/test_examples.py runs

outputs:
  none: the results are printed
"""


def parse_args() -> argparse.Namespace:
    parser = example_parser(__doc__, EPILOG)
    parser.add_argument(
        "--repeats",
        metavar="N",
        type=positive_int,
        default=3,
        help="timed calls per implementation in part 2 (the best one is shown)",
    )
    return parser.parse_args()


def unfold_filter(x: torch.Tensor, kernels: torch.Tensor, k: int) -> torch.Tensor:
    """The textbook implementation: materialise every k x k window (k*k times the input)."""
    import torch.nn.functional as F

    b, c, h, w = x.shape
    g = kernels.shape[1] // (k * k)
    windows = F.unfold(x, k, padding=k // 2).view(b, g, c // g, k * k, h, w)
    return (windows * kernels.view(b, g, 1, k * k, h, w)).sum(3).view(b, c, h, w)


def unfold_attention(q, k, v, size: int, heads: int) -> torch.Tensor:
    """The same with attention: every window's keys and values materialised."""
    import torch

    from visionblocks.ops.local import sliding_windows

    b, c, h, w = q.shape
    d = c // heads
    keys = sliding_windows(k, size).view(b, heads, d, size * size, h, w)
    values = sliding_windows(v, size).view(b, heads, d, size * size, h, w)
    inside = sliding_windows(torch.ones(1, 1, h, w), size).view(1, 1, size * size, h, w) > 0
    logits = (q.view(b, heads, d, 1, h, w) * keys).sum(2) / d**0.5
    weights = logits.masked_fill(~inside, float("-inf")).softmax(2)
    return (weights.unsqueeze(2) * values).sum(3).view(b, c, h, w)


def measure(fn, *args, repeats: int = 3) -> float:
    """The best of ``repeats`` timed calls, in seconds, after one warm-up call."""
    fn(*args)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    args = parse_args()  # before the imports below, which take seconds: --help answers at once
    import torch
    import torch.nn.functional as F
    from torch import nn

    from visionblocks.nn import ConvNormAct, Involution2d, LocalAttention2d
    from visionblocks.ops.local import local_filter2d
    from visionblocks.ops.local_attention import local_attention2d

    torch.manual_seed(0)
    b, c, size, k, groups = (1, 16, 32, 7, 4) if QUICK else (2, 64, 128, 7, 16)
    x = torch.randn(b, c, size, size)
    kernels = torch.randn(b, groups * k * k, size, size)
    q, key, v = (torch.randn(b, c, size, size) for _ in range(3))

    print("== 1. the same numbers as the unfold implementation")
    diff = (local_filter2d(x, kernels, k) - unfold_filter(x, kernels, k)).abs().max().item()
    print(f"local_filter2d     max |difference| {diff:.2e}")
    heads = 8 if c >= 8 else 1
    diff = (
        (local_attention2d(q, key, v, k, num_heads=heads) - unfold_attention(q, key, v, k, heads))
        .abs()
        .max()
    )
    print(
        f"local_attention2d  max |difference| {diff.item():.2e}  (positions outside the image masked)"
    )

    print(f"\n== 2. time against unfold (B={b}, C={c}, {size}x{size}, k={k}, forward)")
    for name, ours, theirs, inputs in (
        ("local_filter2d", lambda *a: local_filter2d(*a, k), lambda *a: unfold_filter(*a, k),
         (x, kernels)),
        ("local_attention2d", lambda *a: local_attention2d(*a, k, num_heads=heads),
         lambda *a: unfold_attention(*a, k, heads), (q, key, v)),
    ):  # fmt: skip
        with torch.no_grad():
            t_ours = measure(ours, *inputs, repeats=args.repeats)
            t_theirs = measure(theirs, *inputs, repeats=args.repeats)
        print(f"{name:18s} ours {1000 * t_ours:7.1f} ms   unfold {1000 * t_theirs:7.1f} ms   "
              f"speed-up {t_theirs / t_ours:5.1f}x")  # fmt: skip
    unfolded = b * c * k * k * size * size * 4 / 2**20
    print(
        f"(the unfold path builds a {unfolded:.0f} MiB tensor; `visionblocks bench 'local*'` "
        "measures peak memory)"
    )

    print("\n== 3. as layers: a small network, one training step")
    net = nn.Sequential(
        ConvNormAct(3, 32, 3, stride=2),
        Involution2d(32, kernel_size=7, groups=4),
        ConvNormAct(32, 32, 3, stride=2),
        LocalAttention2d(32, kernel_size=5, num_heads=4),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    images, labels = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = F.cross_entropy(net(images), labels)
    loss.backward()
    optimizer.step()
    print(
        f"parameters {sum(p.numel() for p in net.parameters()):,}, loss {loss.item():.3f}, "
        f"every parameter got a gradient: {all(p.grad is not None for p in net.parameters())}"
    )


if __name__ == "__main__":
    main()
