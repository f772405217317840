"""ModelEMA: equal to timm's ModelEmaV3 (timm/utils/model_ema.py) and, with ``tau``, to
ultralytics' ModelEMA (ultralytics/utils/torch_utils.py) on the same steps; resumes from its
state dict; unwraps DDP and torch.compile."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torchvision
from timm.utils.model_ema import ModelEmaV3
from torch import nn

from visionblocks.training import ModelEMA, convert_sync_batchnorm


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 4, 1, bias=False), nn.BatchNorm2d(4, momentum=None), nn.Flatten(),
        nn.Linear(4 * 6 * 6, 5),
    )  # fmt: skip


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(108, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3))


def _resnet() -> nn.Module:
    return torchvision.models.resnet18(num_classes=7)


MODELS = {"cnn": _cnn, "mlp": _mlp, "resnet18": _resnet}
SHAPES = {"cnn": (4, 3, 6, 6), "mlp": (4, 108), "resnet18": (2, 3, 32, 32)}


def _train_step(model: nn.Module, gen: torch.Generator, shape=SHAPES["cnn"]) -> None:
    """Change the weights (a noisy step) and the BatchNorm statistics (a train forward)."""
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        model.train()(torch.randn(shape, generator=gen).to(dtype))
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype), alpha=0.1)


def _assert_same_state(ours: nn.Module, ref: nn.Module) -> None:
    a, b = ours.state_dict(), ref.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


OPTIONS = {
    "fixed": {},
    "warmup": {"use_warmup": True},
    "warmup-options": {
        "use_warmup": True, "warmup_gamma": 3.0, "warmup_power": 0.75, "min_decay": 0.4,
    },
    "exclude-buffers": {"exclude_buffers": True, "update_after_step": 2},
    "warmup-exclude": {"use_warmup": True, "exclude_buffers": True, "decay": 0.8},
}  # fmt: skip
CASES = [
    pytest.param(name, OPTIONS[key], with_step, id=f"{name}-{key}-{with_step}")
    for name in ("cnn", "mlp")
    for key in OPTIONS
    for with_step in (True, False)
] + [pytest.param("resnet18", {}, True, id="resnet18", marks=pytest.mark.slow)]


@pytest.mark.parametrize(("name", "options", "with_step"), CASES)
def test_equals_timm_model_ema_v3(name, options, with_step):
    torch.manual_seed(0)
    model = MODELS[name]()
    options = {"decay": 0.9, **options}
    ours, ref = ModelEMA(model, **options), ModelEmaV3(model, **options)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        _train_step(model, gen, SHAPES[name])
        ours.update(model, step if with_step else None)
        ref.update(model, step if with_step else None)
        assert ours.get_decay(step if with_step else None) == ref.get_decay(
            step if with_step else None
        )
        _assert_same_state(ours.module, ref.module)
    assert ours.updates == 6
    changed = [
        k for k, v in ours.module.state_dict().items() if not torch.equal(v, model.state_dict()[k])
    ]
    assert changed  # an average, not a copy


def test_warmup_ramp_values():
    ema = ModelEMA(nn.Linear(1, 1), 0.999, use_warmup=True, update_after_step=1, min_decay=0.1)
    assert [ema.get_decay(s) for s in (0, 1, 2)] == [0.0, 0.0, 0.0]
    assert ema.get_decay(3) == max(1 - 2 ** (-2 / 3), 0.1)
    assert ema.get_decay(10**9) == 0.999 and ema.get_decay(None) == 0.999


@pytest.mark.parametrize(
    ("dtype", "ema_dtype", "exclude_buffers"),
    [(torch.float16, None, False), (torch.float16, torch.float32, False),
     (torch.bfloat16, torch.float32, False), (torch.float64, None, False),
     # copied buffers of another floating dtype are converted, as timm's copy does
     (torch.float16, torch.float32, True)],
)  # fmt: skip
def test_low_precision_models_equal_timm(dtype, ema_dtype, exclude_buffers):
    torch.manual_seed(0)
    model = _cnn().to(dtype)
    options = {"dtype": ema_dtype, "use_warmup": True, "exclude_buffers": exclude_buffers}
    ours, ref = ModelEMA(model, 0.95, **options), ModelEmaV3(model, 0.95, **options)
    gen = torch.Generator().manual_seed(2)
    for step in range(5):
        _train_step(model, gen)
        ours.update(model, step)
        ref.update(model, step)
    _assert_same_state(ours.module, ref.module)
    assert next(ours.module.parameters()).dtype == (ema_dtype or dtype)


def test_bfloat16_ema_rounds_to_nearest_like_timm_without_stochastic_rounding():
    torch.manual_seed(0)
    model = _mlp().to(torch.bfloat16)
    ours = ModelEMA(model, 0.9)
    ref = ModelEmaV3(model, 0.9, stochastic_rounding=False)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        _train_step(model, gen, SHAPES["mlp"])
        ours.update(model)
        ref.update(model)
    _assert_same_state(ours.module, ref.module)


def test_device_option_equals_timm():
    torch.manual_seed(0)
    model = _cnn()
    ours, ref = ModelEMA(model, 0.9, device="cpu"), ModelEmaV3(model, 0.9, device="cpu")
    gen = torch.Generator().manual_seed(4)
    for step in range(3):
        _train_step(model, gen)
        ours.update(model, step)
        ref.update(model, step)
    _assert_same_state(ours.module, ref.module)
    assert ours.device == torch.device("cpu")


def test_module_is_an_eval_copy_without_grads_and_forward_runs_it():
    model = _cnn().train()
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    ema = ModelEMA(model)
    assert ema.module is not model and not ema.module.training and model.training
    assert all(not p.requires_grad and p.grad is None for p in ema.module.parameters())
    assert all(p.requires_grad for p in model.parameters())
    x = torch.randn(2, 3, 6, 6)
    assert torch.equal(ema(x), ema.module(x)) and torch.equal(ema(x), model.eval()(x))
    with torch.no_grad():
        ema.module[0].weight.add_(1.0)
    assert not torch.equal(ema.module[0].weight, model[0].weight)  # no shared storage


def test_state_dict_round_trip_resumes_the_run(tmp_path):
    torch.manual_seed(0)
    model = _cnn()
    ema = ModelEMA(model, 0.9, tau=3.0)
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        _train_step(model, gen)
        ema.update(model)
    torch.save(ema.state_dict(), tmp_path / "ema.pt")
    state = torch.load(tmp_path / "ema.pt")  # weights_only: the count is a plain dict
    timm_keys = set(ModelEmaV3(model).state_dict())
    assert set(state) == timm_keys | {"_extra_state"}
    resumed = ModelEMA(_cnn(), 0.9, tau=3.0)
    resumed.load_state_dict(state)
    assert resumed.updates == 3
    _assert_same_state(resumed.module, ema.module)
    for _ in range(2):
        _train_step(model, gen)
        ema.update(model)
        resumed.update(model)
    _assert_same_state(resumed.module, ema.module)
    assert resumed.updates == ema.updates == 5
    ModelEmaV3(_cnn()).load_state_dict({k: v for k, v in state.items() if k != "_extra_state"})


def test_tau_ramp_equals_ultralytics_model_ema():
    pytest.importorskip("ultralytics")
    from ultralytics.utils.torch_utils import ModelEMA as UltralyticsEMA

    torch.manual_seed(0)
    model = _cnn()
    ours, ref = ModelEMA(model, 0.99, tau=4), UltralyticsEMA(model, 0.99, tau=4)
    gen = torch.Generator().manual_seed(6)
    for n in range(1, 6):
        _train_step(model, gen)
        ours.update(model)
        ref.update(model)
        assert ours.get_decay() == ref.decay(n) == 0.99 * (1 - math.exp(-n / 4))
        theirs = ref.ema.state_dict()
        for key, value in ours.module.state_dict().items():
            if value.is_floating_point():
                assert torch.equal(value, theirs[key]), key
            else:  # ultralytics leaves them as they were; timm (and we) copy them
                assert torch.equal(value, model.state_dict()[key]), key
    assert ours.updates == ref.updates
    assert ours.get_decay(8) == ref.decay(8)  # an explicit step replaces the count


def test_tied_weights_are_updated_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)
            self.b.weight = self.a.weight

    model = Tied()
    ema = ModelEMA(model, 0.5)
    assert ema.module.a.weight is ema.module.b.weight  # the copy keeps the tie
    start = ema.module.a.weight.detach().clone()
    with torch.no_grad():
        model.a.weight.add_(1.0)
    ema.update(model)
    torch.testing.assert_close(ema.module.a.weight, start + 0.5, rtol=0, atol=1e-6)


def test_unwraps_ddp_with_sync_batchnorm_and_compile(tmp_path):
    import torch.distributed as dist

    torch.manual_seed(0)
    model = convert_sync_batchnorm(_cnn())
    compiled = torch.compile(model)  # not run: only its wrapper is unwrapped
    ema = ModelEMA(compiled, 0.9)
    assert type(ema.module) is nn.Sequential and type(ema.module[1]).__name__ == "SyncBatchNorm"
    ref = ModelEmaV3(model, 0.9)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        gen = torch.Generator().manual_seed(7)
        for step in range(3):
            ddp.train()
            ddp(torch.randn(4, 3, 6, 6, generator=gen)).square().mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(p.grad, alpha=0.1)
            ema.update(ddp, step)
            ref.update(model, step)
    finally:
        dist.destroy_process_group()
    _assert_same_state(ema.module, ref.module)
    assert ModelEMA(ddp).module.state_dict().keys() == model.state_dict().keys()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model": "net"}, TypeError, "model must be Module"),
        ({"decay": 1.5}, ValueError, r"decay must be in \[0.0, 1.0\]"),
        ({"decay": None}, TypeError, "decay must be int or float"),
        ({"min_decay": -0.1}, ValueError, "min_decay must be in"),
        ({"update_after_step": -1}, ValueError, "update_after_step must be in"),
        ({"use_warmup": 1}, TypeError, "use_warmup must be bool"),
        ({"warmup_gamma": 0.0}, ValueError, "warmup_gamma must be in"),
        ({"warmup_power": -1.0}, ValueError, "warmup_power must be in"),
        ({"tau": 0}, ValueError, "tau must be in"),
        ({"tau": 2000, "use_warmup": True}, ValueError, "tau .* use_warmup"),
        ({"exclude_buffers": "no"}, TypeError, "exclude_buffers must be bool"),
        ({"device": "nowhere"}, ValueError, "device must name a torch device"),
        ({"device": 3}, TypeError, "device must be str or device"),
        ({"dtype": torch.int64}, ValueError, "dtype must be a floating dtype"),
        ({"tau": math.inf}, ValueError, r"tau must be in \(0.0, inf\), got inf"),
        ({"warmup_gamma": math.inf}, ValueError, r"warmup_gamma must be in \(0.0, inf\)"),
        ({"decay": 0.5, "min_decay": 0.9}, ValueError, r"min_decay must be at most decay \(0.5\)"),
    ],
)
def test_bad_arguments_raise_clearly(kwargs, error, match):
    kwargs = {"model": nn.Linear(2, 2), **kwargs}
    with pytest.raises(error, match=match):
        ModelEMA(**kwargs)


def test_bad_update_arguments_raise_clearly():
    ema = ModelEMA(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="model must be Module"):
        ema.update(None)
    with pytest.raises(ValueError, match="step must be in"):
        ema.update(nn.Linear(2, 2), -1)
    with pytest.raises(TypeError, match="step must be int"):
        ema.update(nn.Linear(2, 2), 1.0)
    with pytest.raises(ValueError, match=r"tensors in order \(2, got 1\).* 'bias' .* got nothing"):
        ema.update(nn.Linear(2, 2, bias=False))
    assert ema.updates == 0


@pytest.mark.parametrize("tau", [None, 3.0])
def test_get_decay_refuses_a_step_that_is_no_count(tau):
    ema = ModelEMA(nn.Linear(2, 2), 0.9, tau=tau)
    with pytest.raises(ValueError, match=r"step must be in \[0, inf\), got -5"):
        ema.get_decay(-5)
    with pytest.raises(TypeError, match=r"step must be int, got float \(1.5\)"):
        ema.get_decay(1.5)
    assert ema.get_decay(0) == 0.0


def _linear(cols: int, value: float) -> nn.Module:
    model = nn.Linear(cols, 1, bias=False)
    nn.init.constant_(model.weight, value)
    return model


def _reshape_data(model: nn.Module) -> None:
    model.weight.data = torch.ones(1, 1)


def _view_data(model: nn.Module) -> None:  # the same storage address, another shape
    model.weight.data = model.weight.data[:, :1]


@pytest.mark.parametrize("cached", [False, True], ids=["first-update", "after-an-update"])
@pytest.mark.parametrize(
    ("change", "got"),
    [
        (lambda m: _linear(1, 1.0), r"\(1, 1\)"),  # broadcasts into the EMA's (1, 2)
        (lambda m: _linear(3, 1.0), r"\(1, 3\)"),  # torch's own error named nothing
        (_reshape_data, r"\(1, 1\)"),
        (_view_data, r"\(1, 1\)"),
    ],
    ids=["other-model", "other-model-no-broadcast", "data-replaced", "data-viewed"],
)
def test_a_model_of_other_shapes_is_refused_before_any_change(cached, change, got):
    """Tensors that broadcast were averaged into the EMA's; the error names the tensor and
    both shapes, and neither the count nor the weights change."""
    model = _linear(2, 0.0)
    ema = ModelEMA(model, 0.9)
    if cached:
        ema.update(model)
    with torch.no_grad():
        model.weight.fill_(1.0)
    other = change(model) or model
    updates, weight = ema.updates, ema.module.weight.clone()
    match = rf"tensor 0: expected parameter 'weight' of shape \(1, 2\), .*, got .* shape {got}"
    with pytest.raises(ValueError, match=match):
        ema.update(other)
    assert ema.updates == updates
    assert torch.equal(ema.module.weight, weight)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: setattr(m, "extra", nn.Parameter(torch.ones(3))), r"\(1, got 2\).*'extra'"),
        (lambda m: m.register_buffer("count", torch.zeros(2)), r"\(1, got 2\).*'count'"),
        (lambda m: m.add_module("head", nn.Linear(1, 1)), r"\(1, got 3\).*'head.weight'"),
        (lambda m: setattr(m, "bias", nn.Parameter(torch.ones(1))), r"\(1, got 2\).*'bias'"),
        (lambda m: delattr(m, "weight"), r"\(1, got 0\).*'weight'.* got nothing"),
    ],
    ids=["parameter", "buffer", "submodule", "none-slot-set", "removed"],
)
def test_tensors_added_or_removed_after_an_update_are_refused(change, match):
    """The cached path only re-checked the slots it knew: added tensors were ignored."""
    model = nn.Linear(2, 1, bias=False)
    ema = ModelEMA(model, 0.9)
    ema.update(model)
    change(model)
    weight = ema.module.weight.clone()
    with pytest.raises(ValueError, match=match):
        ema.update(model)
    assert ema.updates == 1 and torch.equal(ema.module.weight, weight)


def test_tensors_of_other_names_or_dtype_kinds_are_refused():
    """Equal counts paired a float tensor with an integer one, or tensors of other names."""
    from collections import OrderedDict

    ema = ModelEMA(nn.Sequential(nn.Linear(2, 2)), 0.9)
    renamed = nn.Sequential(OrderedDict(fc=nn.Linear(2, 2)))
    with pytest.raises(ValueError, match=r"expected parameter '0.weight'.*, got parameter 'fc"):
        ema.update(renamed)

    def holder(a: torch.dtype, b: torch.dtype) -> nn.Module:
        module = nn.Module()
        module.a = nn.Parameter(torch.zeros(2, dtype=a), requires_grad=False)
        module.register_buffer("b", torch.zeros(2, dtype=b))
        return module

    ema = ModelEMA(holder(torch.float32, torch.int64), 0.9)
    with pytest.raises(ValueError, match=r"tensor 0: expected .* torch.float32 .* torch.int64"):
        ema.update(holder(torch.int64, torch.float32))  # one averaged, one copied: as the EMA
    with pytest.raises(ValueError, match=r"tensor 1: expected .* torch.int64 .* torch.bool"):
        ema.update(holder(torch.float32, torch.bool))
    assert ema.updates == 0
    ema.update(holder(torch.float64, torch.int32))  # the same kinds: averaged, copied


@pytest.mark.parametrize("device", [None, "cpu"])
def test_a_model_moved_to_meta_is_refused(device):
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    ema = ModelEMA(model, 0.9, device=device)
    ema.update(model)
    model.to("meta")
    with pytest.raises(ValueError, match=r"expected parameter '0.weight' .* on cpu, .* on meta"):
        ema.update(model)
    assert ema.updates == 1


def test_replaced_tensors_and_submodules_are_followed():
    """The cached tensor lists are rebuilt when a tensor or submodule of either side changes."""
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    ema = ModelEMA(model, 0.5)
    ema.update(model)
    model[0].weight = nn.Parameter(torch.full((2, 2), 4.0))
    model[1].running_mean = torch.full((2,), 2.0)
    weight, mean = ema.module[0].weight.clone(), ema.module[1].running_mean.clone()
    ema.update(model)
    assert torch.equal(ema.module[0].weight, weight.lerp(model[0].weight, 0.5))
    assert torch.equal(ema.module[1].running_mean, mean.lerp(model[1].running_mean, 0.5))
    model[0] = nn.Linear(2, 2)
    weight = ema.module[0].weight.clone()
    ema.update(model)
    assert torch.equal(ema.module[0].weight, weight.lerp(model[0].weight, 0.5))
    ema.module[1].num_batches_tracked = torch.tensor(0)  # equal to the one it replaces
    model.train()(torch.randn(4, 2))
    ema.update(model)
    assert ema.module[1].num_batches_tracked.item() == 1
    model[0].weight.data = torch.full((2, 2), 8.0)  # a parameter's storage replaced
    weight = ema.module[0].weight.clone()
    ema.update(model)
    assert torch.equal(ema.module[0].weight, weight.lerp(model[0].weight, 0.5))
    model[1].running_mean.data = torch.full((2,), 4.0)  # a buffer's
    mean = ema.module[1].running_mean.clone()
    ema.update(model)
    assert torch.equal(ema.module[1].running_mean, mean.lerp(model[1].running_mean, 0.5))
    ema.module.to(torch.float64)  # the EMA's buffers are new tensors, its parameters' storages
    weight, mean = ema.module[0].weight.clone(), ema.module[1].running_mean.clone()
    ema.update(model)
    assert ema.module[1].running_mean.dtype == torch.float64
    assert torch.allclose(
        ema.module[1].running_mean, mean.lerp(model[1].running_mean.double(), 0.5)
    )
    assert torch.allclose(ema.module[0].weight, weight.lerp(model[0].weight.double(), 0.5))
    assert copy.deepcopy(ema)._pairs is None  # the cache holds the model: never copied
