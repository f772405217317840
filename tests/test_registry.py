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
        "from tests.test_registry import LAZY\n"
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
