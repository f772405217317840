"""torchvision's Mask R-CNN with visionblocks' `MultiScaleRoIAlign` and `paste_masks` swapped in
gives torchvision's outputs and losses (`benchmarks.cases.maskrcnn`).

The client is torchvision itself (``torchvision/models/detection/roi_heads.py``:
``RoIHeads``, ``paste_masks_in_image``; ``transform.py``: ``GeneralizedRCNNTransform.
postprocess``), the model its ``maskrcnn_resnet50_fpn`` with random weights (nothing
downloaded) at a small size. Measured: boxes, labels, scores and all five training losses
equal to the bit; pasted masks within 5e-6 (float32 rounding of the interpolation weights;
the random model's mask probabilities sit near 0.5, so a 0.5 threshold can flip a pixel).
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.cases import maskrcnn
from benchmarks.harness import get_case


@pytest.fixture(scope="module")
def eval_state():
    return get_case("workload_maskrcnn_eval").setup()


@pytest.mark.slow
def test_eval_outputs_equal_torchvision(eval_state):
    from visionblocks.ops import MultiScaleRoIAlign

    heads = eval_state["ours"].roi_heads
    assert isinstance(heads.box_roi_pool, MultiScaleRoIAlign)
    assert isinstance(heads.mask_roi_pool, MultiScaleRoIAlign)
    calls: dict[str, int] = {}
    ours = maskrcnn.eval_ours(eval_state, calls)
    peer = maskrcnn.eval_peer(eval_state)
    assert calls == {"paste_masks": 2}  # one call per image
    assert all(len(d["boxes"]) > 0 for d in peer)  # the random model detects something
    for a, b in zip(ours, peer, strict=True):  # values to rounding: check_detections
        assert torch.equal(a["labels"], b["labels"])
        assert a["masks"].shape == b["masks"].shape and a["masks"].dtype == b["masks"].dtype
    maskrcnn.check_detections({"detections": ours, "calls": calls}, {"detections": peer})


def test_the_swap_pastes_with_ours_and_is_undone():
    import torchvision.models.detection.roi_heads as roi_heads
    import torchvision.models.detection.transform as transform

    masks = torch.rand(3, 1, 14, 14, generator=torch.Generator().manual_seed(0))
    boxes = torch.tensor([[2.0, 3.0, 20.0, 15.0], [0.0, 0.0, 31.0, 23.0], [10.0, 4.0, 12.0, 9.0]])
    ref = roi_heads.paste_masks_in_image(masks, boxes, (24, 32))
    calls: dict[str, int] = {}
    with maskrcnn.visionblocks_in_maskrcnn(calls):
        got = transform.paste_masks_in_image(masks, boxes, (24, 32))
        assert roi_heads.paste_masks_in_image is transform.paste_masks_in_image
    assert calls == {"paste_masks": 1} and got.shape == ref.shape == (3, 1, 24, 32)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)  # the same masks: rounding only
    before = transform.paste_masks_in_image
    with pytest.raises(RuntimeError, match="inside"), maskrcnn.visionblocks_in_maskrcnn():
        assert transform.paste_masks_in_image is not before
        raise RuntimeError("inside")
    assert transform.paste_masks_in_image is before


@pytest.mark.slow
def test_training_losses_and_step_equal_torchvision():
    state = get_case("workload_maskrcnn_train_step").setup()
    ours, peer = (
        maskrcnn.train_losses(state["pooled"], state),
        maskrcnn.train_losses(state["model"], state),
    )
    assert set(peer) == {
        "loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg",
    }  # fmt: skip
    maskrcnn.check_losses(ours, peer)  # to rounding: our RoI Align may add in another order
    # One step each: the same losses, then gradients through our pools as through torchvision's.
    step_ours = maskrcnn.train_step(*state["ours"], state)
    step_peer = maskrcnn.train_step(*state["peer"], state)
    maskrcnn.check_losses(step_ours, step_peer)
    for (name, a), b in zip(
        state["ours"][0].named_parameters(), state["peer"][0].parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
