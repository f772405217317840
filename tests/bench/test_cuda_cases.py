"""The CUDA kernel cases: selected by --device cuda only, with a byte count for GB/s."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks.cases.assign import CUDA_MATCH_ANCHORS
from benchmarks.cases.cuda import PERFORMANCE_MODEL
from benchmarks.cases.rotated import CUDA_ROTATED_IOU
from benchmarks.harness import (
    BenchResult,
    add_arguments,
    format_table,
    get_case,
    list_cases,
    run_cases,
    run_from_cli,
)
from benchmarks.harness.timing import TimingResult


def test_every_cuda_case_is_a_bandwidth_case_or_a_compute_case():
    cuda = [name for name in list_cases() if get_case(name).device == "cuda"]
    compute = [case.name for case in (*CUDA_MATCH_ANCHORS, CUDA_ROTATED_IOU)]
    assert sorted(cuda) == sorted([*PERFORMANCE_MODEL, *compute])
    for name in PERFORMANCE_MODEL:  # bandwidth-bound kernels: GB/s against the copy
        case = get_case(name)
        assert case.bytes_moved == PERFORMANCE_MODEL[name] and not case.memory


def test_the_cuda_assignment_cases_check_every_match_on_every_run():
    # impl="auto" picks the kernels only once these show equal matches on a GPU and 1.3x
    # over the torch path; the matrix case holds the kernels to a tenth of its memory.
    vs_matrix, vs_torch = CUDA_MATCH_ANCHORS
    for case in CUDA_MATCH_ANCHORS:
        assert case.verify and case.small_setup is None  # the full 200,000 x 500
        with pytest.raises(AssertionError):
            case.check(torch.tensor([0, 1, -1]), torch.tensor([0, 1, -2]))
    assert vs_matrix.memory and vs_matrix.max_memory_ratio == 0.1
    assert vs_torch.min_speedup == 1.3 and vs_torch.peer_name.startswith("torch path")


def test_the_cuda_rotated_case_holds_the_kernel_to_the_torch_path():
    case = CUDA_ROTATED_IOU
    assert case.verify and case.min_speedup == 1.3 and case.peer_name.startswith("torch path")
    case.check(torch.tensor([0.5]), torch.tensor([0.5 + 1e-6]))
    with pytest.raises(AssertionError):
        case.check(torch.tensor([0.5]), torch.tensor([0.5 + 1e-5]))


def test_cpu_runs_never_pick_cuda_cases():
    with pytest.raises(ValueError, match="no cpu benchmark case matches"):
        run_cases(["cuda_*"], repeats=1, warmup=0, memory=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_device_cuda_without_a_gpu_says_so(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run_from_cli(parser.parse_args(["--device", "cuda"])) == 1
    assert "--device cuda needs a CUDA GPU" in capsys.readouterr().err


def test_table_shows_bandwidth_when_a_case_states_its_bytes():
    timing = TimingResult(2.0, 4.0, 2.0, 1.9, 2.1)
    rows = [
        BenchResult("k", peer_name="p", timing=timing, bytes_moved=4_000_000_000, copy_gbps=4000.0),
        BenchResult("other", timing=timing),
    ]
    lines = format_table(rows).splitlines()
    memory = lines[lines.index("**Memory and bandwidth**") + 2 :]
    assert memory[0] == "| case | ours MiB | peer MiB | mem ratio | GB/s | % of copy |"
    # 4 GB in 2 ms = 2000 GB/s, half the copy bandwidth; "other" has nothing to show here.
    assert memory[2:] == ["| k | - | - | - | 2000 | 50% |"]
    table = format_table(rows[1:])
    assert "GB/s" not in table and "Memory and bandwidth" not in table
