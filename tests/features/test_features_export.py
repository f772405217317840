"""IntermediateLayerGetter and Backbone under torch.export (strict and non-strict, dynamic
batch and H/W), torch.jit.trace, torch.compile, torch.fx and ONNX (onnxruntime)."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
import torchvision
from torch import nn
from torch.export import Dim

from visionblocks.backbones import build_backbone
from visionblocks.features import IntermediateLayerGetter

pytestmark = pytest.mark.slow  # torch.export and ONNX exports of backbones

SMALL = (3, 64, 64)
NAMES = {"layer2": "p3", "layer4.1.conv2": "c5"}


def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


@pytest.fixture(scope="module")
def getter() -> IntermediateLayerGetter:
    return IntermediateLayerGetter(resnet18(), NAMES, input_size=SMALL).eval()


@pytest.fixture(scope="module", params=["resnet18", "timm/resnet18"])
def backbone(request: pytest.FixtureRequest) -> nn.Module:
    torch.manual_seed(0)
    return build_backbone(request.param, out_indices=(1, 3)).eval()


def images(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def dynamic(x_name: str = "x") -> dict:
    """Dynamic batch, and H, W multiples of 32 (the models' total stride), for the argument
    ``x_name`` (``"args"``: the getter's ``forward(*args)``)."""
    h, w = Dim("h", min=2, max=32), Dim("w", min=2, max=32)
    spec = {0: Dim("batch", min=1, max=64), 2: 32 * h, 3: 32 * w}
    return {x_name: (spec,) if x_name == "args" else spec}


def assert_same(got, want, atol: float = 1e-5) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].shape == want[key].shape, key
        torch.testing.assert_close(got[key], want[key], atol=atol, rtol=1e-5)


@pytest.mark.parametrize("strict", [False, True])
def test_getter_exports_with_dynamic_shapes(getter, strict):
    x = images(2, 3, 64, 64)
    program = torch.export.export(getter, (x,), dynamic_shapes=dynamic("args"), strict=strict)
    exported = program.module()
    with torch.no_grad():
        for shape in [(2, 3, 64, 64), (3, 3, 96, 128), (1, 3, 64, 160)]:
            inp = images(*shape)
            assert_same(exported(inp), getter(inp))
    # Parameters keep the getter's names; the head after the last output is not exported.
    params = set(program.graph_signature.parameters)
    assert params <= set(getter.state_dict())
    assert "layer4.1.conv2.weight" in params and "layer4.1.bn2.weight" not in params


def test_getter_export_of_top_level_names():
    model = resnet18()
    getter = IntermediateLayerGetter(model, ["layer1", "layer3"], input_size=SMALL).eval()
    x = images(2, 3, 64, 64)
    for strict in (False, True):
        program = torch.export.export(getter, (x,), strict=strict)
        assert not any(p.startswith("layer4") for p in program.graph_signature.parameters)
        with torch.no_grad():
            assert_same(program.module()(x), getter(x))


def test_export_runs_the_getters_current_modules():
    model = resnet18()
    getter = IntermediateLayerGetter(model, NAMES, input_size=SMALL).eval()
    keys = list(getter.state_dict())
    getter.double()
    assert list(getter.state_dict()) == keys
    x = images(2, 3, 64, 64).double()
    with torch.no_grad():
        model.layer1[0].conv1.weight.mul_(2)  # changed after construction
        getter.bn1 = nn.BatchNorm2d(64).double().eval()  # replaced (mirrored into model)
        getter.bn1.running_mean.fill_(0.5)
        want = getter(x)
    assert getter.bn1 is model.bn1
    for strict in (False, True):
        program = torch.export.export(getter, (x,), strict=strict)
        assert_same(program.module()(x), want)


def test_jit_trace_equals_eager(getter):
    x = images(2, 3, 64, 64)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(getter, (x,), strict=False)
        other = images(1, 3, 96, 128)
        assert_same(traced(x), getter(x), atol=0)
        assert_same(traced(other), getter(other), atol=1e-6)


def test_torch_compile_fullgraph(getter):
    compiled = torch.compile(getter, backend="eager", fullgraph=True)
    x = images(2, 3, 64, 64)
    with torch.no_grad():
        assert_same(compiled(x), getter(x), atol=0)


def test_fx_symbolic_trace_of_a_model_holding_a_getter(getter):
    holder = nn.Sequential(getter)
    traced = torch.fx.symbolic_trace(holder)
    assert not any(n.target == "0" for n in traced.graph.nodes)  # traced through the getter
    x = images(2, 3, 64, 64)
    with torch.no_grad():
        assert_same(traced(x), getter(x), atol=0)


def test_traced_path_in_training_mode_and_after_copies():
    getter = IntermediateLayerGetter(resnet18(), NAMES, input_size=SMALL).train()
    x = images(4, 3, 64, 64)
    program = torch.export.export(getter, (x,), strict=False)
    torch.manual_seed(0)
    eager = IntermediateLayerGetter(resnet18(), NAMES, input_size=SMALL).train()
    assert_same(program.module()(x), eager(x))  # batch statistics, as in eager training
    assert pickle.loads(pickle.dumps(getter))._traced.fns[True] is not None
    for clone in (copy.deepcopy(getter), pickle.loads(pickle.dumps(getter))):
        traced = torch.fx.symbolic_trace(nn.Sequential(clone.eval()))
        with torch.no_grad():
            assert_same(traced(x), clone(x), atol=0)


class Branchy(nn.Module):
    """A forward torch.fx cannot trace (Python control flow on a tensor value)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if float(x.shape[0]) > 0:  # fine in eager and export, a TraceError in torch.fx
            y = y.relu()
        return self.head(self.b(y).mean((2, 3)))


def test_untraceable_model_exports_non_strict_with_hooks():
    getter = IntermediateLayerGetter(Branchy(), ["a", "b"], input_size=(3, 8, 8)).eval()
    x = images(2, 3, 8, 8)
    program = torch.export.export(getter, (x,), strict=False)
    with torch.no_grad():
        assert_same(program.module()(x), getter(x))
    assert not any(p.startswith("head") for p in program.graph_signature.parameters)
    with pytest.raises(Exception, match="strict=False"):
        torch.export.export(getter, (x,), strict=True)


@pytest.mark.parametrize("strict", [False, True])
def test_backbone_exports_with_dynamic_shapes(backbone, strict):
    x = images(2, 3, 64, 64)
    program = torch.export.export(backbone, (x,), dynamic_shapes=dynamic(), strict=strict)
    exported = program.module()
    with torch.no_grad():
        for shape in [(2, 3, 64, 64), (3, 3, 96, 128)]:
            inp = images(*shape)
            assert_same(exported(inp), backbone(inp))


def test_backbone_jit_trace_equals_eager(backbone):
    x = images(2, 3, 64, 64)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(backbone, (x,), strict=False)
        assert_same(traced(x), backbone(x), atol=1e-6)


def test_backbone_onnx_matches_eager_in_onnxruntime(backbone, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    path = tmp_path / "backbone.onnx"
    x = images(2, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(backbone, (x,), str(path), dynamo=True, dynamic_shapes=dynamic())
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (input_name,) = [i.name for i in session.get_inputs()]
    for shape in [(2, 3, 64, 64), (2, 3, 96, 128)]:
        inp = images(*shape)
        with torch.no_grad():
            want = backbone(inp)
        got = session.run(None, {input_name: inp.numpy()})
        assert len(got) == len(want)
        for value, key in zip(got, want, strict=True):
            torch.testing.assert_close(torch.from_numpy(value), want[key], atol=1e-4, rtol=1e-4)
