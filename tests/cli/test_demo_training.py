"""The demo's training kit: a seeded run repeats, ``--amp`` on the CPU, ``--detect-nonfinite``."""

from __future__ import annotations

import json
import math

import pytest
import torch

from visionblocks.cli import main


@pytest.fixture(scope="module", autouse=True)
def _few_training_images():
    """64 training images, not the demo's thousands: these tests check the loop, not the
    recipe."""
    import visionblocks.cli._demo_data as data

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data, "TRAIN_IMAGES", 64)
        yield


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """One demo folder: its synthetic data is written once and reused by every run."""
    return tmp_path_factory.mktemp("demo")


def _losses(out) -> dict[str, list[float]]:
    return json.loads((out / "losses.json").read_text())


@pytest.mark.slow  # the demo
def test_a_seeded_run_repeats_bit_for_bit(out, capsys):
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    runs = []
    for _ in range(2):
        assert main(["demo", "--steps", "6", "--out", str(out), "--seed", "3", "--no-export"]) == 0
        runs.append(_losses(out))
    assert runs[0] == runs[1]
    assert set(runs[0]) >= {"loss", "loss_cls"} and len(runs[0]["loss"]) == 6
    assert len(set(runs[0]["loss"])) > 1  # the losses move: a real run, not a constant
    printed = capsys.readouterr().out
    assert f"seed 3 (repeatable: {threads} threads)" in printed
    assert json.loads((out / "metrics.json").read_text())["seed"] == 3
    # The run puts the global settings back.
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == deterministic
    assert main(["demo", "--steps", "6", "--out", str(out), "--seed", "4", "--no-export"]) == 0
    assert _losses(out)["loss"] != runs[0]["loss"]


@pytest.mark.slow  # the demo
def test_amp_trains_in_bf16_on_the_cpu(out):
    assert main(["demo", "--steps", "3", "--out", str(out), "--seed", "3", "--no-export"]) == 0
    full = _losses(out)["loss"]
    assert main(["demo", "--steps", "3", "--out", str(out), "--seed", "3", "--no-export",
                 "--amp"]) == 0  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["amp"] is True
    mixed = _losses(out)["loss"]
    assert all(math.isfinite(v) for v in mixed)
    assert mixed != full  # bf16 arithmetic: other bits ...
    assert mixed == pytest.approx(full, rel=0.05)  # ... about the same losses


@pytest.mark.slow  # the demo
def test_detect_nonfinite_names_where_training_blew_up(out, capsys, monkeypatch):
    import visionblocks.cli._demo_train as demo_train

    monkeypatch.setattr(demo_train, "LEARNING_RATE", float("inf"))
    code = main(["demo", "--steps", "1", "--out", str(out), "--seed", "3", "--no-export",
                 "--detect-nonfinite"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "visionblocks demo: non-finite parameter: value of 'backbone.stem.conv.weight'" in err
    assert "the optimizer's step 1 made it" in err


@pytest.mark.slow  # the demo
def test_losses_are_read_on_the_host_only_at_log_steps(out, monkeypatch):
    import visionblocks.cli._demo_train as demo_train

    reads = []
    read = demo_train._read

    def counted(pending, names, history):
        reads.append(len(pending))
        read(pending, names, history)

    monkeypatch.setattr(demo_train, "_read", counted)
    runs = []
    for every in (3, 1):
        monkeypatch.setattr(demo_train, "LOG_EVERY", every)
        reads.clear()
        assert main(["demo", "--steps", "7", "--out", str(out), "--seed", "3", "--no-export"]) == 0
        runs.append((list(reads), _losses(out)))
    assert runs[0][0] == [3, 3, 1] and runs[1][0] == [1] * 7  # steps read at each log step
    assert runs[0][1] == runs[1][1]  # the same per-step values as reading every step
    assert all(len(v) == 7 for v in runs[0][1].values())


@pytest.mark.slow  # the demo
def test_the_cpu_demo_trains_on_channels_last_weights_and_images(out, monkeypatch):
    import visionblocks.cli._demo_train as demo_train

    layouts = []
    step = demo_train._step

    def recorded(model, batch, *args):
        def record(module, inputs):
            weights = [p for p in module.parameters() if p.dim() == 4]
            layouts.append((inputs[0].is_contiguous(memory_format=torch.channels_last),
                            all(w.is_contiguous(memory_format=torch.channels_last)
                                for w in weights), len(weights)))  # fmt: skip

        handle = model.register_forward_pre_hook(record)
        try:
            return step(model, batch, *args)
        finally:
            handle.remove()

    monkeypatch.setattr(demo_train, "_step", recorded)
    assert main(["demo", "--steps", "2", "--out", str(out), "--seed", "3", "--no-export"]) == 0
    assert len(layouts) == 2 and all(images and weights for images, weights, _ in layouts)
    assert layouts[0][2] > 20  # every convolution of the detector
    assert demo_train.memory_format(torch.device("cuda")) == torch.contiguous_format
