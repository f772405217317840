"""`visionblocks demo`: outputs, data reuse, errors, a torchrun run on two gloo processes, and
the default run's targets (AP >= 0.70, AP50 >= 0.95; on the images drawn, at most a quarter
of the objects missed and a quarter more boxes than objects found). Its time is measured by running it (``make demo``), not here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from PIL import Image

from visionblocks.cli import main

KEYS = {"AP", "AP50", "AP75", "per_class", "score_thresh", "drawn", "steps", "seconds",
        "world_size"}  # fmt: skip


@pytest.mark.slow  # the demo
def test_demo_writes_metrics_and_figures(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--steps", "3", "--out", str(out), "--seed", "1"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) >= KEYS
    assert metrics["steps"] == 3 and metrics["world_size"] == 1 and metrics["device"] == "cpu"
    assert 0.0 <= metrics["AP50"] <= 1.0 and metrics["seconds"] > 0
    assert set(metrics["per_class"]) == {"circle", "square", "triangle"}
    assert all(set(ap) == {"AP", "AP50"} for ap in metrics["per_class"].values())
    assert set(metrics["drawn"]) == {"images", "objects", "boxes", "found"}
    assert metrics["drawn"]["images"] == 8 and 0.0 <= metrics["score_thresh"] <= 1.0
    for name in ("predictions.png", "loss.png"):
        with Image.open(out / name) as png:
            assert png.size[0] > 300 and png.size[1] > 200
    printed = capsys.readouterr().out
    assert "visionblocks demo: 3 steps on cpu x 1" in printed and "AP50" in printed
    # model.pt holds the config with the trained weights: the deploy tools rebuild it.
    import torch

    from visionblocks.deploy import load_for_export

    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnxscript"):
        assert (out / "model.onnx").is_file() and "checked in onnxruntime" in printed
        diff = float(printed.split("max difference from eager", 1)[1].split()[0])
        assert diff < 1e-4
    saved = torch.load(out / "model.pt", weights_only=True)
    assert saved["config"]["head"]["score_thresh"] == metrics["score_thresh"]  # deployed
    rebuilt = load_for_export(out / "model.pt").state_dict()
    assert rebuilt.keys() == saved["model"].keys()
    assert all(torch.equal(rebuilt[k], v) for k, v in saved["model"].items())
    annotations = out / "data" / "train" / "annotations.json"
    first = annotations.stat().st_mtime_ns
    (out / "model.onnx").unlink(missing_ok=True)
    assert main(["demo", "--steps", "1", "--out", str(out), "--seed", "1", "--no-export"]) == 0
    assert not (out / "model.onnx").exists()
    assert annotations.stat().st_mtime_ns == first  # the same data is reused, not rewritten


@pytest.mark.slow  # the whole default demo: about 70 s on 2 quiet cores (--no-export)
def test_the_default_demo_meets_its_ap_and_draws_few_wrong_boxes(tmp_path, capsys):
    from visionblocks.cli.demo import DEFAULT_STEPS

    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--seed", "0", "--no-export"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == DEFAULT_STEPS
    assert metrics["AP"] >= 0.70 and metrics["AP50"] >= 0.95
    # The picture after the deployed postprocessing: no pile of boxes, few objects missed.
    # Exactly one box per object, of its class, holds in most runs but not all, so it is not
    # asserted: the same seed gives another run on another CPU (its kernels sum in another
    # order). Seeds 0-13 on one thread (as here under pytest-xdist): no object missed, 0-2
    # boxes more than found, of 15-24.
    drawn = metrics["drawn"]
    assert drawn["objects"] > 8 and drawn["found"] <= drawn["objects"], drawn
    assert drawn["objects"] - drawn["found"] <= drawn["objects"] // 4, drawn
    assert drawn["boxes"] - drawn["found"] <= drawn["objects"] // 4, drawn
    printed = capsys.readouterr().out
    assert "score threshold" in printed
    rows = {line.split()[0]: line.split()[1:] for line in printed.splitlines() if line.strip()}
    for name in ("circle", "square", "triangle"):  # the per-class table: AP and AP50
        assert rows[name] == [f"{metrics['per_class'][name][k]:.3f}" for k in ("AP", "AP50")]


def test_demo_errors(tmp_path, capsys, monkeypatch):
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert main(["demo", "--distributed", "--steps", "1", "--out", str(tmp_path)]) == 1
    assert "torchrun --standalone --nproc_per_node 2" in capsys.readouterr().err
    if not __import__("torch").cuda.is_available():
        assert main(["demo", "--device", "cuda", "--steps", "1", "--out", str(tmp_path)]) == 1
        assert "CUDA is not available" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--device", "tpu"])
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(["demo", "--steps", "1", "--out", str(blocker)]) == 1
    assert "visionblocks demo:" in capsys.readouterr().err


@pytest.mark.distributed
def test_torchrun_two_processes(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    command = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "visionblocks",
               "demo", "--distributed", "--steps", "3", "--out", str(tmp_path),
               "--no-export"]  # fmt: skip
    temp = tmp_path / "temp"  # torchrun's own torchelastic_* log folder goes here
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps"] == 3


def _tune(step_seconds, steps=800, others=None):
    """Run a ThreadTuner against a cost model (seconds per step, and the cores other processes
    keep busy: none unless ``others(step)`` says); the total time and the thread count per step."""
    import torch

    from visionblocks.cli._demo_threads import ThreadTuner

    before = torch.get_num_threads()
    step = 0
    load = (lambda: 0.0) if others is None else (lambda: others(step))
    tuner, total, used = ThreadTuner(2, others=load), 0.0, []
    try:
        for step in range(steps):  # ``load`` reads ``step``
            tuner.start_step()
            used.append(torch.get_num_threads())
            seconds = step_seconds(used[-1], step)
            total += seconds
            tuner.end_step(seconds)
    finally:
        torch.set_num_threads(before)
    return total, used


def test_the_thread_tuner_follows_the_faster_thread_count():
    quiet = {1: 0.18, 2: 0.125}  # seconds per step: two threads win on a quiet machine
    busy = {1: 0.25, 2: 2.0}  # ... and lose badly when other processes keep the cores busy
    total, used = _tune(lambda n, step: quiet[n])
    assert total < 1.02 * 800 * quiet[2] and used.count(1) < 20
    total, used = _tune(lambda n, step: busy[n])
    assert total < 1.06 * 800 * busy[1] and used.count(2) < 8
    total, used = _tune(lambda n, step: (quiet if step < 400 else busy)[n])
    assert used[390] == 2 and used[-1] == 1  # it notices when the machine gets busy
    assert total < 1.1 * 400 * (quiet[2] + busy[1])


def test_the_thread_tuner_does_not_try_more_threads_while_others_keep_the_cores_busy():
    quiet = {1: 0.18, 2: 0.125}
    busy = {1: 0.25, 2: 5.0}
    loaded = lambda step: 1.3 if 100 <= step < 600 else 0.05  # noqa: E731
    total, used = _tune(lambda n, step: (busy if loaded(step) > 1 else quiet)[n], others=loaded)
    assert used[:8].count(2) >= 2 and used[95] == 2  # quiet: tried, then chosen
    assert 2 not in used[103:600]  # busy: after 3 slow steps, no try (each would cost 5 s)
    assert used[-1] == 2  # quiet again: tried and chosen again
    # Without the load reading, the tries happen and cost their slow steps.
    blind, _ = _tune(
        lambda n, step: (busy if loaded(step) > 1 else quiet)[n], others=lambda s: None
    )
    assert total < blind - 4.0


def test_others_meter_reads_the_machine():
    from visionblocks.cli._demo_threads import OthersMeter

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    meter = OthersMeter()
    assert meter() is None  # no wall time yet: ticks cannot resolve it
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:  # keep one core busy ourselves: not counted
        sum(range(1000))
    cores = meter()
    assert cores is not None
    # only the cores this process may run on count, and each tick of rounding is at most
    # a quarter of a core at the shortest interval a reading accepts
    assert -0.5 < cores < len(os.sched_getaffinity(0)) + 0.5


def test_others_meter_waits_for_an_interval_the_ticks_resolve(monkeypatch):
    from visionblocks.cli import _demo_threads

    clock = iter([0.0, 0.001, 0.002, 10.0])
    snapshots = {
        0.0: (0.0, 100.0, 5.0),
        0.001: (0.001, 100.01, 5.0),  # one tick in a millisecond: ten cores if believed
        0.002: (0.002, 100.01, 5.0),
        10.0: (10.0, 115.0, 10.0),
    }
    monkeypatch.setattr(_demo_threads, "_cpu_snapshot", lambda cores: snapshots[next(clock)])
    meter = _demo_threads.OthersMeter()
    assert meter() is None and meter() is None
    # counted from construction: 15 busy seconds, 5 of them ours, over 10 seconds
    assert meter() == pytest.approx(1.0)


def test_the_thread_tuner_leaves_threads_alone_when_told():
    import torch

    from visionblocks.cli._demo_threads import ThreadTuner

    before = torch.get_num_threads()
    tuner = ThreadTuner(before + 1, tune=False)
    for seconds in (1.0, 5.0, 0.1, 9.0):
        tuner.start_step()
        tuner.end_step(seconds)
    assert torch.get_num_threads() == before and tuner.threads == before + 1


def test_the_demo_batch_warp_matches_warping_each_target():
    """`AugmentedCollate` warps all the boxes of a batch as one target: the same boxes and
    labels as warping each image's target with the same draw, those that leave dropped."""
    import torch
    from torchvision import tv_tensors

    from visionblocks.cli._demo_data import AugmentedCollate
    from visionblocks.data import collate_detection

    def sample(boxes, labels):
        image = tv_tensors.Image(torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8))
        boxes = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(64, 64))
        return image, {"boxes": boxes, "labels": torch.tensor(labels, dtype=torch.int64)}

    samples = [
        sample([[0.0, 0.0, 3.0, 3.0], [20.0, 20.0, 40.0, 44.0]], [2, 1]),
        sample(torch.zeros(0, 4), []),
        sample(
            [[60.0, 50.0, 64.0, 63.0], [5.0, 30.0, 25.0, 50.0], [1.0, 1.0, 9.0, 9.0]], [0, 2, 1]
        ),
    ]
    collate = AugmentedCollate()
    dropped = 0
    for seed in range(20):
        torch.manual_seed(seed)
        images, targets, sizes = collate(samples)
        torch.manual_seed(seed)
        one = collate.warp(collate_detection(samples))
        assert (
            torch.equal(images, one.images.as_subclass(torch.Tensor)) and sizes == one.image_sizes
        )
        for got, want in zip(targets, one.targets, strict=True):
            assert set(got) == {"boxes", "labels"}
            assert torch.equal(got["boxes"], want["boxes"].as_subclass(torch.Tensor))
            assert torch.equal(got["labels"], want["labels"]) and got["labels"].dtype == torch.int64
        dropped += sum(len(t["boxes"]) for _, t in samples) - sum(len(t["boxes"]) for t in targets)
    assert dropped > 0  # some draws push boxes out: the drops are checked too
