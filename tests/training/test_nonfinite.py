"""find_nonfinite: the first NaN/inf in a forward, backward, loss or step names its module."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from visionblocks.training import NonFiniteError, find_nonfinite

NAN = float("nan")


class Net(nn.Module):
    """``a`` -> (the model's own code) -> ``b`` (a Sequential) -> dict output."""

    def __init__(self, between=lambda x: x) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.between = between

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor | None = None) -> dict:
        y = self.b(self.between(self.a(x)))
        return {"loss": y.sum() * (1.0 if scale is None else scale), "aux": (y, y.mean())}


def _raises(fn) -> NonFiniteError:
    with pytest.raises(NonFiniteError) as info:
        fn()
    return info.value


def test_forward_output_names_the_innermost_module():
    model = Net()
    with torch.no_grad():
        model.b[0].bias[2] = NAN
    with find_nonfinite(model):
        err = _raises(lambda: model(torch.ones(3, 4)))
    assert (err.kind, err.module, err.tensor, err.shape, err.count) == (
        "forward output", "b.0", "output", (3, 4), 3,
    )  # fmt: skip
    assert (
        "module 'b.0', Tensor[3, 4] float32, has 3 non-finite values of 12 (3 nan, 0 inf)"
        in str(err)
    )
    assert "Linear's own forward" in str(err)


def test_forward_input_made_between_submodules_names_the_caller():
    model = Net(between=lambda x: torch.log(x - 1e3))
    with find_nonfinite(model):
        err = _raises(lambda: model(torch.ones(2, 4)))
    assert (err.kind, err.module, err.tensor) == ("forward input", "b", "input 0")
    assert "made by the forward code of the model" in str(err)


def test_an_output_changed_in_place_before_the_next_module_is_checked_again():
    model = Net(between=lambda x: x.add_(float("inf")))  # a's output, made infinite in place
    with find_nonfinite(model):
        err = _raises(lambda: model(torch.ones(2, 4)))
    assert (err.kind, err.module, err.tensor) == ("forward input", "b", "input 0")
    assert "made by the forward code of the model" in str(err)


def test_an_output_found_finite_is_not_checked_again_as_the_next_input(monkeypatch):
    import visionblocks.training.nonfinite as nonfinite

    checked = []
    real = nonfinite._bad
    monkeypatch.setattr(nonfinite, "_bad", lambda t: checked.append(t) or real(t))
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad(), find_nonfinite(model, backward=False):
        model(torch.ones(3, 4))
    # The model's input and each layer's output (the last is the model's output): once each.
    assert len(checked) == 4, [tuple(t.shape) for t in checked]


def test_model_input_and_keyword_inputs():
    model = Net()
    with find_nonfinite(model):
        err = _raises(lambda: model(torch.tensor([[1.0, float("inf"), 0, 0]])))
        assert (err.kind, err.module, err.tensor, err.count) == ("forward input", "", "input 0", 1)
        assert "input 0 of the model" in str(err) and "it is the model's input" in str(err)
        err = _raises(lambda: model(torch.ones(1, 4), scale=torch.tensor(NAN)))
        assert err.tensor == "input 'scale'"


def test_nested_outputs_are_named():
    class Bad(nn.Module):
        def forward(self, x):
            return {"boxes": x, "scores": (x, x / 0)}

    model = nn.Sequential(Bad())
    with find_nonfinite(model):
        err = _raises(lambda: model(torch.ones(2)))
    assert (err.module, err.tensor) == ("0", "output['scores'][1]")


def test_backward_gradient_of_a_module_output():
    model = Net(between=lambda x: torch.sqrt(torch.relu(x) * 0))  # sqrt'(0) = inf
    with find_nonfinite(model):
        out = model(torch.ones(2, 4))
        err = _raises(lambda: out["loss"].backward())
    assert (err.kind, err.module, err.tensor) == ("gradient", "a", "grad of output")
    assert "the backward of what used this output" in str(err)


def test_backward_gradient_of_a_parameter():
    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(3))

        def forward(self, x):
            return x * torch.sqrt(self.weight)

    model = nn.Sequential(nn.Linear(3, 3), Root())
    with find_nonfinite(model):
        out = model(torch.ones(1, 3)).sum()
        err = _raises(out.backward)
    assert (err.kind, err.module, err.tensor) == ("gradient", "1.weight", "grad of weight")
    assert "the backward of module '1'" in str(err)


def test_losses_and_parameters_after_a_step():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e38)
    with find_nonfinite(model, optimizer=optimizer) as finder:
        finder.check(torch.tensor(1.0))
        err = _raises(lambda: finder.check({"loss_cls": torch.tensor(NAN)}))
        assert (err.kind, err.tensor) == ("loss", "loss['loss_cls']")
        model(torch.full((1, 2), 1e3)).sum().backward()
        err = _raises(optimizer.step)
    assert (err.kind, err.module) == ("parameter", "weight")
    assert "the optimizer's step 1 made it" in str(err)


def test_disabled_registers_nothing_and_exit_removes_everything():
    model = torchvision.models.resnet18(weights=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def hooks() -> int:
        count = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
        count += sum(len(p._backward_hooks or {}) for p in model.parameters())
        return count + len(optimizer._optimizer_step_post_hooks)

    with find_nonfinite(model, optimizer=optimizer, enabled=False) as finder:
        assert hooks() == 0
        finder.check(torch.tensor(NAN))  # disabled: no error
    with find_nonfinite(model, optimizer=optimizer):
        assert hooks() > 2 * len(list(model.modules()))
    assert hooks() == 0
    with pytest.raises(NonFiniteError), find_nonfinite(model):
        model(torch.full((1, 3, 32, 32), NAN))
    assert hooks() == 0  # removed on an error too


def test_healthy_torchvision_model_with_inplace_relu_trains_unchanged():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 64, 64)
    model(x).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(0)
    with find_nonfinite(model):
        model(x).square().mean().backward()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected))


def test_autocast_bf16_has_no_false_alarm_and_fp16_overflow_is_reported():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    with find_nonfinite(model), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.full((2, 4), 1e5)).sum().backward()
    with torch.no_grad():
        model[0].weight.fill_(1e3)
    with find_nonfinite(model), torch.autocast("cpu", dtype=torch.float16):
        err = _raises(lambda: model(torch.full((2, 4), 1e3)))
    assert (err.kind, err.module) == ("forward output", "0")
    assert "float16" in str(err) and "inf" in str(err)


def test_scaled_gradients_are_left_to_the_scaler_until_its_scale_is_below_one():
    class Overflow(nn.Module):
        def forward(self, x):
            return x * 1e30

    model = nn.Sequential(nn.Linear(2, 2), Overflow())
    for scale, raises in ((2.0**16, False), (0.5, True)):
        scaler = torch.amp.GradScaler("cpu", init_scale=scale)
        with find_nonfinite(model, scaler=scaler):
            loss = scaler.scale(model(torch.ones(1, 2)).sum() * 1e10)
            if raises:
                assert _raises(loss.backward).kind == "gradient"
            else:
                loss.backward()


@pytest.mark.slow  # DDP
def test_ddp_model_paths_and_rank(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(str(tmp_path),), nprocs=2, join=True)
    message = (tmp_path / "rank1.txt").read_text()
    assert message.startswith("non-finite forward output on rank 1: output of module 'b.0'")
    assert not (tmp_path / "rank0.txt").exists()


def _ddp_worker(rank: int, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=2)
    try:
        model = nn.parallel.DistributedDataParallel(Net(), broadcast_buffers=False)
        if rank == 1:
            with torch.no_grad():
                model.module.b[0].bias[0] = NAN
        try:
            with find_nonfinite(model):
                model(torch.ones(2, 4))
        except NonFiniteError as err:
            with open(f"{folder}/rank{rank}.txt", "w") as f:
                f.write(str(err))
    finally:
        dist.destroy_process_group()


def test_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        find_nonfinite(torch.ones(2))
    with pytest.raises(TypeError, match="scaler"):
        find_nonfinite(nn.Linear(1, 1), scaler=1.0)
