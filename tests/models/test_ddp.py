"""One DDP step on two gloo processes gives the gradients of one process on the whole batch.

The FCOS losses divide by the number of positives (and the centerness weight sum) averaged
over the ranks, so that the average of the ranks' gradients, which DDP computes, is the
gradient of the loss of the concatenated batch. GroupNorm everywhere keeps the forward
independent of how the batch is split (BatchNorm would use each rank's batch statistics).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CFG = {
    "backbone": {
        "type": "vb_tiny",
        "out_indices": [1, 2, 3],
        "widths": [8, 16, 32, 64],
        "norm": "gn",
    },
    "neck": {"type": "fpn", "out_channels": 16},
    "head": {
        "type": "fcos",
        "num_classes": 3,
        "num_convs": 1,
        "size_ranges": [(0, 16), (16, 32), (32, 1e8)],
    },
}


def batch() -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(3)
    images = torch.randint(0, 255, (4, 3, 64, 64), generator=gen, dtype=torch.uint8)
    boxes = [  # different numbers of objects per image, one image without any
        [[4.0, 4.0, 30.0, 40.0], [34.0, 10.0, 60.0, 30.0]],
        [[10.0, 12.0, 50.0, 60.0]],
        [],
        [[2.0, 30.0, 20.0, 62.0], [22.0, 2.0, 60.0, 20.0], [30.0, 34.0, 44.0, 48.0]],
    ]
    targets = [
        {"boxes": torch.tensor(b).reshape(-1, 4), "labels": torch.arange(len(b)) % 3} for b in boxes
    ]
    return images, targets


def model() -> torch.nn.Module:
    from visionblocks.models import build_detector

    torch.manual_seed(0)
    return build_detector(CFG)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        ddp = DistributedDataParallel(model())
        images, targets = batch()
        half = slice(2 * rank, 2 * rank + 2)
        ddp(images[half], targets[half])["loss"].backward()
        grads = {n: p.grad for n, p in ddp.module.named_parameters()}
        torch.save(grads, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_ddp_step_equals_one_process_on_the_whole_batch():
    reference = model()
    images, targets = batch()
    reference(images, targets)["loss"].backward()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    for name, param in reference.named_parameters():
        for grads in ranks:
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
    # not trivially equal: one rank alone gives other gradients
    alone = model()
    alone(images[:2], targets[:2])["loss"].backward()
    head = "head.cls_logits.weight"
    assert not torch.allclose(
        dict(alone.named_parameters())[head].grad, dict(reference.named_parameters())[head].grad
    )
