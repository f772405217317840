"""The gallery: ``docs/scripts/make_gallery.py`` draws every picture, and ``docs/gallery.md``
shows exactly the committed ones."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "scripts" / "make_gallery.py"
PAGE = ROOT / "docs" / "gallery.md"
ASSETS = ROOT / "docs" / "assets" / "gallery"


def _script() -> ModuleType:
    """The gallery script as a module (importing it draws nothing)."""
    spec = importlib.util.spec_from_file_location("make_gallery", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_picture(path: Path, max_bytes: int) -> None:
    """A valid PNG, of a size readable at page width, under the size budget."""
    assert path.is_file(), f"{path} is missing"
    assert 0 < path.stat().st_size <= max_bytes, f"{path}: {path.stat().st_size} bytes"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG", path
        width, height = image.size
    assert 500 <= width <= 1600 and 300 <= height <= 1200, f"{path}: {width} x {height}"


@pytest.mark.slow
def test_quick_run_draws_every_picture(tmp_path):
    script = _script()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path / "gallery")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[6/6] check-coco" in done.stdout, done.stdout[-3000:]
    written = sorted(p.name for p in (tmp_path / "gallery").iterdir())
    assert written == sorted(script.PICTURES)
    for name in script.PICTURES:
        _check_picture(tmp_path / "gallery" / name, script.MAX_BYTES)


def test_page_shows_every_committed_picture():
    script = _script()
    shown = re.findall(r"\]\((assets/gallery/[^)\s]+)\)", PAGE.read_text())
    committed = sorted(p.name for p in ASSETS.iterdir())
    for link in shown:  # every picture the page shows (or links to) is committed
        assert (ROOT / "docs" / link).is_file(), f"docs/gallery.md shows a missing {link}"
    assert {Path(link).name for link in shown} == set(committed), "unreferenced pictures"
    assert committed == sorted(script.PICTURES), "the assets are not the script's output"
    for name in committed:
        _check_picture(ASSETS / name, script.MAX_BYTES)


def test_page_says_how_to_regenerate():
    text = PAGE.read_text()
    assert "python docs/scripts/make_gallery.py" in text
    assert "`docs/scripts/make_gallery.py`" in text
