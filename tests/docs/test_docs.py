"""Docs facts that running the pages (tests/docs/test_pages.py) does not check by itself."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_your_data_tutorial_lists_every_invalid_reason():
    from visionblocks.data import INVALID_REASONS

    text = (ROOT / "docs" / "learn" / "your-data.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \|", text, re.M)
    assert listed == list(INVALID_REASONS)


def test_the_check_coco_report_on_the_your_data_page_is_a_checked_console_block():
    text = (ROOT / "docs" / "learn" / "your-data.md").read_text()
    assert "```console\n$ visionblocks check-coco export/annotations.json --images" in text
    assert "'unknown_category'" in text


def test_the_demo_duration_is_quoted_only_on_the_benchmarks_page():
    # The tutorials that train (detector, segmenter) quote their own runs, not the demo's.
    own_figures = {"benchmarks.md", "changelog.md", "detector.md", "segmenter.md"}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    quoted = re.compile(r"(?:under|about|~)\s*(?:two|2|three|3)\s*minutes|~\s*\d+\s*s\b", re.I)
    offenders = [
        f"{page.relative_to(ROOT)}: {' '.join(paragraph.split())[:120]}"
        for page in pages
        if page.name not in own_figures
        for paragraph in re.split(r"\n\s*\n", page.read_text())
        if "demo" in paragraph.lower() and quoted.search(paragraph)
    ]
    assert not offenders, "link benchmarks.md#the-demo instead:\n" + "\n".join(offenders)
