"""Threaded CPU paths under torch's recorders (`visionblocks.ops._parallel.parallel_for`).

``torch.jit.trace`` and ``torch.export`` record only the calling thread's ops: parts run in
pool threads would be missing from the graph, which would then compute something else
(measured before the fix: local attention exported with a max error of 1.96). While torch
records, every part runs in the calling thread."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from visionblocks.ops.boxes import generalized_box_iou
from visionblocks.ops.local import local_filter2d
from visionblocks.ops.local_attention import local_attention2d

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


class _Attention(nn.Module):
    def forward(self, q, k, v):
        return local_attention2d(q, k, v, 5, num_heads=2, impl="torch")


class _Filter(nn.Module):
    def forward(self, x, kernels):
        return local_filter2d(x, kernels, 3, impl="torch")


class _GIoU(nn.Module):
    def forward(self, a, b):
        return generalized_box_iou(a, b)


def _boxes(n, seed):
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=gen) * 100
    return torch.cat([xy, xy + torch.rand(n, 2, generator=gen) * 50 + 1], dim=1)


def _cases():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 96, 80, generator=gen) for _ in range(3))
    x = torch.randn(2, 8, 96, 80, generator=gen)
    kernels = torch.randn(2, 9, 96, 80, generator=gen)
    return [
        (_Attention(), (q, k, v)),
        (_Filter(), (x, kernels)),
        (_GIoU(), (_boxes(3000, 1), _boxes(2000, 2))),
    ]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # parts would go to a pool thread
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("index", range(3), ids=["local_attention2d", "local_filter", "giou"])
def test_export_and_trace_record_every_part(two_threads, index):
    module, args = _cases()[index]
    expected = module(*args)
    program = torch.export.export(module, args, strict=False)
    torch.testing.assert_close(program.module()(*args), expected, rtol=1e-5, atol=1e-5)
    traced = torch.jit.trace(module, args, check_trace=False)
    torch.testing.assert_close(traced(*args), expected, rtol=1e-5, atol=1e-5)
