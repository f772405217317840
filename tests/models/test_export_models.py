"""`Detector`, `Segmenter`, the FPN and the heads under ``torch.export`` and ONNX (dynamo)."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import ClassVar

import pytest
import torch
from torch import nn
from torch.export import Dim
from torch.testing import assert_close

from visionblocks.models import build_detector, build_segmenter
from visionblocks.models.fcos import FCOSHead
from visionblocks.models.fpn import FPN
from visionblocks.models.segmenter import FPNSegHead

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]  # torch.export and ONNX exports of whole models


class ToyBackbone(nn.Module):
    """Three levels at strides 8, 16, 32 (8, 16, 32 channels): plain convolutions."""

    in_channels = 3
    feature_info: ClassVar[list[dict]] = [
        {"name": f"c{i}", "channels": c, "stride": s}
        for i, (c, s) in enumerate([(8, 8), (16, 16), (32, 32)])
    ]

    def __init__(self) -> None:
        super().__init__()
        self.c0 = nn.Conv2d(3, 8, 8, stride=8)
        self.c1 = nn.Conv2d(8, 16, 2, stride=2)
        self.c2 = nn.Conv2d(16, 32, 2, stride=2)

    def forward(self, x):
        a = torch.relu(self.c0(x))
        b = torch.relu(self.c1(a))
        return OrderedDict(c0=a, c1=b, c2=torch.relu(self.c2(b)))


def _detector(backbone=None):
    torch.manual_seed(0)
    return build_detector(
        backbone=backbone or ToyBackbone(),
        neck={"type": "fpn", "out_channels": 16},
        head={"type": "fcos", "num_classes": 3, "num_convs": 1, "max_detections": 20},
    ).eval()


def _segmenter():
    torch.manual_seed(0)
    return build_segmenter(
        backbone=ToyBackbone(),
        neck={"type": "fpn", "out_channels": 16},
        head={"type": "fpn_seg", "num_classes": 4, "channels": 8},
    ).eval()


def _images(*shape, dtype=torch.uint8):
    return torch.randint(0, 255, shape, generator=torch.Generator().manual_seed(1)).to(dtype)


# Batch and image size dynamic: (H, W) multiples of the largest stride (32), at least 64.
DYNAMIC = {
    0: Dim("batch", min=1, max=8),
    2: 32 * Dim("h", min=2, max=32),
    3: 32 * Dim("w", min=2, max=32),
}
SHAPES = [(2, 3, 64, 96), (3, 3, 128, 64)]


def _assert_detections(got, expected):
    assert set(got) == set(expected)
    for key in expected:
        assert got[key].shape == expected[key].shape, key
        assert_close(got[key], expected[key], atol=1e-4, rtol=0.0)


def test_padded_detections_match_the_list():
    model = _detector()
    images = _images(2, 3, 64, 96)
    with torch.no_grad():
        listed, padded = model(images), model(images, padded=True)
    assert padded["boxes"].shape == (2, 20, 4) and padded["num_detections"].shape == (2,)
    for b, det in enumerate(listed):
        n = int(padded["num_detections"][b])
        assert n == len(det["scores"]) > 0
        assert_close(padded["boxes"][b, :n], det["boxes"], atol=1e-5, rtol=0.0)
        assert_close(padded["scores"][b, :n], det["scores"], atol=1e-6, rtol=0.0)
        assert torch.equal(padded["labels"][b, :n], det["labels"])
        assert (padded["labels"][b, n:] == -1).all() and (padded["scores"][b, n:] == 0).all()


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_detector_exports_padded_with_dynamic_shapes(strict):
    model = _detector()
    program = torch.export.export(
        model, (_images(*SHAPES[0]),), {"padded": True}, dynamic_shapes=(DYNAMIC, None),
        strict=strict,
    )  # fmt: skip
    for shape in SHAPES:
        images = _images(*shape)  # the example's dtype: export specialises it
        with torch.no_grad():
            _assert_detections(program.module()(images, padded=True), model(images, padded=True))


def test_detector_exports_the_list_with_static_batch():
    model = _detector()
    dynamic = {2: DYNAMIC[2], 3: DYNAMIC[3]}  # one dict per image: the batch size is fixed
    program = torch.export.export(model, (_images(*SHAPES[0]),), dynamic_shapes=(dynamic,))
    for shape in [(2, 3, 64, 96), (2, 3, 128, 64)]:
        images = _images(*shape)
        with torch.no_grad():
            got, expected = program.module()(images), model(images)
        assert len(got) == len(expected) == 2
        for g, e in zip(got, expected):
            _assert_detections(g, e)


def test_detector_with_a_registered_backbone_exports():
    model = build_detector({
        "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3]},
        "neck": {"type": "fpn", "out_channels": 16},
        "head": {"type": "fcos", "num_classes": 3, "num_convs": 1},
    }).eval()  # fmt: skip
    program = torch.export.export(
        model, (_images(*SHAPES[0]),), {"padded": True}, dynamic_shapes=(DYNAMIC, None)
    )
    images = _images(*SHAPES[1])
    with torch.no_grad():
        _assert_detections(program.module()(images, padded=True), model(images, padded=True))


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_segmenter_exports_with_dynamic_shapes(strict):
    model = _segmenter()
    program = torch.export.export(
        model, (_images(*SHAPES[0]),), dynamic_shapes=(DYNAMIC,), strict=strict
    )
    for shape in SHAPES:
        images = _images(*shape)
        with torch.no_grad():
            assert_close(program.module()(images), model(images), atol=1e-5, rtol=0.0)


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_fpn_and_heads_export(strict):
    torch.manual_seed(0)
    fpn = FPN([8, 16, 32], [8, 16, 32], out_channels=16, extra_levels=2).eval()
    fcos = FCOSHead(16, num_classes=3, strides=[8, 16, 32, 64, 128], num_convs=1).eval()
    seg = FPNSegHead(16, num_classes=4, strides=[8, 16, 32], channels=8).eval()

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.fpn, self.fcos, self.seg = fpn, fcos, seg

        def forward(self, x):
            levels = self.fpn(ToyBackbone.forward(backbone, x))
            out = self.fcos(list(levels.values()))
            logits = self.seg(list(levels.values())[:3], size=tuple(x.shape[-2:]))
            return out["cls_logits"], out["boxes"], out["centerness"], logits

    backbone = ToyBackbone().eval()
    model = Heads().eval()
    # P6 and P7 (strides 64, 128) must not be 1 pixel wide: export specialises size-1 dims.
    dynamic = {0: DYNAMIC[0], 2: 32 * Dim("h5", min=5, max=32), 3: 32 * Dim("w5", min=5, max=32)}
    program = torch.export.export(
        model, (torch.randn(2, 3, 160, 192),), dynamic_shapes=(dynamic,), strict=strict
    )
    for shape in [(2, 3, 160, 192), (3, 3, 192, 288)]:
        x = torch.randn(shape)
        with torch.no_grad():
            assert_close(program.module()(x), model(x), atol=1e-5, rtol=0.0)


def _onnx_session(model, kwargs, path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model, (_images(*SHAPES[0], dtype=torch.float32),), kwargs=kwargs, dynamo=True,
            dynamic_shapes=(DYNAMIC, None) if kwargs else (DYNAMIC,), verbose=False,
        )  # fmt: skip
    program.save(str(path))
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.slow
def test_detector_onnx_matches_eager(tmp_path):
    model = _detector()
    session = _onnx_session(model, {"padded": True}, tmp_path / "detector.onnx")
    for shape in [(2, 3, 64, 96), (2, 3, 128, 64)]:
        images = _images(*shape, dtype=torch.float32)
        with torch.no_grad():
            expected = model(images, padded=True)
        outputs = session.run(None, {session.get_inputs()[0].name: images.numpy()})
        got = {k: torch.from_numpy(v) for k, v in zip(expected, outputs)}
        assert expected["num_detections"].min() > 0
        _assert_detections(got, expected)


@pytest.mark.slow
def test_segmenter_onnx_matches_eager(tmp_path):
    model = _segmenter()
    session = _onnx_session(model, None, tmp_path / "segmenter.onnx")
    for shape in [(2, 3, 64, 96), (2, 3, 128, 64)]:
        images = _images(*shape, dtype=torch.float32)
        with torch.no_grad():
            expected = model(images)
        got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: images.numpy()})[0])
        assert_close(got, expected, atol=1e-4, rtol=0.0)
        assert torch.equal(got.argmax(1), expected.argmax(1))
