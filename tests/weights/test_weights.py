"""read_state_dict and load_partial: safe reading, key mapping, adaptation, guards, report."""

from __future__ import annotations

import collections
import copy
import functools
import io
import os
import re
import sys
import zipfile

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from tests.helpers import MaliciousPickle, resident_file_kib
from visionblocks.weights import LoadError, LoadReport, load_partial, read_state_dict
from visionblocks.weights._io import read_checkpoint


@pytest.fixture(scope="module")
def rgb_net() -> nn.Module:
    """A resnet18 with non-trivial BatchNorm statistics (so buffers matter), in eval mode."""
    torch.manual_seed(0)
    net = _resnet18()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.num_batches_tracked.fill_(7)
    return net.eval()


@pytest.fixture(scope="module")
def rgb_state(rgb_net) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in rgb_net.state_dict().items()}


@functools.cache
def _template(num_classes: int) -> nn.Module:
    torch.manual_seed(1)
    return torchvision.models.resnet18(num_classes=num_classes)


def _resnet18(num_classes: int = 1000) -> nn.Module:
    """A freshly initialised-looking resnet18 (a copy of a cached one: init is slow)."""
    return copy.deepcopy(_template(num_classes))


def _equal_state(a: nn.Module, b: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> bool:
    return all(torch.equal(v, b[k]) for k, v in a.state_dict().items() if not k.startswith(skip))


# ---------------------------------------------------------------------------------- reading
def test_read_zip_file_is_memory_mapped(tmp_path, rgb_state):
    path = tmp_path / "r18.pth"
    torch.save(rgb_state, path)
    state, info = read_checkpoint(path)
    assert info.format == "torch (zip, mmap)"
    assert state.keys() == rgb_state.keys()
    assert all(torch.equal(state[k], v) for k, v in rgb_state.items())
    assert read_state_dict(str(path)).keys() == rgb_state.keys()


def test_read_legacy_torch_file(tmp_path):
    state = {"w": torch.randn(3, 2), "n": torch.tensor(5)}
    path = tmp_path / "legacy.pt"
    torch.save(state, path, _use_new_zipfile_serialization=False)
    assert read_checkpoint(path)[1].format == "torch (legacy)"
    out = read_state_dict(path)
    assert out.keys() == state.keys() and torch.equal(out["w"], state["w"])


def test_read_safetensors_round_trip(tmp_path):
    state = {"a.weight": torch.randn(4, 3), "a.bias": torch.randn(4).half(), "n": torch.tensor(2)}
    path = tmp_path / "w.safetensors"
    save_file(state, str(path))
    out = read_state_dict(path)
    assert out.keys() == state.keys()
    for k, v in state.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v)


def test_unknown_extension_is_tried_as_torch_then_refused(tmp_path):
    good = tmp_path / "weights.data"
    torch.save({"x": torch.ones(2)}, good)
    assert torch.equal(read_state_dict(good)["x"], torch.ones(2))
    junk = tmp_path / "junk.data"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match=r"junk\.data.*unknown extension") as info:
        read_state_dict(junk)
    assert "code" not in str(info.value)  # garbage is not reported as an unsafe pickle
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match=r"corrupt\.pt.*not a valid torch.save file"):
        read_state_dict(corrupt)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        read_state_dict(tmp_path / "nope.pt")
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        load_partial(nn.Linear(1, 1), str(tmp_path / "nope.safetensors"))


def test_pickle_with_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "marker.txt"
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "payload": MaliciousPickle(str(marker))}, path)
    with pytest.raises(ValueError, match=r"evil\.pt.*weights_only") as info:
        read_state_dict(path)
    assert "write_marker" in str(info.value)
    with pytest.raises(ValueError, match="weights_only"):
        load_partial(nn.Linear(2, 1), path)
    assert not marker.exists()
    # The payload is real: an unrestricted load runs it (so the check above can fail).
    torch.load(path, weights_only=False)
    assert marker.read_text() == "pwned"


def test_legacy_pickle_with_code_is_refused(tmp_path):
    marker = tmp_path / "marker.txt"
    path = tmp_path / "evil_legacy.pth"
    torch.save(
        {"payload": MaliciousPickle(str(marker))}, path, _use_new_zipfile_serialization=False
    )
    with pytest.raises(ValueError, match="weights_only"):
        read_state_dict(path)
    assert not marker.exists()


def _system_call_payload():
    """A pickled ``os.system`` call (torch blocks the ``posix`` module by name)."""
    import os as _os

    class Payload:
        def __reduce__(self):
            return (_os.system, ("exit 3",))

    return Payload()


def test_pickle_of_a_blocked_module_function_gets_the_same_clear_error(tmp_path):
    path = tmp_path / "system.pt"
    torch.save({"x": _system_call_payload()}, path)
    with pytest.raises(ValueError, match=r"refusing to load .*system\.pt.*'(posix|nt)\.system'"):
        read_state_dict(path)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("empty.pt", b"", r"not a valid torch.save file \(EOFError"),
        ("junk.pth", b"\x80\x02not a pickle at all", "not a valid torch.save file"),
        ("junk.safetensors", b"\xff" * 64, r"not a valid \.safetensors file"),
    ],
)
def test_unreadable_files_raise_value_errors(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match):
        read_state_dict(path)


def test_zip_that_is_not_a_torch_file(tmp_path):
    import zipfile

    path = tmp_path / "archive.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "hello")
    with pytest.raises(ValueError, match=r"archive\.pt.*not a valid torch.save file"):
        read_state_dict(path)


@pytest.mark.parametrize("container", ["state_dict", "model", "model_state", "model_state_dict"])
def test_containers_are_unwrapped_and_non_tensors_dropped(tmp_path, container):
    inner = {"a": torch.ones(2), "b": torch.zeros(1)}
    ckpt = {container: inner, "epoch": 3, "optimizer": {"state": {}, "lr": 0.1}}
    path = tmp_path / "ckpt.pth"
    torch.save(ckpt, path)
    state, info = read_checkpoint(path)
    assert sorted(state) == ["a", "b"]
    assert info.containers == [container]
    assert sorted(info.other_keys) == ["epoch", "optimizer"]


def test_nested_containers_and_top_level_non_tensors():
    inner = {"a": torch.ones(2), "step": 10, "cfg": {"x": 1}}
    report = load_partial(nn.Module(), {"model": {"state_dict": inner}})
    assert report.unexpected == ["a"]  # "step" and "cfg" are not tensors: dropped


def test_ema_is_picked_only_when_asked(tmp_path):
    ckpt = {"state_dict": {"w": torch.zeros(1)}, "state_dict_ema": {"w": torch.ones(1)}}
    path = tmp_path / "ema.pt"
    torch.save(ckpt, path)
    assert read_state_dict(path)["w"].item() == 0.0
    assert read_state_dict(path, key="state_dict_ema")["w"].item() == 1.0
    with pytest.raises(KeyError, match="model_ema"):
        read_state_dict(path, key="model_ema")
    torch.save({"state_dict_ema": {"w": torch.ones(1)}, "epoch": 1}, path)
    with pytest.raises(ValueError, match="no tensors.*key="):
        read_state_dict(path)


def test_load_partial_takes_key_as_read_state_dict(tmp_path):
    ckpt = {
        "state_dict": {"weight": torch.zeros(1, 1)},
        "state_dict_ema": {"weight": torch.ones(1, 1)},
    }
    path = tmp_path / "ema.pt"
    torch.save(ckpt, path)
    for source in (path, str(path), ckpt):
        model = nn.Linear(1, 1, bias=False)
        assert load_partial(model, source, key="state_dict_ema").loaded == ["weight"]
        assert model.weight.item() == 1.0
        load_partial(model, source)  # no key: the plain weights, as read_state_dict
        assert model.weight.item() == 0.0
        with pytest.raises(KeyError, match="no mapping under key 'model_ema'"):
            load_partial(model, source, key="model_ema")
        with pytest.raises(TypeError, match="key must be a str or None, got int"):
            load_partial(model, source, key=0)  # type: ignore[arg-type]


def test_modules_held_in_memory_give_their_state_dicts():
    # What some frameworks keep and save: whole models in the checkpoint dict (ultralytics:
    # {"model": None, "ema": model} once stripped); a file of it loads (test_weights_modules).
    torch.manual_seed(0)
    trained = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    fresh = lambda: nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))  # noqa: E731
    for source, key in [
        ({"model": trained, "epoch": 3}, None),
        ({"model": None, "ema": trained}, "ema"),
        ({"model": {"model": trained}}, None),
        (trained, None),
        (nn.DataParallel(trained), None),  # module.* keys, stripped as for a state dict
    ]:
        model = fresh()
        report = load_partial(model, source, key=key, strict=True)
        assert report.num_loaded == 4
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), trained.parameters()))
    with pytest.raises(
        ValueError, match=r"no tensors.*'model', 'ema'.*with key=\.\.\. \(load_partial"
    ):
        load_partial(fresh(), {"model": None, "ema": trained})


def test_module_prefix_stripped_only_when_every_key_has_it(tmp_path):
    path = tmp_path / "ddp.pt"
    torch.save({"module.a": torch.ones(1), "module.b": torch.ones(1)}, path)
    assert sorted(read_state_dict(path)) == ["a", "b"]
    torch.save({"module.a": torch.ones(1), "b": torch.ones(1)}, path)
    assert sorted(read_state_dict(path)) == ["b", "module.a"]


def test_non_mapping_file_is_refused(tmp_path):
    path = tmp_path / "tensor.pt"
    torch.save(torch.ones(3), path)
    with pytest.raises(TypeError, match="not a mapping"):
        read_state_dict(path)


def _mixed_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    shared = torch.randn(40)
    base = torch.randn(6, 5)
    return collections.OrderedDict(
        f32=torch.randn(3, 4),
        f16=torch.randn(7).half(),
        bf16=torch.randn(2, 3).bfloat16(),
        f64=torch.randn(5, dtype=torch.float64),
        i64=torch.arange(9) * 1000003,
        i8=torch.arange(-4, 4, dtype=torch.int8),
        u8=torch.arange(7, dtype=torch.uint8),
        flag=torch.tensor([True, False, True]),
        c64=torch.randn(3, dtype=torch.complex64),
        scalar=torch.tensor(9),
        empty=torch.zeros(0, 3),
        view_a=shared[:8],
        view_b=shared[10:30].view(4, 5),
        transposed=base.t(),
    )


def test_read_gives_what_torch_load_gives_for_every_dtype_and_view(tmp_path):
    state = _mixed_state()
    path = tmp_path / "mixed.pth"
    torch.save(state, path)
    got, info = read_checkpoint(path)
    assert info.format == "torch (zip, mmap)" and info.mmap
    expected = torch.load(path, weights_only=True)
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].stride() == value.stride(), key
        assert torch.equal(got[key], value), key
    assert got["view_a"].untyped_storage().data_ptr() == got["view_b"].untyped_storage().data_ptr()
    torch.save(nn.Linear(2, 3).state_dict(keep_vars=True), path)  # nn.Parameter values
    got, info = read_checkpoint(path)
    assert info.format == "torch (zip, mmap)" and set(got) == {"weight", "bias"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs")
def test_tensors_are_views_of_the_mapped_file(tmp_path):
    data = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    path = tmp_path / "big.pt"
    torch.save({"w": data}, path)
    state = read_state_dict(path)
    assert resident_file_kib(path) < 64  # mapped, not read yet
    assert torch.equal(state["w"], data)  # faults the pages in
    assert resident_file_kib(path) >= 4096
    state["w"].add_(1)  # copy-on-write: the file stays as it was
    assert torch.equal(read_state_dict(path)["w"], data)


def test_a_tensor_outside_its_storage_is_refused(tmp_path):
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buffer)
    path = tmp_path / "x.pt"
    with zipfile.ZipFile(buffer) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl"):
                data = data.replace(b"K\x04\x85", b"K\x05\x85")  # size 5, 4 floats stored
            dst.writestr(info, data)
    with pytest.raises(ValueError, match=r"x\.pt.*not a valid torch\.save file"):
        read_checkpoint(path)


def test_loading_from_a_mapped_file_twice_gives_the_same_weights(tmp_path, rgb_state):
    path = tmp_path / "r18.pth"
    torch.save(rgb_state, path)
    for _ in range(2):
        model = _resnet18()
        load_partial(model, path, strict=True)
        assert _equal_state(model, rgb_state)


# ---------------------------------------------------------------------------------- loading
def test_head_swap_loads_everything_but_fc(tmp_path, rgb_state):
    path = tmp_path / "r18.pth"
    torch.save({"state_dict": rgb_state, "epoch": 90}, path)
    model = _resnet18(10)
    report = load_partial(model, path)
    assert report.mismatched == {
        "fc.weight": ((1000, 512), (10, 512)),
        "fc.bias": ((1000,), (10,)),
    }
    assert report.missing == [] and report.unexpected == [] and report.adapted == []
    assert report.num_model_keys == len(model.state_dict()) == 122
    assert report.num_loaded == 120 and not report.ok
    assert "layer1.0.bn1.num_batches_tracked" in report.loaded  # buffers count
    assert _equal_state(model, rgb_state, skip=("fc.",))


def test_copies_into_existing_parameters_with_dtype_cast(rgb_state):
    model = _resnet18().double()
    weight = model.conv1.weight
    load_partial(model, rgb_state)
    assert model.conv1.weight is weight and weight.dtype == torch.float64
    assert weight.requires_grad
    torch.testing.assert_close(weight, rgb_state["conv1.weight"].double(), rtol=0, atol=0)
    assert model.bn1.num_batches_tracked.item() == 7


def test_module_prefix_is_stripped_and_reported(rgb_state):
    ddp = {"module." + k: v for k, v in rgb_state.items()}
    model = _resnet18()
    report = load_partial(model, ddp, strict=True)
    assert report.ok and report.num_loaded == 122
    assert report.renamed["module.conv1.weight"] == "conv1.weight"
    assert len(report.renamed) == 122
    # without stripping (and without the automatic prefix) nothing matches
    report = load_partial(
        _resnet18(), ddp, strip_prefixes=(), auto_prefix=False, min_loaded=0, dry_run=True
    )
    assert report.num_loaded == 0 and len(report.unexpected) == 122
    # the automatic prefix finds it when the explicit stripping is turned off
    report = load_partial(_resnet18(), ddp, strip_prefixes=(), dry_run=True)
    assert report.ok and report.prefix_change == ("module.", "")


def test_rename_detector_backbone_keys(rgb_state):
    detector = {"backbone.body." + k: v for k, v in rgb_state.items() if not k.startswith("fc.")}
    detector["backbone.fpn.inner.weight"] = torch.zeros(256, 64, 1, 1)
    model = _resnet18()
    report = load_partial(model, detector, rename=[(r"^backbone\.body\.", "")])
    assert report.missing == ["fc.weight", "fc.bias"]
    assert report.unexpected == ["backbone.fpn.inner.weight"]
    assert report.renamed["backbone.body.layer4.1.bn2.bias"] == "layer4.1.bn2.bias"
    assert "backbone.fpn.inner.weight" not in report.renamed
    assert _equal_state(model, rgb_state, skip=("fc.",))


def test_rename_rules_apply_in_order_after_prefix_stripping():
    state = {"module.stem.conv.w": torch.ones(1)}
    model = nn.Module()
    model.register_buffer("trunk_conv_w", torch.zeros(1))
    rules = [(r"^stem\.", "trunk."), (r"\.", "_")]
    report = load_partial(model, state, rename=rules, strict=True)
    assert report.renamed == {"module.stem.conv.w": "trunk_conv_w"}
    assert model.trunk_conv_w.item() == 1.0


def test_rename_collision_and_bad_rules_are_errors():
    state = {"a.w": torch.ones(1), "b.w": torch.ones(1)}
    with pytest.raises(ValueError, match="'a.w' and 'b.w' both become 'w'"):
        load_partial(nn.Linear(1, 1), state, rename=[(r"^[ab]\.", "")])
    with pytest.raises(ValueError, match=r"invalid regex '\('"):
        load_partial(nn.Linear(1, 1), state, rename=[("(", "")])
    with pytest.raises(TypeError, match="pair"):
        load_partial(nn.Linear(1, 1), state, rename=[("a", "b", "c")])
    with pytest.raises(TypeError, match="model"):
        load_partial(state, state)


def _with_stem(in_channels: int) -> nn.Module:
    model = _resnet18()
    model.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    return model.eval()


def test_grey_input_gives_exactly_the_rgb_output(rgb_net, rgb_state):
    grey_model = _with_stem(1).double()
    report = load_partial(grey_model, rgb_state)
    assert report.adapted == ["conv1.weight"] and report.ok and report.num_loaded == 122
    x = torch.rand(2, 1, 32, 32, dtype=torch.float64)
    reference = copy.deepcopy(rgb_net).double()
    with torch.no_grad():
        torch.testing.assert_close(grey_model(x), reference(x.expand(-1, 3, -1, -1)))


@pytest.mark.parametrize("in_channels", [5, 2, 6])
def test_other_channel_counts_repeat_and_rescale(rgb_net, rgb_state, in_channels):
    model = _with_stem(in_channels)
    report = load_partial(model, rgb_state)
    assert report.adapted == ["conv1.weight"]
    rgb = rgb_state["conv1.weight"]
    for i in range(in_channels):
        torch.testing.assert_close(model.conv1.weight[:, i], rgb[:, i % 3] * 3 / in_channels)
    if in_channels % 3 == 0:  # each RGB channel used equally often: equal channels preserved
        x = torch.rand(1, 1, 32, 32)
        with torch.no_grad():
            got = model.conv1(x.expand(-1, in_channels, -1, -1))
            torch.testing.assert_close(got, rgb_net.conv1(x.expand(-1, 3, -1, -1)))


def test_adaptation_off_reports_the_stem_as_mismatched(rgb_state):
    report = load_partial(_with_stem(1), rgb_state, adapt_input_channels=False)
    assert report.adapted == []
    assert report.mismatched == {"conv1.weight": ((64, 3, 7, 7), (64, 1, 7, 7))}


def test_only_the_first_conv_is_adapted(rgb_state):
    state = dict(rgb_state)
    state["layer1.0.conv1.weight"] = torch.randn(64, 32, 3, 3)  # differs in I, not the stem
    report = load_partial(_with_stem(1), state)
    assert report.adapted == ["conv1.weight"]
    assert "layer1.0.conv1.weight" in report.mismatched


def test_a_head_conv_registered_before_the_stem_does_not_hide_it(rgb_state):
    class HeadFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Conv2d(512, 8, 1)  # first 4-D weight in state-dict order
            self.body = _with_stem(1)

    model = HeadFirst()
    state = {f"body.{k}": v for k, v in rgb_state.items()}
    state["head.weight"], state["head.bias"] = torch.randn(8, 512, 1, 1), torch.randn(8)
    report = load_partial(model, state)
    assert report.adapted == ["body.conv1.weight"] and not report.mismatched
    torch.testing.assert_close(
        model.body.conv1.weight, rgb_state["conv1.weight"].sum(1, keepdim=True)
    )


def test_a_ddp_wrapped_model_loads_its_own_checkpoint(rgb_state):
    class Wrapped(nn.Module):  # what DistributedDataParallel / DataParallel look like
        def __init__(self) -> None:
            super().__init__()
            self.module = _resnet18()

    model = Wrapped()
    wrapped_state = {f"module.{k}": v for k, v in rgb_state.items()}
    report = load_partial(model, wrapped_state)
    assert report.ok and report.num_loaded == len(rgb_state)
    assert _equal_state(model.module, rgb_state)
    plain = load_partial(_resnet18(), wrapped_state)  # a plain model still gets them stripped
    assert plain.ok and len(plain.renamed) == len(rgb_state)


def test_tied_parameters_load_through_either_name():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(4, 4, bias=False)
            self.out = nn.Linear(4, 4, bias=False)
            self.out.weight = self.embed.weight

    model = Tied()
    value = torch.randn(4, 4)
    report = load_partial(model, {"embed.weight": value})
    assert report.loaded == ["embed.weight", "out.weight"] and report.missing == []
    assert torch.equal(model.out.weight, value)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fp16 = nn.Parameter(torch.zeros(5, 7, dtype=torch.float16))
        self.brain = nn.Parameter(torch.zeros(3, 4, dtype=torch.bfloat16))
        self.register_buffer("steps", torch.zeros(6, dtype=torch.int64))
        self.register_buffer("empty", torch.zeros(0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="procfs")
def test_loading_a_file_copies_every_dtype_and_closes_it(tmp_path):
    torch.manual_seed(0)
    state = {k: torch.randn_like(v.float()).to(v.dtype) for k, v in _Net().state_dict().items()}
    state["steps"] = torch.arange(6) * 1000003
    state["bn.num_batches_tracked"] = torch.tensor(9)
    path = tmp_path / "net.pth"
    torch.save(state, path)
    model = _Net()
    versions = {k: v._version for k, v in model.state_dict().items()}
    before = set(os.listdir("/proc/self/fd"))
    assert load_partial(model, path, strict=True).ok
    assert set(os.listdir("/proc/self/fd")) <= before
    for key, value in model.state_dict().items():
        assert value.dtype == state[key].dtype and torch.equal(value, state[key]), key
        assert value._version > versions[key], key  # copied in place, as copy_ does


def test_views_non_contiguous_and_converted_tensors_load_as_with_copy(tmp_path):
    torch.manual_seed(1)
    state = dict(_Net().state_dict())
    state["conv.weight"] = torch.randn(8, 3, 3, 3).transpose(0, 1).contiguous().transpose(0, 1)
    shared = torch.randn(20)
    state["bn.weight"], state["bn.bias"] = shared[:8], shared[10:18]  # views of one storage
    state["fp16"] = torch.randn(5, 7, dtype=torch.float64)  # converted on copy
    path = tmp_path / "views.pth"
    torch.save(state, path)
    model = _Net()
    load_partial(model, path, strict=True)
    expected = _Net()
    expected.load_state_dict(torch.load(path))
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected.state_dict()[key]), key


def test_inference_tensors_still_refuse_the_load(tmp_path):
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "lin.pt")
    with torch.inference_mode():
        model = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="[Ii]nference"):
        load_partial(model, tmp_path / "lin.pt")


def test_tied_targets_load_in_order(tmp_path):
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4, bias=False)
            self.b = nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight

    path = tmp_path / "tied.pth"
    first, second = torch.randn(4, 4), torch.randn(4, 4)
    torch.save({"a.weight": first, "b.weight": second}, path)
    model = Tied()
    load_partial(model, path, strict=True)
    assert torch.equal(model.a.weight, second)  # the later key wins, as with copy_ in turn


def test_meta_device_model_is_refused_before_copying():
    with torch.device("meta"):
        model = nn.Linear(3, 2)
    state = {"weight": torch.ones(2, 3), "bias": torch.zeros(2)}
    assert load_partial(model, state, dry_run=True).ok  # a dry run copies nothing: fine
    with pytest.raises(ValueError, match="meta device.*to_empty"):
        load_partial(model, state)


# ---------------------------------------------------------------------------------- guards
def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_dry_run_changes_nothing(rgb_state):
    model = _resnet18(10)
    before = _snapshot(model)
    report = load_partial(model, rgb_state, dry_run=True)
    assert report.dry_run and report.num_loaded == 120 and len(report.mismatched) == 2
    assert _equal_state(model, before)
    assert "dry run" in str(report).splitlines()[0]
    real = load_partial(model, rgb_state)
    assert (real.loaded, real.mismatched) == (report.loaded, report.mismatched)
    assert not _equal_state(model, before, skip=("fc.",))


def test_strict_raises_with_report_and_leaves_model_unchanged(rgb_state):
    model = _resnet18(10)
    before = _snapshot(model)
    with pytest.raises(LoadError, match="strict load failed: 0 missing, 2 mismatched") as info:
        load_partial(model, rgb_state, strict=True)
    assert isinstance(info.value, RuntimeError)
    assert info.value.report.mismatched.keys() == {"fc.weight", "fc.bias"}
    assert "fc.weight: (1000, 512) vs (10, 512)" in str(info.value)
    assert _equal_state(model, before)
    assert load_partial(_resnet18(), rgb_state, strict=True).ok


def test_strict_fails_on_unexpected_keys(rgb_state):
    state = {**rgb_state, "extra.weight": torch.zeros(1)}
    with pytest.raises(LoadError, match="1 unexpected"):
        load_partial(_resnet18(), state, strict=True)


def test_skip_mismatched_false_raises(rgb_state):
    model = _resnet18(10)
    before = _snapshot(model)
    with pytest.raises(LoadError, match="2 tensor.*different shape"):
        load_partial(model, rgb_state, skip_mismatched=False)
    assert _equal_state(model, before)


def test_require_patterns(rgb_state):
    model = _resnet18(10)
    before = _snapshot(model)
    with pytest.raises(
        LoadError, match=r"2 required key\(s\) not loaded: fc.weight \(mismatched\)"
    ):
        load_partial(model, rgb_state, require=["layer*", "fc.*"])
    assert _equal_state(model, before)
    report = load_partial(model, rgb_state, require="layer*")  # a single str is one pattern
    assert report.num_loaded == 120
    with pytest.raises(ValueError, match="'layer9.*' matches no key"):
        load_partial(model, rgb_state, require=["layer9.*"])
    partial = {k: v for k, v in rgb_state.items() if not k.startswith("layer4.1.")}
    with pytest.raises(LoadError, match=r"layer4\.1\.conv1\.weight \(missing\)"):
        load_partial(_resnet18(), partial, require=["layer4.*"])


def test_min_loaded(rgb_state):
    model = _resnet18(10)  # 120 of 122 keys load
    with pytest.raises(LoadError, match=re.escape("only 120/122 model keys (98.4%) loaded")):
        load_partial(model, rgb_state, min_loaded=0.99)
    assert load_partial(model, rgb_state, min_loaded=0.98).num_loaded == 120
    with pytest.raises(LoadError, match="only 0/"):  # a wrong architecture cannot "load"
        renamed = {"x." + k: v for k, v in rgb_state.items()}
        load_partial(model, renamed, min_loaded=0.5, auto_prefix=False)
    with pytest.raises(ValueError, match=r"min_loaded must be in \[0.0, 1.0\]"):
        load_partial(model, rgb_state, min_loaded=1.5)


def test_load_from_safetensors_path(tmp_path, rgb_state):
    path = tmp_path / "r18.safetensors"
    save_file(rgb_state, str(path))
    model = _resnet18()
    assert load_partial(model, path, strict=True).num_loaded == 122
    assert _equal_state(model, rgb_state)


# ---------------------------------------------------------------------------------- report
def test_report_str_counts_first_then_truncated_lists():
    report = LoadReport(
        loaded=["a"],
        missing=[f"m{i}" for i in range(13)],
        mismatched={"w": ((3, 2), (4, 2))},
        renamed={"module.a": "a"},
    )
    lines = str(report).splitlines()
    assert lines[0] == (
        "loaded 1/15 model keys (6.7%): 13 missing, 1 mismatched, 0 unexpected, "
        "0 adapted, 1 renamed"
    )
    assert lines[1] == "missing (13):"
    assert lines[2:12] == [f"  m{i}" for i in range(10)]
    assert lines[12] == "  ... and 3 more"
    assert lines[13:] == [
        "mismatched (1, checkpoint vs model shape):",
        "  w: (3, 2) vs (4, 2)",
        "renamed (1):",
        "  module.a -> a",
    ]
    assert "unexpected" not in "\n".join(lines[1:])  # empty sections are left out


def test_report_lists_every_pairing_on_request_and_new_sections_only_when_filled():
    renamed = {f"c{i}": f"k{i}" for i in range(12)}
    report = LoadReport(loaded=list(renamed.values()), missing=[f"m{i}" for i in range(12)],
                        renamed=renamed)  # fmt: skip
    short = str(report).splitlines()
    assert short == report.describe().splitlines()
    assert not any(line.startswith(("reshaped", "fused", "split", "matched")) for line in short)
    full = report.describe(all_pairs=True).splitlines()
    assert full[-12:] == [f"  c{i} -> k{i}" for i in range(12)]
    assert "  ... and 2 more" in full  # the missing keys stay short
    with pytest.raises(TypeError, match="all_pairs must be bool, got int"):
        report.describe(all_pairs=1)
    report.split = {"q.weight": ("in_proj_weight", 0, 3)}
    assert str(report).splitlines()[-14:-12] == [
        "split (1, chunks along dim 0):",
        "  in_proj_weight -> q.weight (chunk 1 of 3)",
    ]


def test_report_properties_on_empty_model():
    report = load_partial(nn.ReLU(), {})
    assert report.ok and report.num_model_keys == 0 and report.fraction_loaded == 1.0


def test_text_file_and_unusable_map_location_are_clear_errors(tmp_path):
    text = tmp_path / "notes.ckpt"
    text.write_text("hello")  # five bytes of text: torch's legacy reader raised KeyError: 101
    with pytest.raises(ValueError, match=r"notes\.ckpt': not a valid torch\.save file"):
        read_state_dict(text)
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(2)}, good)
    if not torch.cuda.is_available():  # the file is not blamed for a missing GPU
        with pytest.raises(ValueError, match="map_location='cuda' asks for CUDA, but CUDA is not"):
            read_state_dict(good, map_location="cuda")
    assert list(read_state_dict(good, map_location={"cuda:0": "cpu"})) == ["w"]
