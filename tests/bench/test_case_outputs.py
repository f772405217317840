"""Every CPU benchmark case computes the same result on both sides (``BenchCase.check``).

Generated from the registry: a new case with a peer is checked for free, and one without a
``check`` hook fails here. Each case runs on its ``small_setup`` where it has one.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.harness import BenchCase, get_case, list_cases, same_outputs
from benchmarks.harness.check import verify_outputs

CPU_CASES_WITH_PEER = [
    name
    for name in list_cases()
    if get_case(name).device == "cpu" and get_case(name).peer is not None
]


SLOW_CASES = {
    "load_resnet50_vs_timm",
    "coco_build_index_40k",
    "workload_local_attention_fwd_bwd",
    "workload_yolov8n_train_step",  # a whole YOLOv8n step each side; the loss cases stay fast
    "workload_yolov8n_crowded_train_step",
    "workload_maskrcnn_eval",  # torchvision's Mask R-CNN (ResNet-50) forward, each side
    "workload_maskrcnn_train_step",
}
"""Cases whose check takes more than about 5 s on 2 cores (``make test-all`` runs them)."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES else n
        for n in CPU_CASES_WITH_PEER
    ],
)
def test_both_sides_compute_the_same_result(name):
    verify_outputs(get_case(name))


def test_the_whole_pairwise_family_is_benchmarked():
    for op in ("iou", "giou", "diou", "ciou"):
        assert f"pairwise_{op}_3000" in CPU_CASES_WITH_PEER


def test_a_case_without_check_hook_fails():
    case = BenchCase(
        "_vbtest_unchecked", setup=lambda: torch.ones(2), ours=torch.neg, peer=torch.neg
    )
    with pytest.raises(AssertionError, match="'_vbtest_unchecked' has no check hook"):
        verify_outputs(case)


def test_a_case_whose_sides_differ_fails():
    case = BenchCase(
        "_vbtest_wrong",
        setup=lambda: torch.arange(4.0),
        ours=lambda s: s * 2,
        peer=lambda s: s + s + 1e-3 * (s == 3),
        check=same_outputs(rtol=1e-5, atol=1e-6),
    )
    with pytest.raises(AssertionError, match=r"1 of 4 elements differ.*flat index 3"):
        verify_outputs(case)


def test_outputs_and_small_setup_hooks_are_used():
    calls = []
    case = BenchCase(
        "_vbtest_hooks",
        setup=lambda: pytest.fail("setup must not run when small_setup is given"),
        small_setup=lambda: torch.ones(2),
        ours=torch.neg,
        peer=torch.neg,
        outputs=lambda s: (calls.append("outputs") or {"n": 1}, {"n": 1}),
        check=same_outputs(),
    )
    verify_outputs(case)
    assert calls == ["outputs"]
