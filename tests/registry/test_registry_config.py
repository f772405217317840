"""Config-key errors of `Registry.build`: the key path, did-you-mean, notes on builder errors."""

from __future__ import annotations

import sys

import pytest

import visionblocks.registry
from visionblocks._core.config_keys import config_key
from visionblocks.registry import LOSSES, MODELS, ConfigError, Registry


def _detector_cfg(**head):
    return {
        "type": "detector",
        "backbone": {"type": "vb_tiny", "out_indices": [1, 2, 3], "widths": [8, 8, 16, 16]},
        "neck": {"type": "fpn", "out_channels": 16},
        "head": {"type": "fcos", "num_convs": 1, **head},
    }


def test_config_typo_names_the_key_the_accepted_keys_and_a_close_one():
    with pytest.raises(ConfigError) as info:
        LOSSES.build({"type": "focal", "gama": 2})
    message = str(info.value)
    assert message.startswith("unexpected config key 'gama' (did you mean 'gamma'?) for losses")
    assert "Accepted keys: alpha, gamma, reduction, ignore_index, impl" in message
    assert isinstance(info.value, TypeError) and info.value.config_path == ""
    assert "unexpected keyword argument 'gama'" in str(info.value.__cause__)
    assert LOSSES.build({"type": "focal", "gamma": 1.0}).gamma == 1.0  # the fixed config builds


def test_nested_config_errors_name_the_key_path():
    parts = Registry("parts")

    @parts.register
    def head(num_classes, loss_cls=None):
        with config_key("loss_cls"):
            return num_classes, LOSSES.build(loss_cls)

    @parts.register
    def model(head):
        with config_key("head"):
            return parts.build(head)

    cfg = {"type": "model", "head": {"type": "head", "num_classes": 3, "loss_cls": None}}
    cfg["head"]["loss_cls"] = {"type": "focal", "gama": 2}
    with pytest.raises(ConfigError, match=r"'head\.loss_cls\.gama' \(did you mean 'gamma'\?\)"):
        parts.build(cfg)
    del cfg["head"]["num_classes"]
    with pytest.raises(ConfigError, match=r"^missing required config key 'head\.num_classes'"):
        parts.build(cfg)
    cfg["head"] = {"type": "head", "num_classes": 3, "loss_cls": {"type": "focall"}}
    with pytest.raises(KeyError, match=r"head\.loss_cls\.type: 'focall' is not in the losses"):
        parts.build(cfg)
    with pytest.raises(ConfigError, match="^unexpected config key 'gama'"):  # paths reset
        LOSSES.build({"type": "focal", "gama": 2})


def test_model_config_errors_name_the_key_path():
    with pytest.raises(ConfigError) as info:
        MODELS.build(_detector_cfg(num_classes=3, focal_gama=1.0))
    assert str(info.value).startswith(
        "unexpected config key 'head.focal_gama' (did you mean 'focal_gamma'?) for heads 'fcos'"
    )
    assert info.value.config_path == "head"
    with pytest.raises(ConfigError, match=r"unexpected config key 'head\.loss_cls' for heads"):
        MODELS.build(_detector_cfg(num_classes=3, loss_cls={"type": "focal"}))  # no such option
    with pytest.raises(ConfigError, match=r"^missing required config key 'head\.num_classes'"):
        MODELS.build(_detector_cfg())
    cfg = {**_detector_cfg(num_classes=3), "backbone": {"type": "resnet1888"}}
    with pytest.raises(KeyError) as info:
        MODELS.build(cfg)
    assert info.value.args[0].startswith("backbone.type: 'resnet1888' is not in the backbones")
    assert "Did you mean: 'resnet18'" in info.value.args[0]
    assert MODELS.build(_detector_cfg(num_classes=3)).head.num_classes == 3


def test_errors_inside_a_builder_keep_their_type_and_message():
    with pytest.raises(ValueError) as info:
        MODELS.build(_detector_cfg(num_classes=-1))
    assert str(info.value) == "num_classes must be in [1, 65536], got -1"  # not relabelled
    with pytest.raises(TypeError, match="^score_thresh must be") as type_info:
        MODELS.build(_detector_cfg(num_classes=3, score_thresh=None))
    assert not isinstance(type_info.value, ConfigError)
    if sys.version_info >= (3, 11):  # a note says which config entry raised it
        assert info.value.__notes__ == [
            "while building config key 'head' with heads 'fcos' (visionblocks.models.fcos.FCOSHead)"
        ]
    reg = Registry("anything")
    reg.register(lambda *args, **options: options, name="open")
    assert reg.build({"type": "open", "gama": 2}) == {"gama": 2}  # **kwargs takes any key


def test_config_error_is_public_in_the_registry_facade():
    from visionblocks._core import config_keys

    assert visionblocks.registry.ConfigError is config_keys.ConfigError
    assert "ConfigError" in visionblocks.registry.__all__
    assert "ConfigError" in dir(visionblocks.registry)
    assert issubclass(ConfigError, TypeError)
    assert "config_key" not in dir(visionblocks.registry)  # builders' helper, kept private
