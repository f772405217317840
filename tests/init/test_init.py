"""Tests for visionblocks.init: group-aware fans, initializers, init_weights rules, zero-init."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision
from torch import nn
from torch.nn.utils import parametrize

from visionblocks.init import (
    bias_init_with_prob,
    c2_msra_fill,
    c2_xavier_fill,
    compute_fans,
    constant_init,
    init_weights,
    kaiming_init,
    normal_init,
    trunc_normal_init,
    xavier_init,
    zero_init_last_norm,
)
from visionblocks.registry import INITIALIZERS

# Layers of every kind the initializers must handle, with groups where they exist.
LAYERS = {
    "linear": lambda: nn.Linear(48, 24),
    "conv1d": lambda: nn.Conv1d(12, 24, 3, groups=3),
    "conv2d": lambda: nn.Conv2d(64, 128, 3, groups=4),
    "depthwise2d": lambda: nn.Conv2d(64, 64, 3, groups=64),
    "conv3d": lambda: nn.Conv3d(8, 16, (1, 2, 3), groups=2),
    "convT1d": lambda: nn.ConvTranspose1d(12, 6, 3, groups=3),
    "convT2d": lambda: nn.ConvTranspose2d(64, 128, 3, groups=4),
    "convT3d": lambda: nn.ConvTranspose3d(8, 4, 2),
    "deform2d": lambda: torchvision.ops.DeformConv2d(8, 16, 3, groups=2),
}


def _in_out(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return module.in_channels, module.out_channels


def _oracle_fans(module: nn.Module) -> tuple[int, int]:
    """Connections per output channel (fan_in) and per input channel (fan_out)."""
    cin, cout = _in_out(module)
    n = module.weight.numel()
    return n // cout, n // cin


# ---------------------------------------------------------------------------- fans
@pytest.mark.parametrize("kind", list(LAYERS))
def test_compute_fans_counts_real_connections(kind):
    module = LAYERS[kind]()
    assert compute_fans(module) == _oracle_fans(module)


def test_compute_fans_documented_numbers():
    depthwise = nn.Conv2d(64, 64, 3, groups=64)
    assert compute_fans(depthwise) == (9, 9)
    assert nn.init._calculate_fan_in_and_fan_out(depthwise.weight) == (9, 576)
    # transposed: torch reads (in, out) as (out, in) even without groups
    convt = nn.ConvTranspose2d(8, 4, 2)
    assert compute_fans(convt) == (32, 16)
    assert nn.init._calculate_fan_in_and_fan_out(convt.weight) == (16, 32)


# ---------------------------------------------------------------------------- statistics
def _empirical_std(weight: torch.Tensor) -> float:
    return weight.detach().double().std().item()


@pytest.mark.parametrize("distribution", ["normal", "uniform"])
@pytest.mark.parametrize("mode", ["fan_in", "fan_out"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Conv2d(4096, 4096, 5, groups=4096),  # depthwise, 102400 weights
        lambda: nn.Conv2d(256, 512, 3, groups=8),
        lambda: nn.ConvTranspose2d(512, 256, 3, groups=16),
        lambda: nn.Conv1d(128, 256, 7, groups=4),
        lambda: nn.ConvTranspose3d(64, 32, 3, groups=2),
        lambda: nn.Linear(400, 300),
    ],
    ids=["depthwise2d", "grouped2d", "convT2d", "conv1d", "convT3d", "linear"],
)
def test_kaiming_std_matches_group_aware_fan(make, mode, distribution):
    module = make()
    fan_in, fan_out = _oracle_fans(module)
    fan = fan_in if mode == "fan_in" else fan_out
    kaiming_init(module, mode=mode, distribution=distribution)
    expected = math.sqrt(2.0 / fan)
    assert _empirical_std(module.weight) == pytest.approx(expected, rel=0.04)
    if distribution == "uniform":
        assert module.weight.abs().max().item() <= math.sqrt(3.0) * expected * (1 + 1e-6)
    assert torch.count_nonzero(module.bias) == 0


def test_torch_kaiming_is_wrong_for_depthwise_fan_out():
    """The statistical test above can fail: torch's own init misses by sqrt(channels)."""
    ours = nn.Conv2d(4096, 4096, 5, groups=4096)
    kaiming_init(ours, mode="fan_out")
    theirs = nn.Conv2d(4096, 4096, 5, groups=4096)
    nn.init.kaiming_normal_(theirs.weight, mode="fan_out", nonlinearity="relu")
    expected = math.sqrt(2.0 / 25)
    assert _empirical_std(ours.weight) == pytest.approx(expected, rel=0.03)
    assert _empirical_std(theirs.weight) == pytest.approx(expected / 64, rel=0.03)
    assert _empirical_std(theirs.weight) != pytest.approx(expected, rel=0.5)


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
def test_xavier_std_grouped_and_transposed(distribution):
    module = nn.ConvTranspose2d(512, 256, 3, groups=16)
    fan_in, fan_out = _oracle_fans(module)  # 288, 144
    xavier_init(module, gain=2.0, distribution=distribution)
    expected = 2.0 * math.sqrt(2.0 / (fan_in + fan_out))
    assert _empirical_std(module.weight) == pytest.approx(expected, rel=0.04)


def test_c2_fills_std_on_depthwise():
    conv = nn.Conv2d(4096, 4096, 5, groups=4096)
    c2_msra_fill(conv)
    assert _empirical_std(conv.weight) == pytest.approx(math.sqrt(2.0 / 25), rel=0.03)
    c2_xavier_fill(conv)
    assert _empirical_std(conv.weight) == pytest.approx(1.0 / 5.0, rel=0.03)
    assert conv.weight.abs().max().item() <= math.sqrt(3.0) / 5.0 + 1e-6


# ---------------------------------------------------------------------------- torch / fvcore parity
def _same_draw(ours, theirs, make, seed=7):
    a, b = make(), make()
    torch.manual_seed(seed)
    ours(a)
    torch.manual_seed(seed)
    theirs(b.weight)
    assert torch.equal(a.weight, b.weight)
    return a


@pytest.mark.parametrize(
    "make", [lambda: nn.Conv2d(16, 32, 3), lambda: nn.Linear(20, 10), lambda: nn.Conv3d(4, 6, 2)]
)
def test_c2_fills_equal_fvcore_semantics_for_ungrouped(make):
    # fvcore: c2_msra_fill = kaiming_normal_(fan_out, relu); c2_xavier_fill = kaiming_uniform_(a=1)
    a = _same_draw(
        c2_msra_fill,
        lambda w: nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu"),
        make,
    )
    assert torch.count_nonzero(a.bias) == 0
    a = _same_draw(c2_xavier_fill, lambda w: nn.init.kaiming_uniform_(w, a=1), make)
    assert torch.count_nonzero(a.bias) == 0


@pytest.mark.parametrize("mode", ["fan_in", "fan_out"])
@pytest.mark.parametrize("distribution", ["normal", "uniform"])
def test_kaiming_and_xavier_equal_torch_for_ungrouped(mode, distribution):
    make = lambda: nn.Conv2d(8, 16, 3)  # noqa: E731
    torch_kaiming = (
        nn.init.kaiming_normal_ if distribution == "normal" else nn.init.kaiming_uniform_
    )
    _same_draw(
        lambda m: kaiming_init(
            m, a=0.1, mode=mode, nonlinearity="leaky_relu", distribution=distribution
        ),
        lambda w: torch_kaiming(w, a=0.1, mode=mode, nonlinearity="leaky_relu"),
        make,
    )
    torch_xavier = nn.init.xavier_normal_ if distribution == "normal" else nn.init.xavier_uniform_
    _same_draw(
        lambda m: xavier_init(m, gain=1.5, distribution=distribution),
        lambda w: torch_xavier(w, gain=1.5),
        make,
    )


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")  # fvcore
def test_c2_fills_against_fvcore():
    from fvcore.nn import weight_init

    for ours, theirs in (
        (c2_msra_fill, weight_init.c2_msra_fill),
        (c2_xavier_fill, weight_init.c2_xavier_fill),
    ):
        a, b = nn.Conv2d(8, 16, 3), nn.Conv2d(8, 16, 3)
        torch.manual_seed(3)
        ours(a)
        torch.manual_seed(3)
        theirs(b)
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


# ---------------------------------------------------------------------------- simple initializers
def test_constant_exact_and_bias():
    bn = nn.BatchNorm2d(5)
    constant_init(bn, 0.25, bias=-1.5)
    assert torch.equal(bn.weight, torch.full((5,), 0.25))
    assert torch.equal(bn.bias, torch.full((5,), -1.5))


def test_normal_statistics():
    fc = nn.Linear(500, 400)
    normal_init(fc, mean=0.5, std=0.02, bias=0.3)
    assert fc.weight.double().mean().item() == pytest.approx(0.5, abs=1e-3)
    assert _empirical_std(fc.weight) == pytest.approx(0.02, rel=0.02)
    assert torch.allclose(fc.bias, torch.full((400,), 0.3))


def test_trunc_normal_bounds_and_std():
    fc = nn.Linear(300, 200)
    trunc_normal_init(fc, mean=0.1, std=1.0, a=-0.4, b=0.6)
    assert fc.weight.min().item() >= -0.4 and fc.weight.max().item() <= 0.6
    # truncated to +-0.5 std around the mean: nearly uniform, std ~ 1 / sqrt(12)
    assert _empirical_std(fc.weight) == pytest.approx(0.2877, rel=0.03)
    trunc_normal_init(fc, std=0.02)  # default bounds +-2 are far out: plain normal
    assert _empirical_std(fc.weight) == pytest.approx(0.02, rel=0.02)


def test_bias_none_leaves_bias_and_missing_bias_is_fine():
    conv = nn.Conv2d(3, 4, 3)
    before = conv.bias.detach().clone()
    kaiming_init(conv, bias=None)
    assert torch.equal(conv.bias, before)
    kaiming_init(nn.Conv2d(3, 4, 3, bias=False))  # no bias: only the weight
    xavier_init(conv, bias=2)
    assert torch.equal(conv.bias, torch.full((4,), 2.0))


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning")
def test_empty_weight_is_a_noop():
    fc = nn.Linear(0, 4)
    kaiming_init(fc, bias=1.0)
    xavier_init(fc, bias=1.0)
    assert torch.equal(fc.bias, torch.ones(4))


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "fn", [kaiming_init, xavier_init, normal_init, trunc_normal_init, c2_msra_fill, c2_xavier_fill]
)
def test_module_without_weight_raises_type_error(fn):
    with pytest.raises(TypeError, match="ReLU has no weight"):
        fn(nn.ReLU())
    with pytest.raises(TypeError, match="BatchNorm2d has weight=None"):
        fn(nn.BatchNorm2d(4, affine=False))
    with pytest.raises(TypeError, match="expects an nn.Module"):
        fn(torch.zeros(3, 3))


def test_constant_without_weight_raises():
    with pytest.raises(TypeError, match="ReLU has no weight"):
        constant_init(nn.ReLU(), 1.0)


def test_integer_weights_are_refused():
    # fill_ would truncate 0.5 to 0 without a word
    layer = nn.Linear(2, 2)
    layer.weight = nn.Parameter(torch.ones(2, 2, dtype=torch.int64), requires_grad=False)
    with pytest.raises(
        TypeError, match="floating-point weights, but the weight of Linear has dtype torch.int64"
    ):
        constant_init(layer, 0.5)
    assert bool((layer.weight == 1).all())


@pytest.mark.parametrize(
    "fn", [kaiming_init, xavier_init, c2_msra_fill, c2_xavier_fill, compute_fans]
)
def test_fan_initializers_reject_1d_weights(fn):
    with pytest.raises(
        ValueError, match=r"at least 2 dimensions.*BatchNorm2d has weight of shape \(4,\)"
    ):
        fn(nn.BatchNorm2d(4))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: kaiming_init(m, mode="fan_avg"), ValueError, "mode must be one of"),
        (lambda m: kaiming_init(m, nonlinearity="gelu"), ValueError, "nonlinearity must be one of"),
        (
            lambda m: kaiming_init(m, distribution="trunc"),
            ValueError,
            "distribution must be one of",
        ),
        (lambda m: kaiming_init(m, a="0.1"), TypeError, "a must be a real number"),
        (lambda m: kaiming_init(m, bias=True), TypeError, "bias must be a real number"),
        (lambda m: xavier_init(m, gain=float("nan")), ValueError, "gain must not be NaN"),
        (lambda m: normal_init(m, std=-1.0), ValueError, "std must be in"),
        (lambda m: trunc_normal_init(m, std=0.0), ValueError, "std must be in"),
        (lambda m: trunc_normal_init(m, a=1.0, b=1.0), ValueError, "a < b"),
        (lambda m: constant_init(m, "1"), TypeError, "val must be a real number"),
    ],
)
def test_bad_arguments_raise_and_leave_module_untouched(call, error, match):
    conv = nn.Conv2d(3, 4, 3)
    before = [p.detach().clone() for p in conv.parameters()]
    with pytest.raises(error, match=match):
        call(conv)
    assert all(torch.equal(a, b) for a, b in zip(before, conv.parameters()))


def test_lazy_and_parametrized_weights_raise():
    with pytest.raises(ValueError, match="lazy parameter"):
        kaiming_init(nn.LazyConv2d(4, 3))
    conv = nn.Conv2d(3, 4, 3)

    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    parametrize.register_parametrization(conv, "weight", Double())
    with pytest.raises(ValueError, match="parametrization"):
        normal_init(conv)


# ---------------------------------------------------------------------------- bias_init_with_prob
@pytest.mark.parametrize("p", [1e-6, 0.01, 0.3, 0.5, 0.9, 0.999])
def test_bias_init_with_prob(p):
    b = bias_init_with_prob(p)
    assert isinstance(b, float)
    assert b == pytest.approx(-math.log((1 - p) / p), rel=1e-12, abs=1e-12)
    assert torch.sigmoid(torch.tensor(b, dtype=torch.float64)).item() == pytest.approx(p, rel=1e-12)


@pytest.mark.parametrize(
    ("p", "error"),
    [
        (0.0, ValueError),
        (1.0, ValueError),
        (True, TypeError),
    ],
)
def test_bias_init_with_prob_rejects(p, error):
    with pytest.raises(error, match="prior_prob"):
        bias_init_with_prob(p)


# ---------------------------------------------------------------------------- registry
@pytest.mark.parametrize(
    ("name", "fn"),
    [
        ("kaiming", kaiming_init),
        ("xavier", xavier_init),
        ("normal", normal_init),
        ("trunc_normal", trunc_normal_init),
        ("constant", constant_init),
        ("c2_msra", c2_msra_fill),
        ("c2_xavier", c2_xavier_fill),
        ("zero_init_last_norm", zero_init_last_norm),
        ("zero_last_norm", zero_init_last_norm),
    ],
)
def test_registered(name, fn):
    assert INITIALIZERS.get(name) is fn
    assert name in INITIALIZERS.list() or name in INITIALIZERS.aliases("zero_init_last_norm")


def test_registry_contract_call():
    bn = nn.BatchNorm1d(3)
    INITIALIZERS.get("constant")(bn, val=0.5)
    assert torch.equal(bn.weight, torch.full((3,), 0.5))


# ---------------------------------------------------------------------------- init_weights
def _net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Sequential(nn.Conv2d(8, 8, 3, groups=8), nn.BatchNorm2d(8, affine=False)),
        nn.Flatten(),
        nn.Linear(8, 2),
    )


def _fill(model: nn.Module) -> dict[str, float]:
    return {
        n: m.weight.flatten()[0].item()
        for n, m in model.named_modules()
        if getattr(m, "weight", None) is not None
    }


def test_rule_without_filters_matches_every_weighted_module():
    model = _net()
    report = init_weights(model, [{"type": "constant", "val": 0.5}])
    assert report == dict.fromkeys(["0", "1", "3.0", "5"], "rules[0] constant(val=0.5)")
    assert _fill(model) == dict.fromkeys(["0", "1", "3.0", "5"], 0.5)


def test_later_rules_win():
    rules = [
        {"type": "constant", "val": 1.0},
        {"type": "constant", "val": 2.0, "layer": "Conv2d"},
        {"type": "constant", "val": 3.0, "name": r"3\..*", "bias": None},
    ]
    model = _net()
    report = init_weights(model, rules)
    assert _fill(model) == {"0": 2.0, "1": 1.0, "3.0": 3.0, "5": 1.0}
    assert report["3.0"] == "rules[2] constant(val=3.0, bias=None)"
    assert report["0"] == "rules[1] constant(val=2.0)"
    model = _net()
    init_weights(model, rules[::-1])  # the catch-all now comes last and wins everywhere
    assert _fill(model) == dict.fromkeys(["0", "1", "3.0", "5"], 1.0)


def test_layer_forms_and_base_classes():
    model = _net()
    init_weights(model, [{"type": "constant", "val": 4.0, "layer": [nn.Linear, "BatchNorm2d"]}])
    assert _fill(model)["5"] == 4.0 and _fill(model)["1"] == 4.0 and _fill(model)["0"] != 4.0
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1), nn.ConvTranspose2d(4, 4, 2), nn.Conv1d(2, 2, 1), nn.Linear(2, 2)
    )
    report = init_weights(model, {"type": "constant", "val": 0.0, "layer": "_ConvNd"})
    assert list(report) == ["0", "1", "2"]


def test_name_is_fullmatch():
    model = nn.Sequential()
    model.add_module("conv1", nn.Conv2d(1, 1, 1))
    model.add_module("conv10", nn.Conv2d(1, 1, 1))
    report = init_weights(model, [{"type": "constant", "val": 0.0, "name": "conv1"}])
    assert list(report) == ["conv1"]
    assert model.conv10.weight.item() != 0.0


def test_shared_modules_once_and_callable_type():
    conv = nn.Conv2d(2, 2, 1)
    model = nn.Sequential(conv, conv)
    calls = []
    report = init_weights(model, [{"type": lambda m, val: calls.append(val), "val": 1}])
    assert calls == [1] and list(report) == ["0"]


def test_same_seed_same_result():
    results = []
    for _ in range(2):
        torch.manual_seed(11)
        model = _net()
        init_weights(
            model,
            [
                {"type": "kaiming", "layer": ["Conv2d", "Linear"]},
                {"type": "normal", "layer": "BatchNorm2d", "std": 0.1},
            ],
        )
        results.append(torch.cat([p.flatten() for p in model.parameters()]))
    assert torch.equal(*results)


def test_kaiming_rule_is_group_aware():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4096, 4096, 5, groups=4096))
    init_weights(model, [{"type": "kaiming", "mode": "fan_out"}])
    assert _empirical_std(model[0].weight) == pytest.approx(math.sqrt(2 / 25), rel=0.03)


@pytest.mark.parametrize(
    ("rules", "error", "match"),
    [
        (
            [{"type": "kaimng"}],
            ValueError,
            r"rules\[0\]: 'kaimng' is not in the initializers registry. Did you mean: 'kaiming'",
        ),
        ([{"val": 1.0}], ValueError, r"rules\[0\] has no 'type' key"),
        (
            [{"type": "constant", "val": 1.0, "std": 2}],
            ValueError,
            r"unknown keys \['std'\] for initializer 'constant'",
        ),
        ([{"type": "constant"}], ValueError, r"missing a required argument: 'val'"),
        (
            [{"type": "normal", "layer": "Conv2D"}],
            ValueError,
            r"layer 'Conv2D' is neither.*Did you mean: 'Conv2d'",
        ),
        (
            [{"type": "normal", "layer": 3}],
            TypeError,
            r"'layer' entries must be class names or classes",
        ),
        ([{"type": "normal", "layer": []}], ValueError, r"empty list"),
        ([{"type": "normal", "name": "conv["}], ValueError, r"not a valid regex"),
        ([{"type": "normal", "name": 0}], TypeError, r"'name' must be a regex string"),
        (
            [{"type": "normal", "name": "head"}],
            ValueError,
            r"pattern 'head' selects no module with a weight",
        ),
        ([{"type": 1.5}], TypeError, r"'type' must be an initializer name or a callable"),
        (["constant"], TypeError, r"rules\[0\] must be a dict"),
        (
            [{"type": "kaiming", "layer": "Conv2d", "mode": "x"}],
            ValueError,
            r"rules\[0\] kaiming\(mode='x'\) failed on module '0' \(Conv2d\): mode must be one of",
        ),
        (
            [{"type": "kaiming"}],
            ValueError,
            r"failed on module '1' \(BatchNorm2d\).*at least 2 dimensions",
        ),
    ],
)
def test_init_weights_errors(rules, error, match):
    model = _net()
    with pytest.raises(error, match=match):
        init_weights(model, rules)


def test_rule_checks_happen_before_any_weight_is_touched():
    model = _net()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"rules\[1\]"):
        init_weights(
            model, [{"type": "constant", "val": 0.0}, {"type": "constant", "val": 1.0, "bad": 1}]
        )
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_init_weights_rejects_non_module():
    with pytest.raises(TypeError, match="model must be Module"):
        init_weights([nn.Linear(1, 1)], [])


# ---------------------------------------------------------------------------- zero_init_last_norm
def _norm_weights(model: nn.Module, suffix: str) -> list[torch.Tensor]:
    return [m.weight for n, m in model.named_modules() if n.endswith(suffix)]


@pytest.mark.parametrize(
    ("arch", "last", "blocks"), [("resnet18", "bn2", 8), ("resnet50", "bn3", 16)]
)
def test_zero_init_last_norm_torchvision(arch, last, blocks):
    model = getattr(torchvision.models, arch)(weights=None)
    assert all(torch.equal(w, torch.ones_like(w)) for w in _norm_weights(model, last))
    handled = zero_init_last_norm(model)
    assert len(handled) == blocks and handled[0] == "layer1.0"
    assert all(torch.count_nonzero(w) == 0 for w in _norm_weights(model, last))
    assert all(
        torch.equal(w, torch.ones_like(w)) for w in _norm_weights(model, "bn1")
    )  # others kept
    if arch == "resnet18":
        model.eval()
        x = torch.randn(2, 64, 16, 16)
        block = model.layer1[0]  # identity shortcut
        torch.testing.assert_close(block(x), torch.relu(x))
        block = model.layer2[0]  # downsample shortcut
        torch.testing.assert_close(block(x), torch.relu(block.downsample(x)))


def test_zero_init_last_norm_timm():
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet18", pretrained=False, zero_init_last=False)
    assert all(torch.equal(w, torch.ones_like(w)) for w in _norm_weights(model, "bn2"))
    handled = zero_init_last_norm(model)
    assert len(handled) == 8
    assert all(torch.count_nonzero(w) == 0 for w in _norm_weights(model, "bn2"))
    assert all(torch.count_nonzero(w) > 0 for w in _norm_weights(model, "bn1"))


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.branch = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))

    def forward(self, x):
        return x + self.branch(self.conv(x))


def test_protocol_forms():
    class ByName(_Residual):
        last_norm = "branch.1"

    class ByProperty(_Residual):
        @property
        def last_norm(self):
            return self.branch[1]

    class ByMethod(_Residual):
        last_norm = "conv"  # ignored: zero_init_last() takes precedence

        def zero_init_last(self):
            nn.init.zeros_(self.branch[1].weight)

    model = nn.Sequential(ByName(), ByProperty(), ByMethod(), nn.BatchNorm2d(4))
    assert zero_init_last_norm(model) == ["0", "1", "2"]
    for block in model[:3]:
        assert torch.count_nonzero(block.branch[1].weight) == 0
        assert torch.count_nonzero(block.conv.weight) > 0
    assert torch.equal(model[3].weight, torch.ones(4))
    x = torch.randn(1, 4, 5, 5)
    assert torch.equal(model[0](x), x)
    assert zero_init_last_norm(nn.Sequential(nn.Conv2d(1, 1, 1))) == []


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (3, TypeError, "last_norm must be a submodule name or the norm module"),
        ("nope", ValueError, "last_norm='nope' names no submodule"),
        ("conv.weight", ValueError, "names no submodule"),
    ],
)
def test_protocol_errors(value, error, match):
    block = _Residual()
    block.last_norm = value
    with pytest.raises(error, match=match):
        zero_init_last_norm(block)


def test_protocol_norm_without_weight():
    block = _Residual()
    block.branch[1] = nn.BatchNorm2d(4, affine=False)
    block.last_norm = "branch.1"
    with pytest.raises(ValueError, match="has no affine weight"):
        zero_init_last_norm(block)


def test_zero_init_last_norm_as_a_rule_runs_after_weight_rules():
    """A block rule zeroes the last norms even when a later weight rule sets every norm."""
    model = torchvision.models.resnet18()
    report = init_weights(
        model,
        [
            {"type": "zero_init_last_norm"},
            {"type": "constant", "layer": "BatchNorm2d", "val": 1.0},
        ],
    )
    blocks = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert all(report[b] == "rules[0] zero_init_last_norm()" for b in blocks)
    assert report["bn1"] == "rules[1] constant(val=1.0)"
    for i in range(1, 5):
        for block in getattr(model, f"layer{i}"):
            assert torch.count_nonzero(block.bn2.weight) == 0
            assert torch.equal(block.bn1.weight, torch.ones_like(block.bn1.weight))


def test_zero_init_last_norm_rule_scoped_by_layer_and_name():
    model = torchvision.models.resnet50()
    report = init_weights(model, [{"type": "zero_last_norm", "name": r"layer4\..*"}])
    assert sorted(report) == ["layer4.0", "layer4.1", "layer4.2"]
    assert torch.count_nonzero(model.layer4[2].bn3.weight) == 0
    assert torch.count_nonzero(model.layer3[0].bn3.weight) > 0
    report = init_weights(model, [{"type": "zero_init_last_norm", "layer": "Bottleneck"}])
    assert len(report) == 16 and torch.count_nonzero(model.layer1[0].bn3.weight) == 0
    with pytest.raises(ValueError, match="selects no module"):
        init_weights(model, [{"type": "zero_init_last_norm", "name": "nothing_here"}])
    with pytest.raises(ValueError, match="unknown keys"):
        init_weights(model, [{"type": "zero_init_last_norm", "val": 0.0}])


# ------------------------------------------------------------------- issue 19: messages, hangs
@pytest.mark.parametrize("fn", [c2_msra_fill, c2_xavier_fill])
def test_c2_fills_name_themselves_in_errors(fn):
    for bad, error in (
        (nn.ReLU(), TypeError),
        ("conv", TypeError),
        (nn.BatchNorm2d(4), ValueError),
    ):
        with pytest.raises(error, match=fn.__name__) as info:
            fn(bad)
        assert "kaiming_init" not in str(info.value)
    with pytest.raises(TypeError, match=f"{fn.__name__} expects an nn.Module as module"):
        fn("conv")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mean": 100.0, "a": -2.0, "b": 2.0},  # torch's rejection sampler never ends
        {"mean": 0.0, "std": 1.0, "a": 8.0, "b": 9.0},  # float32 tail: every value the bound
        {"mean": -1.0, "std": 1e-4, "a": -0.99, "b": 5.0},  # accepting 1 proposal in 10**5
    ],
)
def test_trunc_normal_refuses_intervals_outside_the_distribution(kwargs):
    from tests.conformance.framework import time_limit

    fc = nn.Linear(4, 4)
    with time_limit(10), pytest.raises(ValueError, match=r"lies \(almost\) entirely outside"):
        trunc_normal_init(fc, **kwargs)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: normal_init(m, std=float("inf")), "std must be finite"),
        (lambda m: trunc_normal_init(m, b=float("inf")), "b must be finite"),
        (lambda m: constant_init(m, float("inf")), "val must be finite"),
    ],
)
def test_non_finite_and_out_of_range_options_raise(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(nn.Conv2d(3, 4, 3))
