"""IntermediateLayerGetter and feature_info: torchvision / timm oracles, non-chain models,
early stopping, the parameter subset (DDP), and the model staying intact."""

from __future__ import annotations

import copy
import os
import tempfile
import threading

import pytest
import torch
import torch.nn.functional as F
import torchvision
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torchvision.models._utils import IntermediateLayerGetter as TvGetter

from visionblocks.features import IntermediateLayerGetter, feature_info

SMALL = (3, 64, 64)


@pytest.fixture(scope="module")
def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def fresh_resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None)


def reference_outputs(model: nn.Module, names: list[str], *args) -> dict[str, object]:
    """First-call outputs of the named modules during a full ``model(*args)``."""
    modules = dict(model.named_modules(remove_duplicate=False))
    out: dict[str, object] = {}

    def hook(name: str):
        def record(module, inputs, output) -> None:  # returns None: output not replaced
            out.setdefault(name, output)

        return record

    handles = [modules[n].register_forward_hook(hook(n)) for n in names]
    try:
        model(*args)
    finally:
        for h in handles:
            h.remove()
    return out


def call_counter(model: nn.Module) -> tuple[dict[str, int], list]:
    counts = {name: 0 for name, _ in model.named_modules()}
    handles = []
    for name, module in model.named_modules():

        def hook(m, i, name=name):
            counts[name] += 1

        handles.append(module.register_forward_pre_hook(hook))
    return counts, handles


def assert_no_hooks(model: nn.Module) -> None:
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks


def grad_ids(model: nn.Module) -> set[int]:
    return {id(p) for p in model.parameters() if p.grad is not None}


# --------------------------------------------------------------------------- torchvision oracle


@pytest.mark.parametrize(
    ("build", "attr", "return_layers", "mode"),
    [
        (torchvision.models.resnet18, None, {"layer1": "0", "layer2": "1", "layer4": "3"}, "eval"),
        (torchvision.models.resnet18, None, {"layer3": "c4", "layer1": "c2"}, "train"),
        (torchvision.models.resnet50, None, {"layer4": "c5", "layer2": "c3"}, "eval"),
        (
            torchvision.models.mobilenet_v3_small,
            "features",
            {"3": "a", "12": "b", "8": "c"},
            "eval",
        ),
        (torchvision.models.mobilenet_v3_small, "features", {"6": "x"}, "train"),
    ],
)
def test_matches_torchvision_getter(build, attr, return_layers, mode):
    size = SMALL
    torch.manual_seed(0)
    model = build(weights=None)
    model = getattr(model, attr) if attr else model
    ours = IntermediateLayerGetter(model, return_layers, input_size=size)
    theirs = TvGetter(copy.deepcopy(model), return_layers)
    ours.train(mode == "train")
    theirs.train(mode == "train")
    x = torch.randn(2, *size)
    got, want = ours(x), theirs(x)
    assert list(got) == list(return_layers.values())  # return_layers order
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    ours.load_state_dict(theirs.state_dict())  # checkpoints of torchvision's getter load


def test_integer_names_are_refused():
    # torchvision finds no module named 0; ours took str(0) without a word
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU())
    with pytest.raises(TypeError, match=r"module names must be str.*got int \(0\); write '0'"):
        IntermediateLayerGetter(model, {0: "c1"}, input_size=(3, 8, 8))
    with pytest.raises(TypeError, match=r"output names must be str.*got int \(1\)"):
        IntermediateLayerGetter(model, {"0": 1}, input_size=(3, 8, 8))
    assert list(
        IntermediateLayerGetter(model, ["0"], input_size=(3, 8, 8))(torch.rand(1, 3, 8, 8))
    ) == ["0"]


def test_list_return_layers_and_order(resnet18):
    getter = IntermediateLayerGetter(resnet18, ["layer3", "layer1"], input_size=SMALL)
    out = getter(torch.randn(1, *SMALL))
    assert list(out) == ["layer3", "layer1"]
    assert getter.return_layers == {"layer3": "layer3", "layer1": "layer1"}


# --------------------------------------------------------------------------- nested names


def test_nested_names_on_resnet(resnet18):
    names = {"layer4.1.conv2": "c", "layer2.0.downsample.0": "d", "layer1.1": "b"}
    getter = IntermediateLayerGetter(resnet18, names, input_size=SMALL)
    x = torch.randn(2, *SMALL)
    got = getter(x)
    want = reference_outputs(resnet18, list(names), x)
    for name, out in names.items():
        torch.testing.assert_close(got[out], want[name], rtol=0, atol=0)
    keys = getter.state_dict().keys()
    assert set(keys) < set(resnet18.state_dict())
    assert "layer4.1.conv2.weight" in keys and "layer4.1.bn1.running_mean" in keys
    assert "layer4.1.bn2.weight" not in keys and "fc.weight" not in keys
    assert "[partial]" in repr(getter) and "Sequential[partial]" in repr(getter)
    with pytest.raises(RuntimeError, match="partial view"):
        getter.layer4(x)


@settings(max_examples=6, deadline=None)
@given(st.data())
def test_any_subset_of_resnet_modules(resnet18, data):
    # Outputs of bn1 / bn2 are changed in place later (ReLU(inplace=True), ``out += identity``),
    # as with torchvision's getter; the reference below would see the changed tensor.
    names = [
        n
        for n, _ in resnet18.named_modules()
        if n and n not in ("avgpool", "fc") and not n.endswith(("bn1", "bn2"))
    ]
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True))
    getter = IntermediateLayerGetter(resnet18, chosen, input_size=SMALL)
    x = torch.randn(2, *SMALL)
    got = getter(x)
    want = reference_outputs(resnet18, chosen, x)
    for name in chosen:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
    resnet18.zero_grad(set_to_none=True)
    sum(v.float().sum() for v in got.values()).backward()
    # Exactly the parameters that get a gradient: none unused, none left out.
    assert {id(p) for p in getter.parameters()} == grad_ids(resnet18)
    resnet18.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------- non-chain models


class TinyUNet(nn.Module):
    """Skip connections, a functional op in forward, registration order != execution order."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Conv2d(8, 2, 1)
        self.dec1 = nn.Conv2d(16, 8, 3, padding=1)
        self.dec2 = nn.Conv2d(32, 8, 3, padding=1)
        self.enc1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.bottleneck = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        e1 = self.enc1(x * self.scale)
        e2 = self.enc2(e1)
        b = F.interpolate(torch.relu(self.bottleneck(e2)), scale_factor=2.0)
        d2 = self.dec2(torch.cat([b, e2], 1))
        d1 = self.dec1(torch.cat([F.interpolate(d2, scale_factor=2.0), e1], 1))
        return self.head(d1)


def test_skip_connection_model():
    model = TinyUNet()
    getter = IntermediateLayerGetter(model, {"enc1": "e1", "dec2": "d2"}, input_size=(3, 16, 16))
    x = torch.randn(2, 3, 16, 16)
    got = getter(x)
    want = reference_outputs(model, ["enc1", "dec2"], x)
    torch.testing.assert_close(got["e1"], want["enc1"], rtol=0, atol=0)
    torch.testing.assert_close(got["d2"], want["dec2"], rtol=0, atol=0)
    # Execution order, not registration order: dec1 and head never run before the stop.
    assert [n for n, _ in getter.named_children()] == ["dec2", "enc1", "enc2", "bottleneck"]
    assert "scale" in getter.state_dict()
    sum(v.sum() for v in got.values()).backward()
    assert {id(p) for p in getter.parameters()} == grad_ids(model)
    # torchvision's getter chains the children in registration order: wrong here.
    with pytest.raises(RuntimeError):
        TvGetter(model, {"enc1": "e1"})(x)


class Reuse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.block = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.tail = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        x = self.act(self.conv1(x))
        x = self.act(self.block(x))
        x = self.act(self.block(x))
        x = self.conv2(x)
        return self.tail(self.act(x))


def test_reused_module_gives_first_call():
    model = Reuse()
    x = torch.randn(1, 3, 8, 8)
    getter = IntermediateLayerGetter(model, ["act", "block"], example_input=x)
    got = getter(x)
    torch.testing.assert_close(got["act"], torch.relu(model.conv1(x)), rtol=0, atol=0)
    torch.testing.assert_close(got["block"], model.block(got["act"]), rtol=0, atol=0)
    counts, handles = call_counter(model)
    getter(x)
    for h in handles:
        h.remove()
    assert counts["block"] == 1 and counts["conv2"] == 0 and counts["tail"] == 0
    assert {n for n, _ in getter.named_children()} == {"conv1", "act", "block"}


def test_stops_after_last_output(resnet18):
    getter = IntermediateLayerGetter(resnet18, {"layer2": "a", "layer1.0": "b"}, input_size=SMALL)
    counts, handles = call_counter(resnet18)
    try:
        getter(torch.randn(1, *SMALL))
    finally:
        for h in handles:
            h.remove()
    assert counts["layer2"] == 1 and counts["layer2.1.conv2"] == 1
    assert counts["layer3"] == counts["layer4"] == counts["avgpool"] == counts["fc"] == 0


class Aux(nn.Module):
    """An aux branch that runs early but only feeds the final output; a functional read of a
    child's weight; an attention layer reading ``out_proj.weight`` directly."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.aux = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8))
        self.proj = nn.Linear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.frozen = nn.Conv2d(8, 8, 1)
        self.frozen.requires_grad_(False)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        x = self.frozen(self.stem(x))
        aux = self.aux(x)
        tokens = F.linear(x.flatten(2).transpose(1, 2), self.proj.weight)  # proj never called
        tokens, _ = self.attn(tokens, tokens, tokens)
        return self.out(tokens + aux.flatten(2).transpose(1, 2))


def test_parameters_are_those_that_reach_the_outputs():
    model = Aux()
    getter = IntermediateLayerGetter(model, ["attn"], input_size=(3, 4, 4))
    names = {n for n, _ in getter.named_parameters()}
    assert "proj.weight" in names and "proj.bias" not in names
    assert "attn.out_proj.weight" in names and "attn.in_proj_weight" in names
    assert "frozen.weight" in names  # frozen, but its module runs: kept for checkpoints
    assert not any(n.startswith(("aux.", "out.")) for n in names)
    assert "aux.1.running_mean" in getter.state_dict()  # the aux branch runs: buffers kept
    x = torch.randn(2, 3, 4, 4)
    out = getter(x)["attn"][0]
    out.sum().backward()
    assert {id(p) for p in getter.parameters() if p.requires_grad} == grad_ids(model)
    # The aux branch still runs, so .to() converts it although it is not registered.
    getter.to(torch.float64)
    assert model.aux[0].weight.dtype == model.aux[1].running_mean.dtype == torch.float64
    assert model.out.weight.dtype == torch.float32  # never runs before the stop: untouched
    assert getter(x.double())["attn"][0].dtype == torch.float64


# --------------------------------------------------------------------------- model intact


def test_model_stays_intact():
    model = fresh_resnet18()
    model.layer1.requires_grad_(False)
    model.bn1.eval()
    x = torch.randn(2, *SMALL)
    model.eval()
    before = model(x)
    model.train()
    model.bn1.eval()
    stats = copy.deepcopy(model.state_dict())
    modules = [(n, id(m)) for n, m in model.named_modules()]
    getter = IntermediateLayerGetter(model, ["layer3.0.conv1", "layer2"], input_size=SMALL)
    assert_no_hooks(model)
    assert [(n, id(m)) for n, m in model.named_modules()] == modules
    assert model.training and model.layer4.training and not model.bn1.training
    assert all(not p.requires_grad for p in model.layer1.parameters())
    assert all(p.requires_grad for p in model.layer2.parameters())
    for key, value in model.state_dict().items():  # the dry run touched no statistics
        torch.testing.assert_close(value, stats[key], rtol=0, atol=0)
    getter.eval()
    with torch.no_grad():
        getter(x)
    assert_no_hooks(model)
    torch.testing.assert_close(model.eval()(x), before, rtol=0, atol=0)


def test_train_eval_propagate():
    model = fresh_resnet18()
    getter = IntermediateLayerGetter(model, ["layer3.1.conv1"], input_size=SMALL)
    getter.eval()
    assert not model.training and not model.layer1.training and not model.layer3.training
    assert not model.layer3[1].training and not model.layer3[1].conv1.training
    # Not part of the getter: they run after the stop.
    assert model.fc.training and model.layer4.training and model.layer3[1].bn1.training
    getter.train()
    assert model.training and model.layer3.training and model.layer3[1].training


def test_to_dtype_propagates_and_buffers_stay_shared():
    model = TinyUNet()
    getter = IntermediateLayerGetter(model, ["enc2"], input_size=(3, 16, 16))
    getter.to(torch.float64)
    assert model.scale.dtype == torch.float64  # a buffer of the partly-run root
    assert model.enc1[1].running_mean.dtype == torch.float64
    assert model.enc1[0].weight.dtype == torch.float64
    assert model.head.weight.dtype == torch.float32
    assert getter.state_dict()["scale"].dtype == torch.float64
    out = getter(torch.randn(2, 3, 16, 16, dtype=torch.float64))
    assert out["enc2"].dtype == torch.float64
    getter.load_state_dict({k: torch.zeros_like(v) for k, v in getter.state_dict().items()})
    assert model.scale.item() == 0 and model.enc1[0].weight.abs().sum() == 0


def test_no_grad_batch_one_batchnorm_train_mode():
    model = fresh_resnet18()
    getter = IntermediateLayerGetter(model, {"layer4": "c5"}, input_size=SMALL)
    getter.train()
    x = torch.randn(1, *SMALL)
    with torch.no_grad():
        out = getter(x)["c5"]
    assert out.shape == (1, 512, 2, 2) and not out.requires_grad
    with torch.inference_mode():
        assert getter(x)["c5"].shape == (1, 512, 2, 2)
    for context in (torch.no_grad, torch.inference_mode):  # construction still finds them
        with context():
            again = IntermediateLayerGetter(model, {"layer1": "c2"}, input_size=SMALL)
        assert len(list(again.parameters())) == len(
            list(TvGetter(model, {"layer1": "c2"}).parameters())
        )


def test_deepcopy_is_independent(resnet18):
    getter = IntermediateLayerGetter(resnet18, ["layer2.1"], input_size=SMALL)
    clone = copy.deepcopy(getter)
    x = torch.randn(1, *SMALL)
    torch.testing.assert_close(clone(x)["layer2.1"], getter(x)["layer2.1"], rtol=0, atol=0)
    with torch.no_grad():
        for p in clone.parameters():
            p.zero_()
    assert clone(x)["layer2.1"].abs().sum() == 0
    assert getter(x)["layer2.1"].abs().sum() > 0


@pytest.mark.distributed
def test_ddp_sees_no_unused_parameters():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "gloo", init_method=f"file://{os.path.join(tmp, 'init')}", rank=0, world_size=1
        )
        try:
            getter = IntermediateLayerGetter(
                fresh_resnet18(), ["layer1", "layer3.0.bn1"], input_size=SMALL
            )
            ddp = DistributedDataParallel(getter)  # find_unused_parameters=False
            for _ in range(2):  # an unused parameter fails the second iteration
                out = ddp(torch.randn(2, *SMALL))
                sum(v.sum() for v in out.values()).backward()
        finally:
            dist.destroy_process_group()


class NoGradStem(nn.Module):
    """A stem run under torch.no_grad() (frozen by the forward itself) and a detached tap."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.body = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        with torch.no_grad():
            x = self.stem(x)
        return self.head(self.body(x))


def test_modules_run_under_no_grad_are_kept():
    """Their parameters get no gradient, but they shape the outputs: state_dict needs them."""
    model = NoGradStem()
    getter = IntermediateLayerGetter(model, ["body"], input_size=(3, 8, 8))
    assert list(getter.state_dict()) == ["stem.weight", "stem.bias", "body.weight", "body.bias"]
    fresh = NoGradStem()
    IntermediateLayerGetter(fresh, ["body"], input_size=(3, 8, 8)).load_state_dict(
        getter.state_dict()
    )
    x = torch.randn(1, 3, 8, 8)
    torch.testing.assert_close(fresh.body(fresh.stem(x)), model.body(model.stem(x)))


def test_concurrent_threads_do_not_see_each_others_hooks():
    """The model and getters on it can run in other threads while a getter's hooks exist."""
    model = fresh_resnet18().eval()
    getter = IntermediateLayerGetter(model, {"layer2": "c3"}, input_size=SMALL)
    inputs = [torch.randn(1, *SMALL, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with torch.no_grad():
        full = [model(x) for x in inputs]
        taps = [TvGetter(model, {"layer2": "c3"})(x)["c3"] for x in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(15):
                with torch.no_grad():
                    if i == 0:
                        torch.testing.assert_close(model(inputs[0]), full[0], rtol=0, atol=0)
                    else:
                        out = getter(inputs[i])["c3"]
                        torch.testing.assert_close(out, taps[i], rtol=0, atol=0)
        except BaseException as err:  # _StopForward included
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]
    assert_no_hooks(model)


def test_replaced_children_run_in_the_model():
    """convert_sync_batchnorm on a getter: the model's forward runs the new modules too."""
    model = fresh_resnet18()
    getter = IntermediateLayerGetter(model, ["layer1", "layer4.1.conv2"], input_size=SMALL)
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(getter)
    assert converted is getter
    ran = []
    for module in getter.modules():
        if isinstance(module, nn.SyncBatchNorm):
            module.register_forward_pre_hook(lambda m, i: ran.append(m))
    assert isinstance(model.bn1, nn.SyncBatchNorm)
    assert isinstance(model.layer4[1].bn1, nn.SyncBatchNorm)  # inside a [partial] holder
    assert isinstance(model.layer4[1].bn2, nn.BatchNorm2d)  # after the stop: not in the getter
    getter.eval()
    with torch.no_grad():
        getter(torch.randn(1, *SMALL))
    assert model.bn1 in ran and model.layer4[1].bn1 in ran
    getter.layer1 = nn.Identity()  # plain attribute assignment is mirrored as well
    assert isinstance(model.layer1, nn.Identity)


def test_data_parallel_is_refused_with_a_clear_error(resnet18):
    getter = IntermediateLayerGetter(resnet18, ["layer1"], input_size=SMALL)
    with pytest.raises(RuntimeError, match="does not support nn.DataParallel"):
        getter._replicate_for_data_parallel()


# --------------------------------------------------------------------------- getter errors


def test_getter_errors(resnet18):
    with pytest.raises(ValueError, match=r"did you mean 'layer1'"):
        IntermediateLayerGetter(resnet18, ["layr1"], input_size=SMALL)
    with pytest.raises(ValueError, match=r"did you mean 'layer4.1.conv2'"):
        IntermediateLayerGetter(resnet18, ["layer4.1.conv3"], input_size=SMALL)
    with pytest.raises(ValueError, match="the model itself"):
        IntermediateLayerGetter(resnet18, [""], input_size=SMALL)
    with pytest.raises(ValueError, match="empty"):
        IntermediateLayerGetter(resnet18, {}, input_size=SMALL)
    with pytest.raises(ValueError, match="not unique"):
        IntermediateLayerGetter(resnet18, {"layer1": "a", "layer2": "a"}, input_size=SMALL)
    with pytest.raises(ValueError, match="twice"):
        IntermediateLayerGetter(resnet18, ["layer1", "layer1"], input_size=SMALL)
    with pytest.raises(TypeError, match="model must be Module"):
        IntermediateLayerGetter(lambda x: x, ["a"])
    with pytest.raises(ValueError, match="not both"):
        IntermediateLayerGetter(
            resnet18, ["layer1"], input_size=SMALL, example_input=torch.zeros(1)
        )
    with pytest.raises(ValueError, match="input_size"):
        IntermediateLayerGetter(resnet18, ["layer1"], input_size=(64, 64))
    with pytest.raises(ValueError, match="dry run .* failed"):
        IntermediateLayerGetter(resnet18, ["layer1"], input_size=(1, 64, 64))


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 3, 1)
        self.b = nn.Conv2d(3, 3, 1)
        self.unused = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return self.b(x) if x.sum() > 0 else self.a(x)


def test_modules_that_do_not_run():
    model = Branchy()
    with pytest.raises(ValueError, match=r"\['unused'\] did not run"):
        IntermediateLayerGetter(model, ["unused"], input_size=(3, 4, 4))
    getter = IntermediateLayerGetter(model, ["b"], example_input=torch.ones(1, 3, 4, 4))
    assert getter(torch.ones(1, 3, 4, 4))["b"].shape == (1, 3, 4, 4)
    with pytest.raises(RuntimeError, match=r"\['b'\] did not run"):
        getter(-torch.ones(1, 3, 4, 4))


# --------------------------------------------------------------------------- feature_info


def test_feature_info_resnet18(resnet18):
    resnet18.train()
    stats = resnet18.bn1.running_mean.clone()
    info = feature_info(resnet18, SMALL, ["layer1", "layer2", "layer3", "layer4"])
    assert [i["channels"] for i in info] == [64, 128, 256, 512]
    assert [i["stride"] for i in info] == [4, 8, 16, 32]
    assert all(type(i["stride"]) is int for i in info)
    assert resnet18.training and resnet18.layer1[0].bn1.training  # mode restored
    torch.testing.assert_close(resnet18.bn1.running_mean, stats, rtol=0, atol=0)
    resnet18.eval()
    assert feature_info(resnet18, (3, 224, 224), ["layer4.1.conv2"]) == [
        {"name": "layer4.1.conv2", "channels": 512, "stride": 32}
    ]
    everything = feature_info(resnet18, SMALL)  # top-level children with 4-D outputs
    assert [i["name"] for i in everything] == [
        "conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool"
    ]  # fmt: skip
    assert everything[0] == {"name": "conv1", "channels": 64, "stride": 2}


def test_feature_info_mobilenet_v3_small():
    features = torchvision.models.mobilenet_v3_small(weights=None).features
    info = feature_info(features, SMALL)
    assert [i["name"] for i in info] == [str(i) for i in range(13)]
    assert info[0] == {"name": "0", "channels": 16, "stride": 2}
    assert info[-1] == {"name": "12", "channels": 576, "stride": 32}
    assert [i["stride"] for i in info] == [2, 4, 8, 8, 16, 16, 16, 16, 16, 32, 32, 32, 32]
    want = reference_outputs(features, [i["name"] for i in info], torch.zeros(1, *SMALL))
    assert [i["channels"] for i in info] == [want[i["name"]].shape[1] for i in info]


def test_feature_info_timm_features_only():
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet18", features_only=True, pretrained=False)
    info = feature_info(model, SMALL)
    assert [i["name"] for i in info] == [0, 1, 2, 3, 4]
    assert [i["channels"] for i in info] == model.feature_info.channels()
    assert [i["stride"] for i in info] == model.feature_info.reduction()
    assert feature_info(model, SMALL, [-1, 1]) == [
        {"name": 4, "channels": 512, "stride": 32},
        {"name": 1, "channels": 64, "stride": 4},
    ]
    with pytest.raises(ValueError, match="int indices"):
        feature_info(model, SMALL, ["layer1"])
    with pytest.raises(ValueError, match="out of range"):
        feature_info(model, SMALL, [5])


def test_feature_info_of_a_getter(resnet18):
    getter = IntermediateLayerGetter(resnet18, {"layer2": "c3", "layer4": "c5"}, input_size=SMALL)
    assert feature_info(getter, SMALL) == [
        {"name": "c3", "channels": 128, "stride": 8},
        {"name": "c5", "channels": 512, "stride": 32},
    ]
    assert feature_info(getter, SMALL, ["c5"]) == [{"name": "c5", "channels": 512, "stride": 32}]
    with pytest.raises(ValueError, match="keys of the model's output"):
        feature_info(getter, SMALL, ["layer4"])


class Strides(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 4, 3, stride=(2, 1), padding=1)
        self.pool = nn.AvgPool2d(3, stride=3)
        self.up = nn.Upsample(scale_factor=2.0)

    def forward(self, x):
        return self.down(x), self.up(x), self.pool(x), x.mean()


@pytest.mark.parametrize("size", [(3, 100, 100), (3, 33, 33), (3, 65, 97), (3, 64, 64)])
def test_feature_info_input_sizes_not_divisible_by_the_stride(size):
    info = feature_info(fresh_resnet18(), size, ["layer1", "layer2", "layer3", "layer4"])
    assert [f["stride"] for f in info] == [4, 8, 16, 32]


def test_feature_info_fixed_size_model_snaps_to_a_power_of_two():
    class Fixed(nn.Module):  # accepts 100 x 100 only: no check run possible
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(*[nn.Conv2d(3, 3, 3, stride=2, padding=1)] * 5)

        def forward(self, x):
            if x.shape[-2:] != (100, 100):
                raise ValueError("100 x 100 only")
            return {"out": self.body(x)}

    assert feature_info(Fixed(), (3, 100, 100)) == [{"name": "out", "channels": 3, "stride": 32}]


def test_feature_info_needs_a_feature():
    with pytest.raises(ValueError, match="MaxPool2d has no 4-D"):
        feature_info(nn.MaxPool2d(2), (3, 8, 8))


def test_feature_info_strides_and_errors():
    model = Strides()
    with pytest.raises(ValueError, match="different strides in H and W"):
        feature_info(model, (3, 8, 8), [0])
    up = feature_info(model, (3, 8, 8), [1])[0]
    assert up == {"name": 1, "channels": 3, "stride": 0.5} and type(up["stride"]) is float
    assert feature_info(model, (3, 8, 8), [2])[0]["stride"] == 4  # 8 -> 2: not divisible by 3
    assert feature_info(model, (3, 9, 9), [2])[0]["stride"] == 3  # a check run keeps 3
    with pytest.raises(ValueError, match="not a 4-D"):
        feature_info(model, (3, 8, 8), [3])
    with pytest.raises(ValueError, match="feature 0 has different strides"):
        feature_info(model, (3, 6, 6))  # every 4-D entry, the first one included
    resnet = fresh_resnet18()
    with pytest.raises(ValueError, match="not a 4-D"):
        feature_info(resnet, SMALL, ["fc"])
    with pytest.raises(ValueError, match="did you mean 'layer2'"):
        feature_info(resnet, SMALL, ["layer_2"])
    with pytest.raises(ValueError, match="must be module names"):
        feature_info(resnet, SMALL, [0])
    for bad in [(64, 64), (3, 0, 64), (3, 64.0, 64)]:
        with pytest.raises(ValueError, match="input_size"):
            feature_info(resnet, bad)
    with pytest.raises(TypeError, match="model must be Module"):
        feature_info(torch.zeros(1), SMALL)


class Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.backbone = inner
        self.head = nn.Conv2d(512, 4, 1)

    def forward(self, x):
        return self.head(self.backbone(x)["c5"])


def test_getter_of_a_model_holding_a_getter():
    model = fresh_resnet18().eval()
    inner = IntermediateLayerGetter(model, {"layer4": "c5"}, input_size=SMALL)
    outer = IntermediateLayerGetter(Wrapper(inner), ["backbone.layer2", "head"], input_size=SMALL)
    x = torch.randn(1, *SMALL)
    counts, handles = call_counter(model)
    got = IntermediateLayerGetter(Wrapper(inner), ["backbone.layer2"], input_size=SMALL)(x)
    for h in handles:
        h.remove()
    assert counts["layer3"] == 0  # the outer stop went through the inner getter
    want = reference_outputs(model, ["layer2"], x)["layer2"]
    torch.testing.assert_close(got["backbone.layer2"], want, rtol=0, atol=0)
    assert outer(x)["head"].shape == (1, 4, 2, 2)
    assert "backbone.fc.weight" not in outer.state_dict()


def test_moves_to_device(device):
    model = TinyUNet()
    getter = IntermediateLayerGetter(model, ["dec2"], input_size=(3, 16, 16)).to(device)
    x = torch.randn(2, 3, 16, 16)
    want = reference_outputs(model.to(device), ["dec2"], x.to(device))["dec2"]
    model.head.cpu()  # never runs before the stop: may live anywhere
    got = getter(x.to(device))["dec2"]
    assert got.device.type == device.type and model.scale.device.type == device.type
    torch.testing.assert_close(got, want)
    assert feature_info(getter, (3, 16, 16)) == [{"name": "dec2", "channels": 8, "stride": 2}]


class ListInput(nn.Module):
    """Takes a list of images, like torchvision's detection models."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.tail = nn.Conv2d(4, 4, 1)

    def forward(self, images: list[torch.Tensor], scale: float = 1.0):
        return self.tail(self.conv(torch.stack(images) * scale))


def test_example_input_list_and_tuple():
    model = ListInput()
    images = [torch.randn(3, 8, 8), torch.randn(3, 8, 8)]
    getter = IntermediateLayerGetter(model, ["conv"], example_input=images)  # one argument
    torch.testing.assert_close(getter(images)["conv"], model.conv(torch.stack(images)))
    getter = IntermediateLayerGetter(model, ["conv"], example_input=(images, 2.0))  # two
    torch.testing.assert_close(
        getter(images, scale=2.0)["conv"], model.conv(2 * torch.stack(images))
    )
    assert [n for n, _ in getter.named_parameters()] == ["conv.weight", "conv.bias"]


def test_bad_dry_run_inputs_are_value_errors(resnet18):
    with pytest.raises(ValueError, match=r"input_size=\(3, 100000, 64\) is too large"):
        IntermediateLayerGetter(resnet18, ["layer1"], input_size=(3, 100_000, 64))
    with pytest.raises(ValueError, match="dry run .* failed .* pass an input_size"):
        feature_info(resnet18, (1, 64, 64), ["layer1"])
    with pytest.raises(ValueError, match="layers names 'layer1' more than once"):
        feature_info(resnet18, SMALL, ["layer1", "layer1"])
