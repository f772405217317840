"""ultralytics' YOLOv8n training loss with visionblocks' blocks swapped in gives ultralytics' loss.

The client is ultralytics itself (``ultralytics/utils/loss.py``: ``v8DetectionLoss``,
``BboxLoss``, ``DFLoss``; ``ultralytics/utils/tal.py``: ``TaskAlignedAssigner``,
``make_anchors``, ``dist2bbox``, ``bbox2dist``; ``ultralytics/utils/metrics.py``: ``bbox_iou``),
the model its ``DetectionModel`` from the bundled ``yolov8n.yaml`` (random weights, nothing
downloaded). `benchmarks.cases.yolov8.visionblocks_in_ultralytics` puts our
``task_aligned_assign``, ``distribution_focal_loss``, ``complete_box_iou``,
``make_anchor_points`` and distance coders where that loss looks them up.

Float32, the same head outputs: the three loss terms are equal (to the bit, measured) and
the gradients of the head outputs within 1e-6 of their largest element (measured: about 1e-7:
our CIoU adds ``eps`` only to zero denominators, ultralytics' to every height, union and
diagonal; our DFL interpolates with ``lerp``). Through the whole model (its BatchNorm
backward), the parameter gradients of the two sides differ by about 1e-6 of their norm, which
is float32 rounding: against ultralytics' own loss on a float64 copy of the model, ours is as
close as ultralytics' float32 run, within a percent (measured relative errors: ours 1.4675e-5,
ultralytics 1.4666e-5 with 80 classes; 1.1784e-5 and 1.1836e-5 with 3).
"""

from __future__ import annotations

import copy

import pytest
import torch

import visionblocks.ops
from visionblocks.ops import task_aligned_assign

pytest.importorskip("ultralytics")

from benchmarks.cases import yolov8
from benchmarks.cases.yolov8 import ULTRALYTICS_LOOKUPS, visionblocks_in_ultralytics
from benchmarks.harness import get_case
from benchmarks.harness.timing import num_threads

SIZE = 128
DUPLICATE, SAME_BOX_OTHER_CLASS = 7, 9
"""In the crowded image, object 7 repeats object 6 (same box, same class: every metric tied)
and object 9 repeats object 8's box with another class; both boxes are large (they win
anchors from the others: the untrained model predicts large boxes)."""


def _batch(nc: int) -> dict:
    """4 images of 128x128: none, 70 objects (with exact duplicates), tiny boxes (sides below
    the assigner's minimum of 16 px), a few ordinary ones; ultralytics' layout."""
    g = torch.Generator().manual_seed(nc)

    def objects(n: int, low: float, high: float) -> torch.Tensor:
        wh = low + (high - low) * torch.rand(n, 2, generator=g)
        return torch.cat([wh / 2 + (1 - wh) * torch.rand(n, 2, generator=g), wh], 1)

    crowded = objects(70, 0.05, 0.4)
    crowded[DUPLICATE - 1 : DUPLICATE + 1] = torch.tensor([0.5, 0.45, 0.7, 0.8])
    crowded[SAME_BOX_OTHER_CLASS - 1 : SAME_BOX_OTHER_CLASS + 1] = torch.tensor(
        [0.4, 0.6, 0.6, 0.7]
    )
    boxes = [crowded, objects(5, 4 / SIZE, 10 / SIZE), objects(3, 0.2, 0.6)]
    counts = torch.tensor([0] + [len(b) for b in boxes])
    cls = torch.randint(0, nc, (int(counts.sum()), 1), generator=g).float()
    cls[DUPLICATE] = cls[DUPLICATE - 1]
    cls[SAME_BOX_OTHER_CLASS] = (cls[SAME_BOX_OTHER_CLASS - 1] + 1) % nc
    return {
        "img": torch.rand(4, 3, SIZE, SIZE, generator=g),
        "batch_idx": torch.repeat_interleave(torch.arange(4), counts).float(),
        "cls": cls,
        "bboxes": torch.cat(boxes),
    }


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Values, not speed: one thread (on a shared machine, OpenMP's threads waiting for each
    other make YOLOv8n's backward 50x slower than one thread)."""
    with num_threads(1):
        yield


@pytest.fixture(scope="module", params=[80, 3], ids=["nc80", "nc3"])
def client(request, _one_thread):
    """The model (nc classes), a batch and the head outputs of one forward pass."""
    torch.manual_seed(0)
    model = yolov8.yolov8n(request.param)
    batch = _batch(request.param)
    with torch.no_grad():
        preds = model(batch["img"])
    return model, batch, preds


def _loss(model, preds, batch, swap: bool, calls=None):
    from ultralytics.utils.loss import v8DetectionLoss

    leaves = {
        k: v if k == "feats" else v.detach().clone().requires_grad_() for k, v in preds.items()
    }
    criterion = v8DetectionLoss(model)
    if swap:
        with visionblocks_in_ultralytics(calls):
            loss, items = criterion(leaves, batch)
    else:
        loss, items = criterion(leaves, batch)
    loss.sum().backward()
    return items, {k: leaves[k].grad for k in ("boxes", "scores")}


def test_loss_terms_and_head_gradients_equal_ultralytics(client, monkeypatch):
    from ultralytics.utils import tal

    model, batch, preds = client
    assigned, claims = [], []
    forward = tal.TaskAlignedAssigner.forward
    select = tal.TaskAlignedAssigner.select_highest_overlaps

    def recording(self, *args, **kwargs):
        assigned.append(forward(self, *args, **kwargs))
        return assigned[-1]

    def counting(self, mask_pos, *args):
        claims.append(mask_pos.sum(1).amax(1))  # per image, the most objects of one anchor
        return select(self, mask_pos, *args)

    def ours_recording(*args, **kwargs):
        assigned.append(task_aligned_assign(*args, **kwargs))
        return assigned[-1]

    monkeypatch.setattr(tal.TaskAlignedAssigner, "forward", recording)
    monkeypatch.setattr(tal.TaskAlignedAssigner, "select_highest_overlaps", counting)
    monkeypatch.setattr(visionblocks.ops, "task_aligned_assign", ours_recording)
    calls: dict[str, int] = {}
    ours, ours_grads = _loss(model, preds, batch, True, calls)
    peer, peer_grads = _loss(model, preds, batch, False)

    # The batch has what it should: an image without positives, anchors that several objects
    # claimed (the tie of a repeated object goes to the first), tiny boxes with positives.
    # The same anchors go to the same objects on both sides (for the exact duplicate, the loss
    # alone could not tell).
    (_, _, _, fg, gt_idx), (_, _, _, peer_fg, peer_gt_idx) = assigned
    assert torch.equal(fg, peer_fg) and torch.equal(gt_idx, peer_gt_idx.long())
    assert not fg[0].any() and fg[1:].any(1).all()
    assert claims[0][1] > 1
    owners = gt_idx[1][fg[1]]
    assert (owners == DUPLICATE - 1).any() and not (owners == DUPLICATE).any()
    assert (owners == SAME_BOX_OTHER_CLASS - 1).any() or (owners == SAME_BOX_OTHER_CLASS).any()
    # Every block ran in place of ultralytics' own.
    assert set(calls) == {f"{m}.{n}" for m, n in ULTRALYTICS_LOOKUPS}
    assert all(count >= 1 for count in calls.values())

    assert list(ours) == ["box_loss", "cls_loss", "dfl_loss"] == list(peer)
    for name in ours:
        torch.testing.assert_close(ours[name], peer[name], rtol=1e-6, atol=0.0)
    for name, grad in peer_grads.items():
        scale = grad.abs().max()
        assert scale > 0
        assert (ours_grads[name] - grad).abs().max() <= 1e-6 * scale, name


def test_model_gradients_as_close_to_float64_as_ultralytics(client):
    model, batch, _ = client

    def grads(net, swap: bool, dtype=torch.float32):
        net.zero_grad(set_to_none=True)
        inputs = {**batch, "img": batch["img"].to(dtype)}
        if swap:
            with visionblocks_in_ultralytics():
                loss, _ = net.loss(inputs)
        else:
            loss, _ = net.loss(inputs)
        loss.sum().backward()
        return torch.cat(
            [p.grad.double().flatten() for p in net.parameters() if p.grad is not None]
        )

    model = copy.deepcopy(model)
    model.criterion = None
    ours, peer = grads(model, True), grads(model, False)
    exact = grads(copy.deepcopy(model).double(), False, torch.float64)
    difference = ((ours - peer).norm() / peer.norm()).item()
    ours_error = ((ours - exact).norm() / exact.norm()).item()
    peer_error = ((peer - exact).norm() / exact.norm()).item()
    assert difference < 1e-5  # about 1e-6: float32 rounding through the model's backward
    assert peer_error < 1e-4  # the float64 run is the same computation
    assert ours_error <= 1.01 * peer_error, (ours_error, peer_error)


def test_the_swap_falls_back_and_restores():
    from ultralytics.utils import loss, tal

    before = {name: getattr(loss, name) for name in ("bbox_iou", "make_anchors", "dist2bbox")}
    forward = tal.TaskAlignedAssigner.__dict__["forward"]
    a, b = torch.tensor([[10.0, 10.0, 4.0, 6.0]]), torch.tensor([[11.0, 9.0, 5.0, 5.0]])
    calls: dict[str, int] = {}
    with pytest.raises(RuntimeError, match="boom"), visionblocks_in_ultralytics(calls):
        # Forms the adapters do not cover go to ultralytics' own code, uncounted.
        assert torch.equal(loss.bbox_iou(a, b, CIoU=True), before["bbox_iou"](a, b, CIoU=True))
        assert torch.equal(
            loss.bbox_iou(a, b, xywh=False, GIoU=True),
            before["bbox_iou"](a, b, xywh=False, GIoU=True),
        )
        sizes = torch.tensor([[4, 4], [2, 2]])
        for ours, theirs in zip(
            loss.make_anchors(sizes, [8, 16]), before["make_anchors"](sizes, [8, 16])
        ):
            assert torch.equal(ours, theirs)
        assert calls == {}
        raise RuntimeError("boom")
    assert {name: getattr(loss, name) for name in before} == before
    assert tal.TaskAlignedAssigner.__dict__["forward"] is forward


def test_the_check_fails_when_a_block_was_not_called():
    terms = {"box_loss": torch.tensor(1.0)}
    calls = {f"{m}.{n}": 1 for m, n in ULTRALYTICS_LOOKUPS[1:]}
    with pytest.raises(AssertionError, match="TaskAlignedAssigner.forward"):
        yolov8._check({**terms, "calls": calls}, terms)
    with pytest.raises(AssertionError, match="differ"):
        yolov8._check(
            {
                "box_loss": torch.tensor(1.00001),
                "calls": {**calls, "ultralytics.utils.tal.TaskAlignedAssigner.forward": 1},
            },
            terms,
        )


@pytest.mark.parametrize("name", ["workload_yolov8n_crowded_train_step", "workload_yolov8n_loss"])
def test_the_timed_calls_agree(name):
    """The timed calls themselves (not only the check's): the first training step of the two
    copies, or the loss, gives the same terms on each side, and the loss case's gradients."""
    case = get_case(name)
    state = case.small_setup()
    ours, peer = case.ours(state), case.peer(state)
    calls = {f"{m}.{n}": 1 for m, n in ULTRALYTICS_LOOKUPS}
    yolov8._check({**ours, "calls": calls}, peer)
    assert set(ours) == {"box_loss", "cls_loss", "dfl_loss"} | (
        {"grad"} if "loss" in name[-4:] else set()
    )


def test_a_batch_without_objects(client):
    """No objects at all (the assigner's ``M = 0`` path): the same terms and gradients."""
    model, _, preds = client
    empty = {"batch_idx": torch.zeros(0), "cls": torch.zeros(0, 1), "bboxes": torch.zeros(0, 4)}
    calls: dict[str, int] = {}
    ours, ours_grads = _loss(model, preds, empty, True, calls)
    peer, peer_grads = _loss(model, preds, empty, False)
    assert len(calls) == len(ULTRALYTICS_LOOKUPS)
    assert ours["box_loss"] == ours["dfl_loss"] == 0 and ours["cls_loss"] > 0
    for name in ours:
        torch.testing.assert_close(ours[name], peer[name], rtol=1e-6, atol=0.0)
    for name, grad in peer_grads.items():
        torch.testing.assert_close(ours_grads[name], grad, rtol=0.0, atol=1e-6 * grad.abs().max())
