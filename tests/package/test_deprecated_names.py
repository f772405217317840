"""Names renamed by issue 16 keep working for one release: same object, one warning, hidden.

Every public module that lost a name serves it from ``_DEPRECATED`` through its module
``__getattr__`` (`visionblocks._core.deprecation`), both in the package and in the submodule
that defined it.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings

import pytest

import visionblocks
from visionblocks._core.deprecation import reset_warned

# (module, old name, new name)
ALIASES = [
    ("visionblocks.losses", "FocalLoss", "SigmoidFocalLoss"),
    ("visionblocks.losses.focal", "FocalLoss", "SigmoidFocalLoss"),
    ("visionblocks.losses", "GIoULoss", "GeneralizedBoxIoULoss"),
    ("visionblocks.losses", "DIoULoss", "DistanceBoxIoULoss"),
    ("visionblocks.losses", "CIoULoss", "CompleteBoxIoULoss"),
    ("visionblocks.losses.iou", "GIoULoss", "GeneralizedBoxIoULoss"),
    ("visionblocks.losses.iou", "DIoULoss", "DistanceBoxIoULoss"),
    ("visionblocks.losses.iou", "CIoULoss", "CompleteBoxIoULoss"),
    ("visionblocks.ops", "local_filter", "local_filter2d"),
    ("visionblocks.ops.local", "local_filter", "local_filter2d"),
    ("visionblocks.data", "CocoDetection", "CocoInstances"),
    ("visionblocks.data.coco", "CocoDetection", "CocoInstances"),
]
IDS = [f"{module}.{old}" for module, old, _ in ALIASES]
# (module, old name, the module it moved to): served from the old place for one release
MOVES = [
    ("visionblocks.ops", "warp_sample", "visionblocks.transforms"),
    ("visionblocks.ops.warp_targets", "warp_sample", "visionblocks.transforms"),
]


@pytest.mark.parametrize(("module", "old", "new"), ALIASES, ids=IDS)
def test_alias_is_the_new_object_and_warns_once(module, old, new):
    mod = importlib.import_module(module)
    reset_warned()
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is deprecated.*0\.3.*{new}"):
        value = getattr(mod, old)
    assert value is getattr(mod, new)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        assert getattr(mod, old) is value
        namespace: dict[str, object] = {}
        exec(f"from {module} import {old}", namespace)  # the import statement, too
        assert namespace[old] is value


@pytest.mark.parametrize(("module", "old", "new"), ALIASES, ids=IDS)
def test_alias_is_hidden(module, old, new):
    mod = importlib.import_module(module)
    assert new in mod.__all__ and old not in mod.__all__
    assert old not in dir(mod) and new in dir(mod)
    assert old not in vars(mod)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        namespace: dict[str, object] = {}
        exec(f"from {module} import *", namespace)
    assert old not in namespace and new in namespace


@pytest.mark.parametrize(("module", "old", "home"), MOVES, ids=[f"{m}.{o}" for m, o, _ in MOVES])
def test_moved_name_is_the_new_object_and_warns_once(module, old, home):
    mod = importlib.import_module(module)
    reset_warned()
    with pytest.warns(
        DeprecationWarning, match=rf"{module}\.{old} is deprecated.*0\.3.*use {home}\.{old}"
    ):
        value = getattr(mod, old)
    assert value is getattr(importlib.import_module(home), old)
    assert old not in mod.__all__ and old not in dir(mod) and old not in vars(mod)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace: dict[str, object] = {}
        exec(f"from {module} import {old}", namespace)
        assert namespace[old] is value


def test_import_statement_warns_at_the_importer():
    reset_warned()
    with pytest.warns(DeprecationWarning) as record:
        from visionblocks.losses import FocalLoss  # noqa: F401
    assert record[0].filename == __file__


def test_every_deprecated_name_is_tested():
    declared = set()
    for info in pkgutil.walk_packages(visionblocks.__path__, "visionblocks."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        if info.name == "visionblocks.demo":  # a deprecated module (imported below)
            continue
        module = importlib.import_module(info.name)
        for old, (new, removed_in) in getattr(module, "_DEPRECATED", {}).items():
            assert removed_in == "0.3"
            declared.add((info.name, old, new))
    moved = {(m, old, f"{home}.{old}") for m, old, home in MOVES}
    assert declared == set(ALIASES) | moved


def test_unknown_names_still_raise_attribute_error():
    import visionblocks.losses

    with pytest.raises(AttributeError, match="has no attribute 'NoSuchLoss'"):
        visionblocks.losses.NoSuchLoss  # noqa: B018


def test_registry_names_keep_working():
    from visionblocks.data import CocoInstances
    from visionblocks.losses import (
        CompleteBoxIoULoss,
        DistanceBoxIoULoss,
        GeneralizedBoxIoULoss,
        SigmoidFocalLoss,
    )
    from visionblocks.registry import DATASETS, LOSSES

    assert isinstance(LOSSES.build({"type": "focal", "gamma": 1.0}), SigmoidFocalLoss)
    assert LOSSES.get("sigmoid_focal") is SigmoidFocalLoss
    for names, cls in [
        (("giou", "generalized_box_iou"), GeneralizedBoxIoULoss),
        (("diou", "distance_box_iou"), DistanceBoxIoULoss),
        (("ciou", "complete_box_iou"), CompleteBoxIoULoss),
    ]:
        assert all(LOSSES.get(name) is cls for name in names)
    for name in ("coco_detection", "coco", "coco_instances"):
        assert DATASETS.get(name) is CocoInstances


def test_demo_module_warns_on_import():
    saved = sys.modules.pop("visionblocks.demo", None)
    try:
        with pytest.warns(
            DeprecationWarning, match="visionblocks.demo moved to visionblocks.cli.demo"
        ):
            module = importlib.import_module("visionblocks.demo")
        from visionblocks.cli import demo

        assert module.__all__ == demo.__all__
        assert all(getattr(module, name) is getattr(demo, name) for name in demo.__all__)
    finally:
        if saved is None:
            sys.modules.pop("visionblocks.demo", None)
        else:
            sys.modules["visionblocks.demo"] = saved
