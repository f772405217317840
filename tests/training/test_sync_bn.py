"""convert_sync_batchnorm: in place, frozen stages kept, through getters; a gloo DDP run."""

from __future__ import annotations

import copy

import pytest
import torch
import torchvision
from torch import nn

from visionblocks.backbones import build_backbone
from visionblocks.features import IntermediateLayerGetter
from visionblocks.training import SyncBatchNorm, convert_sync_batchnorm


def _kinds(model: nn.Module) -> dict[str, str]:
    return {
        n: type(m).__name__ for n, m in model.named_modules() if "BatchNorm" in type(m).__name__
    }


def test_in_place_with_frozen_stages_kept():
    torch.manual_seed(0)
    backbone = build_backbone("resnet18", frozen_stages=1, out_indices=(-2, -1))
    x = torch.randn(2, 3, 64, 64)
    before = copy.deepcopy(backbone)
    modules = dict(backbone.named_modules())
    params = list(backbone.parameters())
    assert convert_sync_batchnorm(backbone) is backbone
    assert dict(backbone.named_modules()) == modules and list(backbone.parameters()) == params
    kinds = _kinds(backbone)
    frozen = {n for n in kinds if n == "bn1" or n.startswith("layer1.")}
    assert frozen and all(kinds[n] == "BatchNorm2d" for n in frozen)
    assert all(kinds[n] == "SyncBatchNorm" for n in set(kinds) - frozen)
    assert backbone.state_dict().keys() == before.state_dict().keys()
    backbone.train()
    before.train()
    assert not backbone.layer1[0].bn1.training and backbone.layer2[0].bn1.training
    for mode in ("train", "eval"):
        getattr(backbone, mode)()
        getattr(before, mode)()
        out, ref = backbone(x), before(x)
        assert all(torch.equal(out[k], ref[k]) for k in ref)  # no group: plain BatchNorm
    assert all(
        torch.equal(a, b)
        for a, b in zip(backbone.state_dict().values(), before.state_dict().values())
    )


def test_norm_eval_backbones_and_frozen_norms_are_left_alone():
    backbone = build_backbone("vb_tiny", norm_eval=True)
    convert_sync_batchnorm(backbone)
    assert set(_kinds(backbone).values()) == {"BatchNorm2d"}
    bn = nn.BatchNorm2d(3).requires_grad_(False)
    assert type(convert_sync_batchnorm(bn)) is nn.BatchNorm2d
    loose = nn.BatchNorm1d(3)
    assert convert_sync_batchnorm(loose) is loose and type(loose) is SyncBatchNorm


def test_getter_returning_a_norm_output_still_finds_it():
    model = torchvision.models.resnet18(weights=None).eval()
    getter = IntermediateLayerGetter(model, {"bn1": "stem", "layer2": "c3"})
    x = torch.randn(1, 3, 64, 64)
    expected = getter(x)
    convert_sync_batchnorm(getter)
    assert type(model.bn1) is SyncBatchNorm
    out = getter(x)
    assert out.keys() == expected.keys() and all(torch.equal(out[k], expected[k]) for k in out)


def test_other_batchnorm_subclasses_are_left_with_a_warning():
    class NormAct(nn.BatchNorm2d):
        def forward(self, x):
            return torch.relu(super().forward(x))

    model = nn.Sequential(nn.Conv2d(3, 3, 1), NormAct(3), nn.BatchNorm2d(3))
    with pytest.warns(UserWarning, match=r"1 BatchNorm subclass.*1 \(NormAct\)"):
        convert_sync_batchnorm(model)
    assert type(model[1]) is NormAct and type(model[2]) is SyncBatchNorm


def test_torch_sync_batchnorm_becomes_ours():
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(2)))
    convert_sync_batchnorm(model)
    assert type(model[0]) is SyncBatchNorm


def test_ours_is_a_torch_sync_batchnorm_with_its_state_dict():
    from torch.nn.modules.batchnorm import _BatchNorm

    model = convert_sync_batchnorm(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)))
    built = SyncBatchNorm(4, momentum=None, affine=False)
    for bn in (model[1], built):
        assert isinstance(bn, nn.SyncBatchNorm) and isinstance(bn, _BatchNorm)
    assert list(model[1].state_dict()) == list(nn.SyncBatchNorm(4).state_dict())
    assert list(built.state_dict()) == list(nn.SyncBatchNorm(4, affine=False).state_dict())
    # What parameter-group rules look for (norm parameters without weight decay):
    norms = [m for m in model.modules() if isinstance(m, (_BatchNorm, nn.SyncBatchNorm))]
    assert norms == [model[1]]
    copied = copy.deepcopy(model)  # copies (and unpickled models) keep the class
    assert type(copied[1]) is SyncBatchNorm and copied[1].process_group is None
    # torch's classmethod, called on our class, converts to ours (in place).
    loose = nn.Sequential(nn.BatchNorm1d(2))
    assert SyncBatchNorm.convert_sync_batchnorm(loose) is loose
    assert type(loose[0]) is SyncBatchNorm


def test_eval_and_no_group_match_batchnorm_also_with_cumulative_momentum():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5)
    for momentum in (0.1, None):
        ref, ours = nn.BatchNorm2d(3, momentum=momentum), SyncBatchNorm(3, momentum=momentum)
        for _ in range(2):
            torch.testing.assert_close(ours(x), ref(x))
        torch.testing.assert_close(ours.state_dict(), ref.state_dict())
        ours.eval(), ref.eval()
        torch.testing.assert_close(ours(x), ref(x))


def _reference(x: torch.Tensor):
    torch.manual_seed(0)
    model = build_backbone("vb_tiny", frozen_stages=1, out_indices=(-1,))
    model.train()
    out = model(x)["stage3"]
    out.square().mean().backward()
    return model, out


@pytest.mark.distributed
def test_gloo_ddp_matches_one_process_on_the_whole_batch(tmp_path):
    import torch.multiprocessing as mp

    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    torch.save(x, tmp_path / "x.pt")
    mp.spawn(_ddp_worker, args=(str(tmp_path),), nprocs=2, join=True)
    model, out = _reference(x)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for rank, res in enumerate(ranks):
        torch.testing.assert_close(
            res["out"], out[2 * rank : 2 * rank + 2].detach(), atol=1e-5, rtol=1e-4
        )
        for name, grad in res["grads"].items():
            torch.testing.assert_close(grad, model.get_parameter(name).grad, atol=1e-5, rtol=1e-4)
        state = model.state_dict()
        for name, value in res["state"].items():
            torch.testing.assert_close(value, state[name], atol=1e-6, rtol=1e-5)
        assert res["frozen_kinds"] == {"BatchNorm2d"} and res["other_kinds"] == {"SyncBatchNorm"}
        assert res["torch_class_refused"]  # DDP still refuses torch's own class on the CPU
    # Frozen stages kept their statistics; the others moved.
    state = ranks[0]["state"]
    assert torch.equal(state["stem.norm.running_mean"], torch.zeros(16))
    assert torch.equal(state["stage1.0.pointwise.norm.running_var"], torch.ones(16))
    assert not torch.equal(state["stage4.1.pointwise.norm.running_mean"], torch.zeros(128))


def _ddp_worker(rank: int, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=2)
    try:
        x = torch.load(f"{folder}/x.pt")[2 * rank : 2 * rank + 2]
        torch.manual_seed(0)
        model = convert_sync_batchnorm(
            build_backbone("vb_tiny", frozen_stages=1, out_indices=(-1,))
        )
        ddp = nn.parallel.DistributedDataParallel(model)
        ddp.train()
        out = ddp(x)["stage3"]
        out.square().mean().backward()
        kinds = _kinds(model)
        torch_bn = nn.SyncBatchNorm.convert_sync_batchnorm(
            nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3))
        )
        try:
            nn.parallel.DistributedDataParallel(torch_bn)
            refused = False
        except ValueError as error:
            refused = "SyncBatchNorm layers only work with GPU modules" in str(error)
        frozen = {
            n
            for n, m in model.named_modules()
            if not any(p.requires_grad for p in m.parameters(recurse=False)) and n in kinds
        }
        torch.save(
            {
                "out": out.detach(),
                "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
                "state": model.state_dict(),
                "frozen_kinds": {kinds[n] for n in frozen},
                "other_kinds": {kinds[n] for n in set(kinds) - frozen},
                "torch_class_refused": refused,
            },
            f"{folder}/rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_a_group_of_one_rank_trains_as_batchnorm_on_the_cpu(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        x = torch.randn(4, 3, 5, 5)
        ours, ref = SyncBatchNorm(3), nn.BatchNorm2d(3)
        torch.testing.assert_close(ours(x), ref(x))  # torch's class raises here on the CPU
        torch.testing.assert_close(ours.state_dict(), ref.state_dict())
        with pytest.raises(ValueError, match="expected input tensor to be on GPU"):
            nn.SyncBatchNorm(3)(x)
    finally:
        dist.destroy_process_group()
