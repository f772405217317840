"""The docs build's hooks: the generated API index and the cross-links from prose."""

from __future__ import annotations

import importlib
import sys

import pytest

from .pages import ROOT

sys.path.insert(0, str(ROOT / "docs" / "scripts"))
public_api = importlib.import_module("public_api")
hooks = pytest.importorskip("mkdocs_hooks", reason="the docs extra (mkdocs) is not installed")

TARGETS = {"box_iou": "v.ops.boxes.box_iou", "visionblocks.ops.box_iou": "v.ops.boxes.box_iou"}


def test_code_spans_link_once_per_section_outside_code_and_headings():
    text = (
        "# `box_iou`\n"
        "Use `box_iou` and `box_iou(a, b)`.\n"
        "```python\nx = `box_iou`\n```\n"
        "## Next\n"
        "Again `visionblocks.ops.box_iou`, not [`box_iou`][x] or `other`.\n"
    )
    assert hooks.link_code_spans(text, TARGETS) == (
        "# `box_iou`\n"
        "Use [`box_iou`][v.ops.boxes.box_iou] and `box_iou(a, b)`.\n"
        "```python\nx = `box_iou`\n```\n"
        "## Next\n"
        "Again [`visionblocks.ops.box_iou`][v.ops.boxes.box_iou], not [`box_iou`][x] or `other`.\n"
    )


@pytest.mark.parametrize("peer", ["torchvision's", "kornia's", "OpenCV's", "mmcv's own"])
def test_a_peers_function_of_the_same_name_is_not_linked(peer):
    text = f"Unlike {peer} `box_iou`, ours"
    assert hooks.link_code_spans(text, TARGETS) == text


def test_every_public_name_is_indexed_once_with_its_defining_path():
    symbols = public_api.public_symbols()
    import visionblocks.losses
    import visionblocks.ops

    paths = {symbol.public_path for symbol in symbols}
    for module in (visionblocks.losses, visionblocks.ops):
        assert {f"{module.__name__}.{name}" for name in module.__all__} <= paths
    focal = next(s for s in symbols if s.public_path == "visionblocks.losses.sigmoid_focal_loss")
    assert focal.target == "visionblocks.losses.focal.sigmoid_focal_loss"
    assert focal.filepath == "visionblocks/losses/focal.py" and focal.lineno > 1
    page = public_api.api_index_markdown(symbols)
    assert page.count("\n| [`") == len(symbols)
    assert "visionblocks.demo" not in {symbol.module for symbol in symbols}


def test_short_names_of_different_objects_are_not_linked():
    make = public_api.Symbol
    symbols = [
        make("build", "a", "a.x.build", "function", "", "a/x.py", 1, 2),
        make("build", "b", "b.y.build", "function", "", "b/y.py", 1, 2),
        make("box_iou", "a", "a.z.box_iou", "function", "", "a/z.py", 1, 2),
        make("box_iou", "a.z", "a.z.box_iou", "function", "", "a/z.py", 1, 2),
    ]
    targets = public_api.link_targets(symbols)
    assert "build" not in targets and targets["a.build"] == "a.x.build"
    assert targets["box_iou"] == "a.z.box_iou"


def test_source_links_point_at_the_defining_lines():
    url = hooks.source_url("visionblocks.losses.focal.sigmoid_focal_loss", "https://r/x", "main")
    assert url.startswith("https://r/x/blob/main/visionblocks/losses/focal.py#L")
    assert hooks.source_url("visionblocks.no.such.thing", "https://r/x", "main") is None
