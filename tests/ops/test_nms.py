"""`nms` and `batched_nms`: torchvision's results, our checks, compile and fake CUDA."""

from __future__ import annotations

import pytest
import torch
import torchvision.ops as tvo
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from visionblocks.ops import batched_nms, nms

# torchvision 0.29's own fake kernel of nms calls a deprecated ShapeEnv method.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`create_unbacked_symint` is deprecated:FutureWarning"
)


def clustered(n: int, seed: int, dtype: torch.dtype = torch.float32):
    """``n`` boxes around a few objects (many overlaps), scores with ties, classes."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(max(n // 20, 1), 2, generator=g, dtype=torch.float64) * 200
    which = torch.randint(0, len(centres), (n,), generator=g)
    c = centres[which] + torch.randn(n, 2, generator=g, dtype=torch.float64) * 4
    wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 30 + 10
    boxes = torch.cat((c - wh / 2, c + wh / 2), 1).to(dtype)
    scores = (torch.rand(n, generator=g, dtype=torch.float64) * 20).round().div(20).to(dtype)
    return boxes, scores, torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 0.7, 1.0])
def test_equals_torchvision(dtype, threshold):
    for seed, n in enumerate((0, 1, 7, 200, 1500)):
        boxes, scores, idxs = clustered(n, seed, dtype)
        assert torch.equal(nms(boxes, scores, threshold), tvo.nms(boxes, scores, threshold))
        want = tvo.batched_nms(boxes, scores, idxs, threshold)
        assert torch.equal(batched_nms(boxes, scores, idxs, threshold), want)


def test_integer_and_half_inputs_compute_in_float32():
    boxes, scores, idxs = clustered(300, 3)
    ints = boxes.round().to(torch.int32)
    want = tvo.nms(ints.float(), scores, 0.5)
    assert torch.equal(nms(ints, scores, 0.5), want)
    assert torch.equal(
        nms(ints, scores.half(), 0.5), tvo.nms(ints.float(), scores.half().float(), 0.5)
    )
    half = boxes.half()
    assert torch.equal(
        batched_nms(half, scores.bfloat16(), idxs, 0.5),
        tvo.batched_nms(half.float(), scores.bfloat16().float(), idxs, 0.5),
    )
    assert nms(boxes, scores.double(), 0.5).dtype == torch.int64  # mixed: promoted, no error


def test_gradients_are_not_needed():
    boxes, scores, _ = clustered(50, 4)
    keep = nms(boxes.requires_grad_(), scores.requires_grad_(), 0.5)
    assert torch.equal(keep, tvo.nms(boxes.detach(), scores.detach(), 0.5))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: nms([[0, 0, 1, 1]], torch.ones(1), 0.5), TypeError, "boxes must be a torch.Tensor"),
        (lambda: nms(torch.zeros(2, 4, dtype=torch.bool), torch.ones(2), 0.5), TypeError, "boxes must be a real tensor"),
        (lambda: nms(torch.zeros(2, 5), torch.ones(2), 0.5), ValueError, r"boxes must have shape \(N, 4\).*got \(2, 5\)"),
        (lambda: nms(torch.zeros(1, 2, 4), torch.ones(2), 0.5), ValueError, r"boxes must have shape \(N, 4\)"),
        (lambda: nms(torch.zeros(2, 4), torch.ones(3), 0.5), ValueError, r"scores must have shape \(N,\) = \(2,\) like boxes, got \(3,\)"),
        (lambda: nms(torch.zeros(2, 4), torch.ones(2, dtype=torch.long), 0.5), TypeError, "scores must be a floating-point tensor, got dtype torch.int64"),
        (lambda: nms(torch.zeros(2, 4), torch.ones(2, device="meta"), 0.5), ValueError, "boxes and scores must be on the same device"),
        (lambda: nms(torch.zeros(2, 4), torch.ones(2), 1.5), ValueError, r"iou_threshold must be a number in \[0, 1\], got 1.5"),
        (lambda: nms(torch.zeros(2, 4), torch.ones(2), float("nan")), ValueError, "iou_threshold must be a number"),
        (lambda: nms(torch.zeros(2, 4), torch.ones(2), "0.5"), TypeError, "iou_threshold must be a float, got str"),
        (lambda: batched_nms(torch.zeros(2, 4), torch.ones(2), None, 0.5), TypeError, "idxs must be a torch.Tensor"),
        (lambda: batched_nms(torch.zeros(2, 4), torch.ones(2), torch.zeros(2), 0.5), TypeError, "idxs must be an integer tensor, got dtype torch.float32"),
        (lambda: batched_nms(torch.zeros(2, 4), torch.ones(2), torch.zeros(3, dtype=torch.long), 0.5), ValueError, r"idxs must have shape \(N,\)"),
    ],
)  # fmt: skip
def test_bad_inputs_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.slow
def test_compiles_as_one_node():
    boxes, scores, idxs = clustered(120, 5)

    def run(b, s, i):
        return nms(b, s, 0.4), batched_nms(b, s, i, 0.4)

    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        got = torch.compile(run, fullgraph=True, backend="aot_eager")(boxes, scores, idxs)
    assert all(torch.equal(g, w) for g, w in zip(got, run(boxes, scores, idxs), strict=True))


def test_fake_cuda_tensors_read_no_values():
    from tests.package.test_fake_cuda import no_driver

    cuda = torch.device("cuda")
    shape_env = ShapeEnv(allow_dynamic_output_shape_ops=True)
    with FakeTensorMode(allow_non_fake_inputs=False, shape_env=shape_env):
        boxes, scores = torch.rand(7, 4, device=cuda), torch.rand(7, device=cuda)
        idxs = torch.zeros(7, dtype=torch.long, device=cuda)
        with no_driver():
            keep = nms(boxes, scores, 0.5)
            kept = batched_nms(boxes.half(), scores, idxs, 0.5)
    assert keep.device.type == "cuda" and keep.dtype == torch.int64
    assert isinstance(keep.shape[0], torch.SymInt) and isinstance(kept.shape[0], torch.SymInt)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_cuda_matches_cpu():
    boxes, scores, idxs = clustered(3000, 6)
    got = batched_nms(boxes.cuda(), scores.cuda(), idxs.cuda(), 0.5).cpu()
    assert torch.equal(got, batched_nms(boxes, scores, idxs, 0.5))


def test_exported_nms_keeps_zero_one_and_two_boxes():
    # torchvision's fake nms assumes >= 2 kept boxes: an exported program asserted it at run time
    class Keep(torch.nn.Module):
        def forward(self, boxes, scores, idxs):
            return nms(boxes, scores, 0.5), batched_nms(boxes, scores, idxs, 0.5)

    n = torch.export.Dim("n", min=0, max=100)
    example = (torch.tensor([[0.0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]]),
               torch.tensor([0.9, 0.8, 0.7]), torch.tensor([0, 1, 0]))  # fmt: skip
    program = torch.export.export(Keep(), example, dynamic_shapes=({0: n}, {0: n}, {0: n}))
    overlapping = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11]])
    for boxes in (example[0], example[0][:1], overlapping):
        count = boxes.shape[0]
        inputs = (boxes, torch.linspace(0.9, 0.1, count), torch.zeros(count, dtype=torch.long))
        for got, want in zip(program.module()(*inputs), Keep()(*inputs), strict=True):
            assert torch.equal(got, want)
