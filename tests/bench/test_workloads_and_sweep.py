"""Smoke tests of the workload and size-sweep cases: their smallest configurations run, check
their outputs, count calls and reach the report and the plot (so the cases cannot rot).

The timings themselves are never asserted on. ``test_case_outputs.py`` checks every case's
outputs (the sweep points and workloads included); this file runs them through the runner.
"""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
import torch

from benchmarks.harness import BenchCase, get_case, list_cases, run_cases, same_outputs, time_pair
from benchmarks.harness.table import SWEEP_CAPTION, WORKLOAD_CAPTION, format_table

SMALLEST_SWEEP = [
    "sweep_box_iou_10x10_t1",
    "sweep_giou_10x10_t2",
    "sweep_giou_loss_1e1_t1",
    "sweep_focal_1e1_t2",
]


SWEEP_POINTS = {"box_iou": 2 * 7, "generalized_box_iou": 2 * 7, "generalized_box_iou_loss": 2 * 6,
                "sigmoid_focal_loss": 2 * 7, "rotated_box_iou": 2 * 4}  # fmt: skip
MODERN_OPS = {
    "task_aligned_assign", "simota_assign", "dynamic_soft_label_assign", "hungarian_match",
    "decode_distances", "encode_distances", "decode_deltas", "encode_deltas", "anchor_points",
    "anchor_generator", "nms", "batched_nms", "soft_nms_cluster", "soft_nms_spread",
    "matrix_nms", "dfl", "vfl", "qfl", "ema_update",
}  # fmt: skip


def test_sweep_covers_every_op_size_and_thread_count():
    names = list_cases("sweep_*")
    points = Counter(get_case(n).params["op"] for n in names)
    # the box and loss sweep (sweep.py, rotated.py): every size at 1 and 2 threads
    assert {op: points[op] for op in SWEEP_POINTS} == SWEEP_POINTS
    # issue 41's blocks (modern_assign.py, modern_blocks.py): tiny to large, 1 and 2 threads
    for op in MODERN_OPS:
        threads = {get_case(n).threads for n in names if get_case(n).params["op"] == op}
        assert points[op] >= 6 and threads == {1, 2}, (op, points[op], threads)
    assert set(points) == set(SWEEP_POINTS) | MODERN_OPS
    focal = sorted(get_case(n).params["elements"] for n in list_cases("sweep_focal_*_t1"))
    assert focal == [10**k for k in range(1, 8)]
    assert get_case("sweep_box_iou_100000x50_t2").params["elements"] == 5_000_000


def test_smallest_sweep_points_run_count_calls_report_and_plot(tmp_path):
    from benchmarks.plot import plot_sweep

    results = run_cases(SMALLEST_SWEEP, repeats=2, warmup=1, memory=False, quick=True)
    assert [r.error for r in results] == [None] * len(SMALLEST_SWEEP)
    for r in results:
        assert r.group == "sweep" and r.quick and r.timing.speedup > 0
        assert r.ours_calls > 0 and r.peer_calls > 0
        assert r.timing.ours_loops >= 1 and r.timing.peer_loops >= 1
    table = format_table(results)
    assert SWEEP_CAPTION in table and "| sigmoid_focal_loss | 2 | 1e1 |" in table
    out = plot_sweep(results, tmp_path / "sweep.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_microsecond_calls_are_timed_in_calibrated_loops():
    case = BenchCase(
        "_vbtest_tiny", setup=lambda: 1, ours=abs, peer=abs, check=same_outputs(), min_sample_ms=1.0
    )
    timing = time_pair(case, repeats=2, warmup=1)
    assert timing.ours_loops > 10 and timing.peer_loops > 10
    assert len(timing.ours_times_ms) == 2 and timing.ours_ms < 1.0  # per call, not per loop


def test_augmentation_and_demo_workloads_run_quick():
    names = ["workload_augment_uint8_vs_opencv", "workload_demo_detector_train_step"]
    results = run_cases(names, repeats=1, warmup=0, memory=False, quick=True)
    assert [r.error for r in results] == [None, None]
    augment, demo = results
    assert augment.verified and augment.timing.peer_ms > 0
    assert demo.verified is None and demo.timing.peer_ms is None
    assert format_table(results).startswith("*Quick run")
    assert WORKLOAD_CAPTION in format_table(results)


@pytest.mark.slow  # two detectors
def test_torchvision_models_call_the_swapped_functions_and_get_them_back():
    from benchmarks.cases import workloads

    originals = {
        (module, name): getattr(importlib.import_module(module), name)
        for module, names in workloads.TORCHVISION_LOOKUPS.items()
        for name in names
    }
    for case, expected in (
        (
            "workload_tv_fcos_train_step",
            ("fcos.sigmoid_focal_loss", "fcos.generalized_box_iou_loss"),
        ),
        ("workload_tv_retinanet_train_step", ("retinanet.sigmoid_focal_loss", "boxes.box_iou")),
    ):
        state = get_case(case).small_setup()
        counts: dict[str, int] = {}
        with torch.no_grad():
            with workloads.visionblocks_in_torchvision(counts):
                ours = state["model"](state["images"], state["targets"])
            peer = state["model"](state["images"], state["targets"])
        called = {key.rsplit(".", 2)[-2] + "." + key.rsplit(".", 1)[-1] for key in counts}
        assert set(expected) <= called, f"{case}: only {sorted(called)} were called"
        workloads._check_losses(ours, peer)
    for (module, name), fn in originals.items():
        assert getattr(importlib.import_module(module), name) is fn


@pytest.mark.slow  # two detectors' forward passes
def test_torchvision_loss_workloads_run_quick_and_agree():
    names = ["workload_tv_fcos_loss", "workload_tv_retinanet_loss"]
    results = run_cases(names, repeats=1, warmup=0, memory=False, quick=True)
    assert [r.error for r in results] == [None, None]
    assert [r.verified for r in results] == [True, True]
    state = get_case("workload_tv_retinanet_loss").small_setup()
    get_case("workload_tv_retinanet_loss").ours(state)
    assert all(v.grad is None for v in state["args"][1].values())  # cleared after each call


def test_the_swap_is_undone_on_an_error():
    from torchvision.models.detection import fcos

    from benchmarks.cases import workloads

    before = fcos.sigmoid_focal_loss
    with pytest.raises(RuntimeError, match="boom"), workloads.visionblocks_in_torchvision():
        raise RuntimeError("boom")
    assert fcos.sigmoid_focal_loss is before
