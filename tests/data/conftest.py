"""Fixtures shared by the data tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.coco_fixtures import write_dataset


@pytest.fixture(scope="session")
def coco_dir(tmp_path_factory) -> tuple[Path, Path]:
    """``(image root, annotation file)`` of the hand-made dataset in `coco_fixtures`."""
    root = tmp_path_factory.mktemp("coco")
    return root / "images", write_dataset(root)
