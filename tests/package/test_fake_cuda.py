"""Nothing waits on the GPU: every public op, loss, layer and a model forward on fake CUDA.

Under ``FakeTensorMode`` a CUDA tensor has a device, shape and dtype but no data (no GPU is
needed): any read of its values on the host (``.item()``, ``float(t)``, ``bool(t)``, a
data-dependent Python branch) raises ``DataDependentOutputException``, which is what such a
read would cost on a real GPU, a synchronisation. (Backward passes are not run here: the
autograd engine asks the driver for a CUDA context; ``test_compile_fullgraph.py`` traces them.) With value checks on (the default), value
checks of CUDA tensors run as device-side asserts, never as host reads; choosing an
implementation for a fake tensor touches neither triton nor the CUDA driver.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import visionblocks
from visionblocks._core import dispatch
from visionblocks._core.dispatch import asserts_on_device, has_values, reads_values, use_triton
from visionblocks.losses._reduce import check_normalizer, check_target_range

from .public_api_cases import (
    CASES,
    MODEL_TRANSFORMS,
    NOT_TENSOR_OPS,
    OPTION_CASES,
    missing_cases,
)

CUDA = torch.device("cuda")
# Not ``is_available``: FakeTensorMode itself asks it (``avoid_device_init``).
DRIVER_CALLS = (
    "init",
    "_lazy_init",
    "device_count",
    "current_device",
    "get_device_capability",
    "get_device_properties",
    "get_device_name",
    "synchronize",
)


@contextmanager
def no_driver():
    """Fail on any call into the CUDA driver, or on asking whether triton imports."""
    with pytest.MonkeyPatch.context() as mp:
        for name in DRIVER_CALLS:

            def refuse(*args, _name=name, **kwargs):
                raise AssertionError(f"torch.cuda.{_name} was called")

            mp.setattr(torch.cuda, name, refuse)

        def no_triton():
            raise AssertionError("triton availability was probed")

        mp.setattr(dispatch, "_triton_missing", no_triton)
        yield


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [t for o in out for t in _tensors(o)]
    return []


def test_every_public_name_has_a_case():
    assert missing_cases() == []
    assert not set(CASES) & set(NOT_TENSOR_OPS)


@pytest.mark.parametrize("name", sorted(MODEL_TRANSFORMS))
def test_transformed_model_runs_on_fake_cuda(name):
    module, (x,) = CASES[name](torch.device("cpu"))
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    stores = [s for m in module.modules() for s in (m._parameters, m._buffers)]
    fakes = [
        {k: mode.from_tensor(v.detach()) for k, v in s.items() if v is not None} for s in stores
    ]
    x = mode.from_tensor(x)
    with mode:
        for i, (store, fake) in enumerate(zip(stores, fakes, strict=True)):  # real -> fake CUDA
            for key, value in fake.items():
                value = value.to(CUDA)
                store[key] = nn.Parameter(value, False) if i % 2 == 0 else value
        x = x.to(CUDA)
        with no_driver():
            out = module(x)
    assert out.device.type == "cuda"


@pytest.mark.parametrize("name", sorted(set(CASES) - MODEL_TRANSFORMS) + sorted(OPTION_CASES))
def test_runs_on_fake_cuda_without_host_reads(name):
    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        with CUDA:  # modules built on the device: fake tensors cannot be moved in place
            fn, inputs = {**CASES, **OPTION_CASES}[name](CUDA)
        with no_driver():
            out = fn(*inputs)
    outputs = _tensors(out)
    assert outputs and all(t.device.type == "cuda" for t in outputs)


# --------------------------------------------------------------------------- models
DETECTOR = {
    "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3], "widths": [8, 16, 32, 64]},
    "neck": {"type": "fpn", "out_channels": 16},
    "head": {"type": "fcos", "num_classes": 2, "num_convs": 1},
}
SEGMENTER = {
    "backbone": {"type": "vb_tiny", "widths": [8, 16, 32, 64]},
    "neck": {"type": "fpn", "out_channels": 16},
    "head": {"type": "fpn_seg", "num_classes": 3},
}


def _detection_targets():
    boxes = torch.tensor([[6.0, 8.0, 34.0, 30.0], [40.0, 36.0, 60.0, 60.0]], device=CUDA)
    return [{"boxes": boxes, "labels": torch.tensor([0, 1], device=CUDA)}]


@pytest.mark.parametrize("backbone", ["vb_tiny", "resnet18"])
def test_backbone_forward_on_fake_cuda(backbone):
    from visionblocks.registry import build_backbone

    with FakeTensorMode(allow_non_fake_inputs=False):
        with CUDA:
            model = build_backbone(backbone)
        images = torch.rand(2, 3, 64, 48, device=CUDA)
        with no_driver():
            features = model(images)
    assert all(f.device.type == "cuda" for f in _tensors(features))


@pytest.mark.parametrize(
    ("head", "names"),
    [
        (DETECTOR["head"], {"loss_centerness"}),
        ({"type": "yolov8", "num_classes": 2}, {"loss_dfl"}),
        ({"type": "yolov8", "num_classes": 2, "depthwise_cls": True}, {"loss_dfl"}),
    ],
    ids=["fcos", "yolov8", "yolo11_cls"],
)
def test_detector_training_forward_on_fake_cuda(head, names):
    from visionblocks.models import build_detector

    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        with CUDA:
            model = build_detector({**DETECTOR, "head": head})
        images = torch.randint(0, 255, (1, 3, 64, 64), dtype=torch.uint8, device=CUDA)
        with no_driver():
            losses = model(images, _detection_targets())
    assert set(losses) >= {"loss", "loss_cls", "loss_box", *names}


def test_segmenter_forward_on_fake_cuda():
    from visionblocks.models import build_segmenter

    with visionblocks.value_checks(True), FakeTensorMode(allow_non_fake_inputs=False):
        with CUDA:
            model = build_segmenter(SEGMENTER)
        images = torch.rand(2, 3, 32, 32, device=CUDA)
        labels = torch.randint(0, 3, (2, 32, 32), device=CUDA)
        with no_driver():
            losses = model(images, labels)
            logits = model.eval()(images)
    assert losses["loss"].shape == ()
    assert _tensors(logits)[0].shape[-2:] == (32, 32)


# ------------------------------------------------------------------- the mechanism
def test_value_checks_read_cpu_tensors_and_assert_on_cuda(monkeypatch):
    asserted = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: asserted.append(msg))
    with visionblocks.value_checks(True):
        cpu = torch.zeros(2)
        assert reads_values(cpu) and not asserts_on_device(cpu)
        assert not reads_values(torch.zeros(2, device="meta"))
        with FakeTensorMode(allow_non_fake_inputs=False):
            fake_cpu, fake_cuda = torch.zeros(2), torch.zeros(2, device=CUDA)
            assert not has_values(fake_cpu) and not reads_values(fake_cpu)
            assert not reads_values(fake_cuda) and asserts_on_device(fake_cuda)
            assert not asserts_on_device(fake_cpu)
            with no_driver():
                check_target_range("targets", fake_cuda, 0, 1, ignore=-1)
                check_normalizer(torch.ones((), device=CUDA), torch.device("cuda", 0))
        assert asserted == [
            "targets must be in [0, 1] (or equal ignore_index=-1)",
            "normalizer must be a positive finite number",
        ]
    with visionblocks.value_checks(False), FakeTensorMode(allow_non_fake_inputs=False):
        assert not asserts_on_device(torch.zeros(2, device=CUDA))


def test_cpu_value_checks_keep_their_clear_errors():
    with visionblocks.value_checks(True):
        with pytest.raises(ValueError, match=r"got values in \[0.0, 2.0\]"):
            check_target_range("targets", torch.tensor([0.0, 2.0]), 0, 1)
        with pytest.raises(ValueError, match="got a tensor holding 0.0"):
            check_normalizer(torch.tensor(0.0))


def test_compiling_reads_nothing():
    seen = []

    @torch.compile(fullgraph=True, backend="eager")
    def f(x):
        seen.append((reads_values(x), asserts_on_device(x)))
        return x + 1

    f(torch.zeros(2))
    assert seen == [(False, False)]


def test_dispatch_for_fake_tensors_touches_no_driver():
    with FakeTensorMode(allow_non_fake_inputs=False):
        x = torch.zeros(3, device=CUDA)
        with no_driver():
            assert not use_triton("fake_op", "auto", x)
            with visionblocks.use_impl("triton"), pytest.raises(RuntimeError, match="fake"):
                use_triton("fake_op", "auto", x)
            with pytest.raises(RuntimeError, match="fake tensors"):
                use_triton("fake_op", "triton", x)
