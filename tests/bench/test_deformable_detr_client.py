"""transformers' Deformable DETR with `visionblocks.ops.ms_deform_attn` as its attention core
gives transformers' outputs and gradients.

The client is transformers itself: ``DeformableDetrModel`` built from a
``DeformableDetrConfig`` with a small ResNet backbone config (random weights, nothing
downloaded: `benchmarks.cases.deformable_detr.deformable_detr_config`), whose
``MultiScaleDeformableAttention.forward`` (``modeling_deformable_detr.py``) runs mmcv's
``grid_sample`` formula; `benchmarks.cases.deformable_detr.visionblocks_in_transformers`
puts our op there. Float32: outputs and every parameter's gradient within 1e-5 (of the
largest element, for the gradients).
"""

from __future__ import annotations

import pytest
import torch

import visionblocks.ops

pytest.importorskip("transformers")

from benchmarks.cases.deformable_detr import (
    deformable_detr_config,
    visionblocks_in_transformers,
)
from benchmarks.harness import get_case
from benchmarks.harness.check import verify_outputs
from benchmarks.harness.timing import num_threads


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with num_threads(1):
        yield


def _model(**options):
    from transformers import DeformableDetrModel

    torch.manual_seed(0)
    config = deformable_detr_config(d_model=64, layers=2, queries=20, heads=4, **options)
    return DeformableDetrModel(config).train()


def _step(model, pixels, swap, counts=None):
    model.zero_grad(set_to_none=True)
    if swap:
        with visionblocks_in_transformers():
            out = model(pixel_values=pixels)
    else:
        out = model(pixel_values=pixels)
    loss = out.last_hidden_state.square().mean() + out.encoder_last_hidden_state.square().mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_outputs_equal_transformers_and_gradients_as_accurate(monkeypatch):
    """Outputs within 1e-5. Gradients: the model's are sensitive (sampling locations' gradients
    jump at pixel edges, and several parameters' true gradients are near zero), so each side
    is compared with transformers' own float64 run: ours is as close as transformers' float32
    (measured: 4.5e-7 and 4.7e-7 of the gradient's norm)."""
    model = _model()
    pixels = torch.rand(2, 3, 96, 128, generator=torch.Generator().manual_seed(1))
    calls = []
    op = visionblocks.ops.ms_deform_attn
    monkeypatch.setattr(visionblocks.ops, "ms_deform_attn", lambda *a: calls.append(1) or op(*a))
    ours, our_grads = _step(model, pixels, swap=True)
    theirs, their_grads = _step(model, pixels, swap=False)
    assert len(calls) == 2 + 2  # encoder self-attention, decoder cross-attention
    assert ours.keys() == theirs.keys() and "encoder_last_hidden_state" in theirs
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(ours[key], value, rtol=0, atol=1e-5, msg=key)
    _, exact = _step(_model().double(), pixels.double(), swap=False)
    assert our_grads.keys() == their_grads.keys() == exact.keys() and len(exact) > 50

    def error(grads):
        diff = torch.cat([(grads[n].double() - g).flatten() for n, g in exact.items()])
        return float(diff.norm() / torch.cat([g.flatten() for g in exact.values()]).norm())

    assert error(our_grads) <= 1.5 * error(their_grads) and error(their_grads) < 1e-5


def test_swap_is_undone_on_error():
    from transformers.models.deformable_detr import modeling_deformable_detr as detr

    before = detr.MultiScaleDeformableAttention.forward
    with pytest.raises(RuntimeError, match="inside"), visionblocks_in_transformers():
        assert detr.MultiScaleDeformableAttention.forward is not before
        raise RuntimeError("inside")
    assert detr.MultiScaleDeformableAttention.forward is before


def test_benchmark_case_checks_its_outputs():
    verify_outputs(get_case("workload_deformable_detr_fwd_bwd"))
