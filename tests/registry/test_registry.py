"""Registry behaviour: registration forms, lookup, build, listing, plugins."""

from __future__ import annotations

import sys
import types
import warnings
from importlib import metadata

import pytest

from visionblocks._core import plugins as plugins_mod
from visionblocks.registry import (
    BACKBONES,
    DATASETS,
    HEADS,
    INITIALIZERS,
    LAYERS,
    LOSSES,
    NECKS,
    REGISTRIES,
    Registry,
    get_registry,
    load_plugins,
)


class Widget:
    def __init__(self, size=1, colour="red"):
        self.size = size
        self.colour = colour


def make_registry() -> Registry:
    reg = Registry("widgets")
    reg.register(Widget, aliases=("w",))
    return reg


def test_decorator_forms_return_object_unchanged():
    reg = Registry("things")

    @reg.register
    def plain():
        return 1

    @reg.register(name="custom", aliases=["c1", "c2"])
    def named():
        return 2

    assert plain() == 1 and named() == 2
    assert reg.get("plain") is plain
    assert reg.get("custom") is named
    assert reg.get("c1") is named and reg.get("c2") is named
    assert "named" not in reg  # registered under its explicit name only


def test_call_form_and_single_string_alias():
    reg = Registry("things")
    out = reg.register(Widget, name="widget", aliases="wd")
    assert out is Widget
    assert reg.get("wd") is Widget
    assert reg.aliases("widget") == ["wd"]


def test_duplicate_names_raise_unless_force():
    reg = make_registry()
    with pytest.raises(KeyError, match="already registered"):
        reg.register(Widget)
    with pytest.raises(KeyError, match="already registered"):
        reg.register(dict, name="w")  # alias collision

    def other():
        return None

    reg.register(other, name="Widget", force=True)
    assert reg.get("Widget") is other
    # The replaced entry's alias no longer points anywhere stale.
    assert "w" not in reg


def test_force_over_alias_moves_it():
    reg = make_registry()
    reg.register(dict, name="w", force=True)
    assert reg.get("w") is dict
    assert reg.get("Widget") is Widget
    assert reg.aliases("Widget") == []


def test_invalid_registrations():
    reg = Registry("things")
    with pytest.raises(TypeError, match="only callables"):
        reg.register(42, name="answer")
    with pytest.raises(TypeError, match="non-empty strings"):
        reg.register(Widget, name="")
    with pytest.raises(TypeError, match="non-empty strings"):
        reg.register(Widget, aliases=(3,))
    with pytest.raises(KeyError, match="duplicate names"):
        reg.register(Widget, name="a", aliases=("a",))
    with pytest.raises(TypeError):
        Registry("")


def test_unknown_name_suggests_closest_matches():
    reg = make_registry()
    reg.register(dict, name="widget_large")
    with pytest.raises(KeyError) as info:
        reg.get("widgt")
    message = info.value.args[0]
    assert "'widgt' is not in the widgets registry" in message
    assert "'Widget'" in message  # case-insensitive closeness
    with pytest.raises(KeyError) as info:
        reg.get("zzzzzz")
    assert "Did you mean" not in info.value.args[0]
    with pytest.raises(TypeError, match="keys are strings"):
        reg.get(3)


def test_build_from_name_cfg_and_kwargs_override():
    reg = make_registry()
    w = reg.build("Widget", size=3)
    assert (w.size, w.colour) == (3, "red")
    cfg = {"type": "w", "size": 2, "colour": "blue"}
    w = reg.build(cfg, colour="green")
    assert (w.size, w.colour) == (2, "green")
    assert cfg == {"type": "w", "size": 2, "colour": "blue"}  # not mutated
    w = reg.build({"type": Widget, "size": 5})
    assert w.size == 5
    assert isinstance(reg.build("Widget", 7), Widget) and reg.build("Widget", 7).size == 7


def test_build_errors():
    reg = make_registry()
    with pytest.raises(KeyError, match="'type' key"):
        reg.build({"size": 1})
    with pytest.raises(TypeError, match="registered name or a callable"):
        reg.build({"type": 3})
    with pytest.raises(TypeError, match="name or a config dict"):
        reg.build(3)
    with pytest.raises(KeyError, match="Did you mean"):
        reg.build({"type": "Widgte"})


def test_list_contains_len_iter():
    reg = make_registry()
    reg.register(dict, name="resnet50")
    reg.register(list, name="resnet18")
    assert reg.list() == ["Widget", "resnet18", "resnet50"]
    assert reg.list("resnet*") == ["resnet18", "resnet50"]
    assert reg.list("*50") == ["resnet50"]
    assert "w" in reg and "resnet18" in reg and "nope" not in reg and 3 not in reg
    assert len(reg) == 3
    assert list(reg) == ["Widget", "resnet18", "resnet50"]
    assert "widgets" in repr(reg)


def test_builtin_modules_imported_on_first_miss(tmp_path, monkeypatch):
    pkg = tmp_path / "vb_fake_builtin.py"
    pkg.write_text(
        "from tests.registry.test_registry import LAZY\n"
        "@LAZY.register\n"
        "def lazily_registered():\n"
        "    return 'ok'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert LAZY.get("lazily_registered")() == "ok"


LAZY = Registry("lazy", modules=("vb_fake_builtin",))


def test_global_registries():
    for reg in (BACKBONES, NECKS, HEADS, LOSSES, LAYERS, INITIALIZERS, DATASETS):
        assert isinstance(reg, Registry)
        assert REGISTRIES[reg.name] is reg
        assert reg.description
    assert get_registry("losses") is LOSSES
    with pytest.raises(KeyError, match="Did you mean 'losses'"):
        get_registry("loses")


def _pixels(rest):
    if not rest.isdigit():
        raise KeyError(f"'px/{rest}' is not a number of pixels")
    return lambda scale=1: int(rest) * scale


def _suggest_pixels(name):
    return ["px/" + name] if name.isdigit() else []


def test_namespace_resolves_a_family_of_names():
    reg = make_registry()
    reg.add_namespace("px/", _pixels, suggest=_suggest_pixels)
    assert reg.build("px/32") == 32
    assert reg.build({"type": "px/8", "scale": 2}) == 16
    assert reg.get("px/4")() == 4
    assert "px/32" in reg and "px/big" not in reg and "px/" not in reg
    assert reg.list() == ["Widget"] and len(reg) == 1 and list(reg) == ["Widget"]
    with pytest.raises(KeyError, match="'px/big' is not a number of pixels"):
        reg.get("px/big")
    # a miss outside the namespace suggests the namespaced form, before registered names
    with pytest.raises(KeyError) as info:
        reg.get("32")
    assert "Did you mean: 'px/32'?" in info.value.args[0]
    assert "plus the names starting with 'px/'" in info.value.args[0]
    with pytest.raises(KeyError, match="Did you mean: 'Widget'"):
        reg.get("widgt")
    # registered names win over the namespace
    reg.register(lambda: "registered", name="px/1")
    assert reg.build("px/1") == "registered"


def test_namespace_errors_and_replacement():
    reg = make_registry()
    with pytest.raises(TypeError, match="non-empty str"):
        reg.add_namespace("", _pixels)
    with pytest.raises(TypeError, match="resolve must be callable"):
        reg.add_namespace("px/", None)
    with pytest.raises(TypeError, match="suggest must be callable"):
        reg.add_namespace("px/", _pixels, suggest="no")
    reg.add_namespace("px/", _pixels)
    with pytest.raises(KeyError, match="already in the widgets registry"):
        reg.add_namespace("px/", _pixels)

    def malformed(rest):
        raise ValueError("malformed")

    reg.add_namespace("px/", malformed, force=True)
    assert "px/1" not in reg  # ValueError: not in the registry
    with pytest.raises(ValueError, match="malformed"):
        reg.get("px/1")


def test_backbones_take_timm_names():
    """'timm/<model>' works wherever a backbone is named (issue 16)."""
    from visionblocks.backbones import build_backbone

    assert "timm/resnet18" in BACKBONES and "timm/resnet10t" in BACKBONES
    assert "timm/nonexistent_model_xyz" not in BACKBONES
    assert "timm/" not in BACKBONES and "timm/hf-hub:timm/resnet18.a1_in1k" not in BACKBONES
    assert "timm/resnet18" not in BACKBONES.list() and "timm" in BACKBONES.list()
    expected = build_backbone("timm/resnet10t", out_indices=(-2, -1)).feature_info
    by_name = BACKBONES.build("timm/resnet10t", out_indices=(-2, -1))
    by_cfg = BACKBONES.build({"type": "timm/resnet10t", "out_indices": (-2, -1)})
    by_get = BACKBONES.get("timm/resnet10t")(out_indices=(-2, -1))
    for backbone in (by_name, by_cfg, by_get):
        assert type(backbone) is type(by_name) and backbone.feature_info == expected
    assert list(by_cfg.state_dict()) == list(by_name.state_dict())


def test_backbone_misses_suggest_the_timm_form():
    with pytest.raises(KeyError) as info:
        BACKBONES.get("convnext_atto")  # a timm model, not a registered name
    assert "Did you mean: 'timm/convnext_atto'" in info.value.args[0]
    with pytest.raises(KeyError) as info:
        BACKBONES.get("convnext_tinny")  # the registered name, then the timm forms
    assert "Did you mean: 'convnext_tiny', 'timm/convnext_tiny'" in info.value.args[0]
    with pytest.raises(KeyError, match="Did you mean: 'resnet50'"):
        BACKBONES.get("resnet_50")
    with pytest.raises(KeyError) as info:
        BACKBONES.get("timm/resnet_18")
    message = info.value.args[0]
    assert "'resnet_18' is not a timm model" in message
    assert "Did you mean: 'timm/resnet18'" in message
    with pytest.raises(KeyError, match="'nonexistent_model_xyz' is not a timm model"):
        BACKBONES.build({"type": "timm/nonexistent_model_xyz"})
    with pytest.raises(ValueError, match="looks like a hub name"):
        BACKBONES.get("timm/hf-hub:timm/resnet18.a1_in1k")


def test_other_registries_have_no_timm_namespace():
    assert "timm/focal" not in LOSSES and "timm/resnet18" not in NECKS
    with pytest.raises(KeyError) as info:
        LOSSES.get("timm/focal")
    assert "'timm/focal' is not in the losses registry" in info.value.args[0]
    assert "timm" not in info.value.args[0].split("registry.")[1]  # no timm suggestion


def test_build_backbone_from_the_registry_facade():
    import visionblocks.backbones
    import visionblocks.registry
    from visionblocks.registry import build_backbone

    assert build_backbone is visionblocks.backbones.build_backbone
    assert visionblocks.registry.build_backbone is visionblocks.backbones.build_backbone
    assert "build_backbone" in dir(visionblocks.registry)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        visionblocks.registry.no_such_name  # noqa: B018


class _FakeEntryPoint:
    def __init__(self, name, value, target=None, error=None):
        self.name, self.value, self._target, self._error = name, value, target, error

    def load(self):
        if self._error is not None:
            raise self._error
        return self._target


@pytest.fixture
def plugin_env(monkeypatch):
    """Fake entry points and a fresh 'plugins not yet loaded' state."""
    eps: list = []
    monkeypatch.setattr(plugins_mod, "_entry_points", lambda group: list(eps))
    monkeypatch.setattr(plugins_mod, "_plugins_loaded", False)
    return eps


def test_plugin_module_loads_lazily_on_first_miss(plugin_env, monkeypatch):
    reg = Registry("plugin_target")
    module = types.ModuleType("vb_fake_plugin")
    calls = []

    def register():
        calls.append(1)
        reg.register(Widget, name="from_plugin")

    plugin_env.append(_FakeEntryPoint("fake", "vb_fake_plugin:register", target=register))
    assert calls == []  # nothing loaded at import / registry creation
    reg.register(dict, name="local")
    assert reg.get("local") is dict  # a hit does not trigger plugin loading
    assert calls == []
    assert reg.get("from_plugin") is Widget  # first miss loads plugins
    assert calls == [1]
    reg.list()
    assert calls == [1]  # loaded once per process
    monkeypatch.setitem(sys.modules, "vb_fake_plugin", module)


def test_plugin_loads_on_first_list(plugin_env):
    reg = Registry("plugin_target2")
    plugin_env.append(
        _FakeEntryPoint("lister", "x:y", target=lambda: reg.register(Widget, name="listed"))
    )
    assert reg.list() == ["listed"]


def test_broken_plugin_warns_and_does_not_crash(plugin_env):
    reg = Registry("plugin_target3")
    plugin_env.append(_FakeEntryPoint("broken_pkg", "broken_pkg.mod", error=ImportError("boom")))
    plugin_env.append(_FakeEntryPoint("good", "g:f", target=lambda: reg.register(Widget)))
    with pytest.warns(RuntimeWarning, match=r"plugin 'broken_pkg' \(broken_pkg.mod\).*boom"):
        assert reg.list() == ["Widget"]
    # Loaded once: no second warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg.list()
        with pytest.raises(KeyError):
            reg.get("still_missing")


def test_load_plugins_reports_names(plugin_env):
    plugin_env.append(_FakeEntryPoint("a", "a:b", target=lambda: None))
    assert load_plugins() == ["a"]
    assert load_plugins() == []
    assert load_plugins(force=True) == ["a"]


def test_real_entry_point_machinery(tmp_path, monkeypatch):
    """A plugin installed as a real distribution (dist-info with entry_points.txt)."""
    dist = tmp_path / "vb_demo_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vb-demo-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[visionblocks.plugins]\ndemo = vb_demo_plugin_mod:register\n"
    )
    (tmp_path / "vb_demo_plugin_mod.py").write_text(
        "from visionblocks.registry import LAYERS\n"
        "def register():\n"
        "    LAYERS.register(dict, name='vb_demo_plugin_layer', force=True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins_mod, "_plugins_loaded", False)
    names = [ep.name for ep in metadata.entry_points(group="visionblocks.plugins")]
    assert "demo" in names
    assert "vb_demo_plugin_layer" in LAYERS
    LAYERS._remove("vb_demo_plugin_layer")
