"""load_partial(match="structure"): the same network under other names, paired by order and shape."""

from __future__ import annotations

import copy
import functools
import time

import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision
from safetensors.torch import save_file
from torch import nn

from visionblocks.weights import LoadError, load_partial
from visionblocks.weights._structure import match_structure


def _randomise(model: nn.Module, seed: int) -> nn.Module:
    """Random weights everywhere, scales and norm weights near 1 and BatchNorm statistics
    that matter, so a tensor loaded into the wrong place changes the output."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 and not name.endswith(("gamma", "layer_scale")):
                p.normal_(0, (2 / p[0].numel()) ** 0.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
            else:  # norm weights and layer scales
                p.uniform_(0.5, 1.5)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(11)
    return model.eval()


def _batch() -> torch.Tensor:
    torch.manual_seed(123)
    return torch.randn(2, 3, 64, 64)


# ------------------------------------------------------------------------- timm <-> torchvision
@functools.cache
def _convnexts() -> tuple[nn.Module, nn.Module]:
    """timm's and torchvision's ConvNeXt-T, random (different) weights each."""
    ours = _randomise(timm.create_model("convnext_tiny", pretrained=False), 0)
    theirs = _randomise(torchvision.models.convnext_tiny(weights=None), 1)
    return ours, theirs


def test_timm_convnext_loads_into_torchvision_convnext_from_a_file(tmp_path):
    timm_net, tv_net = (copy.deepcopy(m) for m in _convnexts())
    path = tmp_path / "convnext_tiny_timm.pth"
    torch.save(timm_net.state_dict(), path)
    report = load_partial(tv_net, path, match="structure", strict=True)
    assert report.num_loaded == 182 and report.match == "structure" and report.ok
    assert report.renamed["stem.0.weight"] == "features.0.0.weight"
    assert report.renamed["stages.0.blocks.0.conv_dw.weight"] == "features.1.0.block.0.weight"
    assert report.renamed["head.fc.weight"] == "classifier.2.weight"
    assert len(report.renamed) == 182  # no name agrees: every pairing is listed
    # timm's layer scale gamma (C,) is torchvision's layer_scale (C, 1, 1): reshaped.
    assert len(report.reshaped) == 18
    assert report.reshaped["features.1.0.layer_scale"] == ((96,), (96, 1, 1))
    assert report.renamed["stages.0.blocks.0.gamma"] == "features.1.0.layer_scale"
    with torch.no_grad():
        expected, got = timm_net(_batch()), tv_net(_batch())
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert expected.std() > 0.1  # an output that carries the weights, not a constant


def test_torchvision_convnext_loads_into_timm_convnext():
    timm_net, tv_net = (copy.deepcopy(m) for m in _convnexts())
    report = load_partial(timm_net, tv_net.state_dict(), match="structure", strict=True)
    assert report.num_loaded == 182 and len(report.reshaped) == 18
    assert report.reshaped["stages.3.blocks.2.gamma"] == ((768, 1, 1), (768,))
    with torch.no_grad():
        torch.testing.assert_close(timm_net(_batch()), tv_net(_batch()), rtol=0, atol=1e-5)


def test_the_report_says_structure_and_lists_every_pairing_on_request():
    timm_net, tv_net = (copy.deepcopy(m) for m in _convnexts())
    report = load_partial(tv_net, timm_net.state_dict(), match="structure", dry_run=True)
    lines = str(report).splitlines()
    assert lines[0] == (
        "loaded 182/182 model keys (100.0%): 0 missing, 0 mismatched, 0 unexpected, "
        "0 adapted, 182 renamed (dry run: nothing copied)"
    )
    assert lines[1].startswith("matched by structure: module-tree order and shapes")
    assert lines[2] == "reshaped (18, checkpoint vs model shape):"
    assert lines[3] == "  features.1.0.layer_scale: (96,) vs (96, 1, 1)"
    assert "  ... and 172 more" in lines  # str stays short
    full = report.describe(all_pairs=True).splitlines()
    assert "  head.fc.bias -> classifier.2.bias" in full and len(full) == 2 + 1 + 18 + 1 + 182


# ----------------------------------------------------------------- detectron2 -> torchvision
def _detectron2_resnet(net: nn.Module) -> dict[str, torch.Tensor]:
    """``net``'s weights under detectron2's names and in its order: a block's ``shortcut``
    is registered before ``conv1``, every conv has its (frozen) ``norm`` inside, and
    FrozenBatchNorm2d keeps no num_batches_tracked; no classifier."""
    src = net.state_dict()
    out: dict[str, torch.Tensor] = {}

    def conv(source_conv: str, source_bn: str, name: str) -> None:
        out[f"{name}.weight"] = src[f"{source_conv}.weight"].clone()
        for stat in ("weight", "bias", "running_mean", "running_var"):
            out[f"{name}.norm.{stat}"] = src[f"{source_bn}.{stat}"].clone()

    conv("conv1", "bn1", "stem.conv1")
    for stage in range(4):
        for block in range(len(getattr(net, f"layer{stage + 1}"))):
            source, name = f"layer{stage + 1}.{block}", f"res{stage + 2}.{block}"
            if f"{source}.downsample.0.weight" in src:
                conv(f"{source}.downsample.0", f"{source}.downsample.1", f"{name}.shortcut")
            for i in (1, 2, 3) if f"{source}.conv3.weight" in src else (1, 2):
                conv(f"{source}.conv{i}", f"{source}.bn{i}", f"{name}.conv{i}")
    return out


def _features(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return nn.Sequential(*list(net.children())[:-1])(x)  # up to avgpool: no fc


@functools.cache
def _resnets(name: str) -> tuple[nn.Module, nn.Module]:
    build = getattr(torchvision.models, name)
    return _randomise(build(), 2), _randomise(build(), 3)


def test_a_detectron2_resnet50_loads_into_torchvision_resnet50(tmp_path):
    source, fresh = _resnets("resnet50")
    model = copy.deepcopy(fresh)
    state = _detectron2_resnet(source)
    assert list(state)[5:7] == ["res2.0.shortcut.weight", "res2.0.shortcut.norm.weight"]
    path = tmp_path / "model_final.pth"
    torch.save({"model": state, "iteration": 90000}, path)
    report = load_partial(model, path, match="structure")
    assert report.unexpected == [] and len(report.renamed) == len(state) == 265
    assert report.missing == [
        k for k in model.state_dict() if k.endswith("num_batches_tracked") or k.startswith("fc.")
    ]
    # layer1's conv3 and downsample conv have the same shape (256, 64, 1, 1): the module
    # name (conv3) and the blocks' shapes (the shortcut's run) tell them apart.
    assert report.renamed["res2.0.conv3.weight"] == "layer1.0.conv3.weight"
    assert report.renamed["res2.0.conv3.norm.weight"] == "layer1.0.bn3.weight"
    assert report.renamed["res2.0.shortcut.weight"] == "layer1.0.downsample.0.weight"
    assert report.renamed["res2.0.shortcut.norm.running_var"] == "layer1.0.downsample.1.running_var"
    assert report.renamed["res5.0.shortcut.weight"] == "layer4.0.downsample.0.weight"
    _assert_right_and_equal(model, state, report.renamed, source, fresh)


def test_a_detectron2_resnet18_loads_into_torchvision_resnet18():
    """Basic blocks: a shortcut's norm has the shape of conv1's and conv2's norms, and only
    the convolutions between them fix which is which (four interchangeable BatchNorm
    vectors must not outweigh one convolution)."""
    source, fresh = _resnets("resnet18")
    model = copy.deepcopy(fresh)
    state = _detectron2_resnet(source)
    report = load_partial(model, state, match="structure")
    assert report.num_loaded == len(state) == 100 and report.unexpected == []
    assert report.renamed["res3.0.shortcut.norm.weight"] == "layer2.0.downsample.1.weight"
    assert report.renamed["res3.0.conv1.norm.weight"] == "layer2.0.bn1.weight"
    _assert_right_and_equal(model, state, report.renamed, source, fresh)


def _assert_right_and_equal(model, state, renamed, source, fresh) -> None:
    """Every pair right (not just loaded), and the features equal the source's."""
    loaded = model.state_dict()
    for old, new in renamed.items():
        assert torch.equal(loaded[new], state[old]), (old, new)
    x = _batch()
    features = _features(model, x)
    torch.testing.assert_close(features, _features(source, x), rtol=0, atol=1e-5)
    assert not torch.allclose(features, _features(fresh, x), atol=1e-3)


def test_guards_apply_and_a_failed_guard_copies_nothing():
    source, fresh = _resnets("resnet50")
    state = _detectron2_resnet(source)
    model = copy.deepcopy(fresh)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(LoadError, match="strict load failed: 55 missing"):
        load_partial(model, state, match="structure", strict=True)
    with pytest.raises(LoadError, match=r"2 required key\(s\) not loaded: fc.weight \(missing\)"):
        load_partial(model, state, match="structure", require="fc.*")
    with pytest.raises(LoadError, match=r"only 265/320 model keys \(82.8%\) loaded"):
        load_partial(model, state, match="structure", min_loaded=0.9)
    report = load_partial(model, state, match="structure", dry_run=True, require="layer*.weight")
    assert report.dry_run and report.num_loaded == 265
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing copied
    load_partial(model, state, match="structure", min_loaded=0.8, require="layer*.weight")
    assert torch.equal(model.layer1[0].downsample[0].weight, state["res2.0.shortcut.weight"])


# ------------------------------------------------------------------------ fused and split
class _Fused(nn.Module):
    """Self-attention with torch's fused in-projection (in_proj_weight, in_proj_bias)."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(6, dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head(self.attn(h, h, h, need_weights=False)[0])


class _Split(nn.Module):
    """The same attention with separate q, k, v and output projections, other names."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.stem = nn.Linear(6, dim)
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        b, n, d = h.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = heads(self.query(h)), heads(self.key(h)), heads(self.value(h))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        return self.classifier(self.out(a))


def _tokens() -> torch.Tensor:
    torch.manual_seed(5)
    return torch.randn(2, 7, 6)


def test_split_projections_load_into_a_fused_one(tmp_path):
    split, fused = _randomise(_Split(), 6), _randomise(_Fused(), 7)
    path = tmp_path / "split.pt"
    torch.save(split.state_dict(), path)
    report = load_partial(fused, path, match="structure", strict=True)
    assert report.fused == {
        "attn.in_proj_weight": ["query.weight", "key.weight", "value.weight"],
        "attn.in_proj_bias": ["query.bias", "key.bias", "value.bias"],
    }
    assert report.renamed["out.weight"] == "attn.out_proj.weight"
    assert "fused (2, concatenated along dim 0):" in str(report).splitlines()
    assert "  query.weight + key.weight + value.weight -> attn.in_proj_weight" in str(report)
    with torch.no_grad():
        torch.testing.assert_close(fused(_tokens()), split(_tokens()), rtol=0, atol=1e-5)


def test_a_fused_projection_loads_into_split_ones():
    fused, split = _randomise(_Fused(), 8), _randomise(_Split(), 9)
    report = load_partial(split, fused.state_dict(), match="structure", strict=True)
    assert report.split["query.weight"] == ("attn.in_proj_weight", 0, 3)
    assert report.split["value.bias"] == ("attn.in_proj_bias", 2, 3)
    assert "  attn.in_proj_weight -> key.weight (chunk 2 of 3)" in str(report)
    with torch.no_grad():
        torch.testing.assert_close(split(_tokens()), fused(_tokens()), rtol=0, atol=1e-5)


def test_reshaped_fused_and_split_tensors_load_from_a_file(tmp_path):
    """Reshaped tensors and blocks of rows, copied from a memory-mapped file."""
    fused = _randomise(_Fused(), 10)
    path = tmp_path / "fused.pt"
    torch.save(fused.state_dict(), path)
    split = _Split()
    load_partial(split, path, match="structure", strict=True)
    rows = fused.attn.in_proj_weight.chunk(3)
    assert torch.equal(split.query.weight, rows[0]) and torch.equal(split.key.weight, rows[1])
    assert torch.equal(split.value.weight, rows[2])
    conv, linear = _randomise(nn.Conv2d(4, 5, 1), 11), nn.Linear(4, 5)
    torch.save({f"proj.{k}": v for k, v in conv.state_dict().items()}, path)
    assert load_partial(linear, path, match="structure").reshaped == {
        "weight": ((5, 4, 1, 1), (5, 4))
    }
    assert torch.equal(linear.weight, conv.weight.view(5, 4))


# ------------------------------------------------------------------ small cases and errors
def test_a_1x1_conv_loads_into_a_linear_layer_and_is_reported():
    conv = nn.Sequential(nn.Conv2d(4, 5, 1), nn.Flatten())
    linear = nn.Sequential(nn.Linear(4, 5))
    report = load_partial(linear, conv.state_dict(), match="structure", strict=True)
    assert report.reshaped == {"0.weight": ((5, 4, 1, 1), (5, 4))}
    assert report.renamed == {}  # the names agree here: only the shape differs
    assert torch.equal(linear[0].weight, conv[0].weight.view(5, 4))


def test_names_that_say_nothing_load_by_order_alone_with_their_bookkeeping():
    net = _randomise(torchvision.models.resnet18(), 12)
    state = {f"p{i}": v for i, v in enumerate(net.state_dict().values())}
    model = torchvision.models.resnet18()
    report = load_partial(model, state, match="structure", strict=True)
    assert report.renamed["p5"] == "bn1.num_batches_tracked"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), state.values()))


def test_an_ambiguous_pairing_is_refused_with_its_candidates():
    state = {"a": torch.ones(4), "b": torch.full((4,), 2.0)}
    model = nn.Module()
    model.register_buffer("x", torch.zeros(4))
    with pytest.raises(ValueError, match="is ambiguous") as caught:
        load_partial(model, state, match="structure")
    assert "model 'x' (4,) could be checkpoint 'a' (4,) or 'b' (4,)" in str(caught.value)
    assert "rename" in str(caught.value) and "match='names'" in str(caught.value)
    assert torch.equal(model.x, torch.zeros(4))
    # A rename rule that names the right model key settles it.
    report = load_partial(model, state, match="structure", rename=[("^b$", "x")])
    assert report.unexpected == ["a"] and torch.equal(model.x, state["b"])


def test_crossing_pairs_are_refused():
    state = {"a": torch.zeros(4), "b": torch.zeros(5)}
    model = nn.Module()
    model.register_buffer("y", torch.zeros(5))
    model.register_buffer("x", torch.zeros(4))
    with pytest.raises(ValueError, match=r"'a' \(4,\) -> model 'x' \(4,\) and checkpoint 'b'"):
        load_partial(model, state, match="structure")


def test_tied_weights_load_through_any_of_their_names():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(4, 6, bias=False)
            self.mid = nn.Linear(6, 6)
            self.decode = nn.Linear(4, 6, bias=False)
            self.decode.weight = self.embed.weight

    source = _randomise(Tied(), 13)
    state = {f"net.{k}": v for k, v in source.state_dict().items()}  # both tied names
    model = Tied()
    report = load_partial(model, state, match="structure", strict=True)
    assert report.loaded == ["embed.weight", "mid.weight", "mid.bias", "decode.weight"]
    assert report.unexpected == [] and torch.equal(model.decode.weight, source.embed.weight)


def test_a_safetensors_file_is_refused_its_order_is_by_name(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"b": torch.zeros(2), "a": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="sorted by name") as caught:
        load_partial(nn.Linear(2, 2), path, match="structure")
    assert "dict(read_state_dict(path))" in str(caught.value)


@pytest.mark.parametrize(
    ("match", "error", "message"),
    [
        ("name", ValueError, "match must be one of 'names', 'structure'; got 'name'"),
        (1, TypeError, "match must be str, got int"),
        (None, TypeError, "match must be str, got NoneType"),
    ],
)
def test_match_is_validated(match, error, message):
    with pytest.raises(error, match=message):
        load_partial(nn.Linear(2, 2), nn.Linear(2, 2).state_dict(), match=match)


def test_aligning_two_thousand_tensors_is_fast():
    shapes = [(64,), (64, 64, 3, 3), (128,), (128, 64), (256,)]
    state = {
        f"blocks.{b}.m{t}.weight": torch.empty(shape)
        for b in range(400)
        for t, shape in enumerate(shapes)
    }
    model = {f"layers.{i}.w": tensor for i, tensor in enumerate(state.values())}
    start = time.perf_counter()
    found = match_structure(state, model, {k: k for k in state})
    elapsed = time.perf_counter() - start
    assert len(found.pairs) == 2000
    assert found.pairs["blocks.399.m4.weight"] == "layers.1999.w"
    assert elapsed < 10  # about 0.3 s on a laptop core; generous for a busy CI machine
