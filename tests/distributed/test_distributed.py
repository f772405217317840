"""Distributed helpers: single-process fallbacks and a real two-process gloo group."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from visionblocks import distributed as vd


def test_single_process_fallbacks():
    assert not vd.is_dist_initialized()
    assert vd.get_world_size() == 1
    assert vd.get_rank() == 0
    assert vd.is_main_process()
    vd.barrier()
    x = torch.tensor([1.0, 3.0], requires_grad=True)
    y = vd.reduce_mean(x)
    assert torch.equal(y, x.detach()) and not y.requires_grad
    y += 1
    assert torch.equal(x.detach(), torch.tensor([1.0, 3.0]))  # input untouched
    assert vd.reduce_mean(torch.tensor(3)).dtype == torch.float32
    assert vd.all_gather_object({"a": 1}) == [{"a": 1}]
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor, got float"):
        vd.reduce_mean(1.0)


def _worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        x = torch.tensor([float(rank), 10.0 * (rank + 1)])
        mean = vd.reduce_mean(x)
        gathered = vd.all_gather_object({"rank": rank, "items": list(range(rank + 1))})
        vd.barrier()
        torch.save(
            {
                "rank": vd.get_rank(),
                "world": vd.get_world_size(),
                "main": vd.is_main_process(),
                "mean": mean,
                "x_after": x,
                "gathered": gathered,
            },
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_gloo_processes():
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        mp.spawn(_worker, args=(2, init_file, tmp), nprocs=2, join=True)
        results = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    for rank, res in enumerate(results):
        assert res["rank"] == rank and res["world"] == 2
        assert res["main"] is (rank == 0)
        torch.testing.assert_close(res["mean"], torch.tensor([0.5, 15.0]))
        torch.testing.assert_close(res["x_after"], torch.tensor([float(rank), 10.0 * (rank + 1)]))
        assert res["gathered"] == [{"rank": 0, "items": [0]}, {"rank": 1, "items": [0, 1]}]
