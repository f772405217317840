"""`set_grad_checkpointing` and the ``grad_checkpointing`` option of our layers: identical
gradients and BatchNorm statistics, dropout, when it recomputes (and when not), what it
leaves unchanged, export, and bad options. Backbones: tests/backbones/test_backbone_checkpointing.py.

Every gradient comparison is ``torch.equal`` (CPU, float32): the recomputation runs the same
ops on the same inputs, and the backward graph is the one of the plain forward.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import warnings

import pytest
import torch
import torchvision
from torch import nn

import visionblocks._core.checkpointing as ckpt
from tests.helpers import same_buffers, same_tensors
from visionblocks._core.checkpointing import (
    checkpointed_modules,
    is_grad_checkpointing,
    set_grad_checkpointing,
)
from visionblocks.models import FCOSHead
from visionblocks.nn import Involution2d, LocalAttention2d, LocalFilter2d

RESNET_BLOCKS = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]


def _x(channels: int = 3, size: int = 32, batch: int = 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(batch, channels, size, size, generator=gen)


def _step(model: nn.Module, *inputs: torch.Tensor, seed: int = 0) -> list[torch.Tensor]:
    """One training forward and backward; the gradients of the inputs and parameters."""
    model.train().zero_grad()
    inputs = tuple(x.clone().requires_grad_(True) for x in inputs)
    torch.manual_seed(seed)
    out = model(*inputs)
    outs = out.values() if isinstance(out, dict) else [out]
    sum(o.sum() for o in outs if isinstance(o, torch.Tensor)).backward()
    return [x.grad for x in inputs] + [p.grad for p in model.parameters()]


def _resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None)


def _counter(module: nn.Module) -> list[int]:
    """Calls of ``module`` (a forward hook): 2 per training step when it is recomputed."""
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


# ------------------------------------------------------------------ gradients, statistics
def test_resnet18_gradients_and_batchnorm_statistics_are_identical():
    plain, checkpointed = _resnet18(), _resnet18()
    set_grad_checkpointing(checkpointed, RESNET_BLOCKS)
    for _ in range(2):  # the second step uses the statistics the first one updated
        assert same_tensors(_step(plain, _x()), _step(checkpointed, _x()))
        assert same_buffers(plain, checkpointed)
    assert int(checkpointed.layer1[0].bn1.num_batches_tracked) == 2


def test_without_the_recompute_context_batchnorm_statistics_would_differ(monkeypatch):
    # The test above can fail: with checkpoint's default context the recomputation updates
    # the running statistics a second time (and counts the batch twice).
    monkeypatch.setattr(
        ckpt, "_contexts", lambda module: (contextlib.nullcontext(), contextlib.nullcontext())
    )
    plain, checkpointed = _resnet18(), _resnet18()
    set_grad_checkpointing(checkpointed, RESNET_BLOCKS)
    assert same_tensors(_step(plain, _x()), _step(checkpointed, _x()))
    assert not same_buffers(plain, checkpointed)
    assert int(checkpointed.layer1[0].bn1.num_batches_tracked) == 2


def _dropout_net() -> nn.Module:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5))
    return nn.Sequential(block, nn.Conv2d(8, 4, 3), nn.Dropout2d(0.3))


def test_dropout_draws_the_same_masks_in_the_recomputation():
    plain, checkpointed = _dropout_net(), _dropout_net()
    set_grad_checkpointing(checkpointed, ["0", ""])  # nested: the block runs plainly inside
    assert same_tensors(_step(plain, _x()), _step(checkpointed, _x()))
    assert not same_tensors(_step(plain, _x(), seed=0), _step(plain, _x(), seed=1))  # masks matter


def test_without_preserved_rng_state_the_dropout_gradients_would_differ(monkeypatch):
    original = ckpt.checkpoint
    monkeypatch.setattr(
        ckpt, "checkpoint", lambda *a, **kw: original(*a, **{**kw, "preserve_rng_state": False})
    )
    plain, checkpointed = _dropout_net(), _dropout_net()
    set_grad_checkpointing(checkpointed)
    assert not same_tensors(_step(plain, _x()), _step(checkpointed, _x()))


# ------------------------------------------------------------------ when it recomputes
def test_recomputes_only_in_training_with_autograd():
    model = set_grad_checkpointing(_resnet18(), ["layer1"])
    calls = _counter(model.layer1[0].conv1)
    _step(model, _x())
    assert calls[0] == 2  # forward and recomputation
    model.eval()
    model(_x()).sum().backward()
    assert calls[0] == 3  # eval mode: plain
    model.train()
    with torch.no_grad():
        model(_x())
    assert calls[0] == 4  # no autograd: plain
    set_grad_checkpointing(model, False)
    _step(model, _x())
    assert calls[0] == 5


def test_hooks_of_the_checkpointed_module_run_once():
    model = set_grad_checkpointing(_resnet18(), ["layer1"])
    calls = _counter(model.layer1)
    _step(model, _x())
    assert calls[0] == 1


def test_a_checkpointed_module_inside_another_runs_plainly():
    model = set_grad_checkpointing(_resnet18(), ["layer1", "layer1.0"])
    calls = _counter(model.layer1[0].conv1)
    _step(model, _x())
    assert calls[0] == 2  # not 3: layer1.0 is not checkpointed again inside layer1


def test_compile_runs_the_plain_forward():
    plain, checkpointed = _dropout_net().eval(), _dropout_net().eval()  # no dropout
    set_grad_checkpointing(checkpointed, ["0"])
    compiled = torch.compile(checkpointed, backend="aot_eager")
    x = _x()
    torch.testing.assert_close(compiled(x), plain(x), rtol=0, atol=0)
    compiled.train()(x).sum().backward()  # training mode compiles too (plain forward)
    assert checkpointed[0][0].weight.grad is not None


# ------------------------------------------------------------------ what stays unchanged
def test_parameters_state_dict_and_repr_are_unchanged_and_false_restores():
    plain, model = _resnet18(), _resnet18()
    set_grad_checkpointing(model, RESNET_BLOCKS)
    assert checkpointed_modules(model) == RESNET_BLOCKS
    assert list(model.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert repr(model) == repr(plain)
    assert set_grad_checkpointing(model, False) is model
    assert checkpointed_modules(model) == []
    assert all("forward" not in vars(m) for m in model.modules())


def test_an_instance_forward_is_kept_and_restored():
    layer = nn.Linear(3, 3)

    def doubled(x: torch.Tensor) -> torch.Tensor:
        return 2 * nn.Linear.forward(layer, x)

    layer.forward = doubled
    set_grad_checkpointing(layer)
    set_grad_checkpointing(layer)  # twice: still one layer of checkpointing
    x = torch.randn(2, 3, requires_grad=True)
    torch.testing.assert_close(layer(x), 2 * nn.Linear.forward(layer, x))
    set_grad_checkpointing(layer, False)
    assert layer.forward is doubled


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_checkpoint_their_own_modules(how):
    model = set_grad_checkpointing(_resnet18(), RESNET_BLOCKS)
    copied = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert checkpointed_modules(copied) == RESNET_BLOCKS
    assert copied.layer2[1].forward.module is copied.layer2[1]
    calls = _counter(copied.layer2[1].conv1)
    assert same_tensors(_step(copied, _x()), _step(model, _x()))
    assert calls[0] == 2


# ------------------------------------------------------------------ tracing and export
def test_trace_and_export_in_eval_mode():
    model = set_grad_checkpointing(_resnet18(), RESNET_BLOCKS).eval()
    x = _x()
    expected = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated in newer torch
        traced = torch.jit.trace(model, x)
    torch.testing.assert_close(traced(x), expected)
    exported = torch.export.export(model, (x,))
    torch.testing.assert_close(exported.module()(x), expected)


def test_export_of_a_checkpointed_layer_binds_its_arguments_by_name():
    torch.manual_seed(0)
    layer = LocalAttention2d(8, 3, 2, grad_checkpointing=True).eval()
    x = _x(8, 12)
    batch, side = torch.export.Dim("batch"), torch.export.Dim("side", min=4, max=64)
    exported = torch.export.export(
        layer, (), {"x": x}, dynamic_shapes={"x": {0: batch, 2: side, 3: side}}
    )
    torch.testing.assert_close(exported.module()(x=_x(8, 16, 3)), layer(_x(8, 16, 3)))


# ------------------------------------------------------------------ our layers
LAYERS = {
    "local_attention": lambda ck: LocalAttention2d(8, 3, 2, grad_checkpointing=ck),
    "involution": lambda ck: Involution2d(8, 3, stride=2, groups=2, grad_checkpointing=ck),
    "local_filter": lambda ck: LocalFilter2d(8, 3, groups=2, grad_checkpointing=ck),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_option_gives_identical_gradients(name):
    torch.manual_seed(0)
    plain = LAYERS[name](False)
    torch.manual_seed(0)
    checkpointed = LAYERS[name](True)
    assert is_grad_checkpointing(checkpointed) and not is_grad_checkpointing(plain)
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    assert repr(checkpointed) == repr(plain)
    first = next(m for m in checkpointed.modules() if isinstance(m, nn.Conv2d))
    calls = _counter(first)
    for _ in range(2):
        assert same_tensors(_step(plain, _x(8, 11)), _step(checkpointed, _x(8, 11)))
        assert same_buffers(plain, checkpointed)  # Involution2d's BatchNorm
    assert calls[0] == 4


def test_the_recomputation_runs_under_the_forwards_autocast():
    torch.manual_seed(0)
    plain = LAYERS["local_attention"](False)
    torch.manual_seed(0)
    checkpointed = LAYERS["local_attention"](True)
    grads = []
    for model in (plain, checkpointed):
        x = _x(8, 11).requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model.train()(x)
        assert out.dtype == torch.bfloat16
        out.float().sum().backward()  # outside autocast: the recomputation restores it
        grads.append([x.grad] + [p.grad for p in model.parameters()])
    assert same_tensors(*grads)
    assert checkpointed.proj.weight.grad.dtype == torch.float32


def test_fcos_head_checkpoints_its_towers():
    levels = [_x(8, 8), _x(8, 4)]

    def head(ck: bool) -> FCOSHead:
        torch.manual_seed(0)
        return FCOSHead(8, 3, [8, 16], num_convs=2, grad_checkpointing=ck)

    plain, checkpointed = head(False), head(True)
    assert checkpointed_modules(checkpointed) == ["cls_tower", "box_tower"]
    calls = _counter(checkpointed.cls_tower[0])

    def step(model: FCOSHead) -> list[torch.Tensor]:
        model.zero_grad()
        out = model(levels)
        sum(t.sum() for key in ("cls_logits", "boxes") for t in out[key]).backward()
        return [p.grad for p in model.parameters()]

    assert same_tensors(step(plain), step(checkpointed))
    assert calls[0] == 4  # two levels, each forward and recomputation
    assert checkpointed_modules(FCOSHead(8, 3, [8], num_convs=0, grad_checkpointing=True)) == []


# ------------------------------------------------------------------ bad options
@pytest.mark.parametrize(
    ("module", "enable", "error", "match"),
    [
        ("resnet", [1], TypeError, r"enable\[0\] must be a module name"),
        ("resnet", ["layer5"], ValueError, "did you mean 'layer4'"),
        ("resnet", ["layer1", "fc.weight"], ValueError, "names no submodule"),
        ("list", True, ValueError, "ModuleList has no forward"),
        ("script", True, TypeError, "ScriptModule"),
    ],
)
@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.script is deprecated
def test_bad_options_raise_clearly(module, enable, error, match):
    target = {
        "resnet": _resnet18,
        "list": lambda: nn.ModuleList([nn.ReLU()]),
        "script": lambda: torch.jit.script(nn.ReLU()),
    }[module]()
    with pytest.raises(error, match=match):
        set_grad_checkpointing(target, enable)
    if isinstance(target, nn.Module):
        assert checkpointed_modules(target) == []  # nothing half-done
