"""Loading a checkpoint of a backbone's own model into it (private; see
`visionblocks.backbones.build_backbone`'s ``pretrained``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from visionblocks.weights import LoadError, LoadReport, load_partial

__all__ = ["load_pretrained"]


def load_pretrained(
    backbone: nn.Module,
    source: str | os.PathLike[str] | Mapping[str, Any],
    what: str,
    rename: Sequence[tuple[str, str]] | None = None,
) -> LoadReport:
    """Load a checkpoint of the backbone's own model into it; every backbone key must load
    (``num_batches_tracked`` may be missing), else ``LoadError`` and nothing changes."""
    report = load_partial(backbone, source, rename=rename, dry_run=True)
    failed = [
        f"{key} ({'mismatched' if key in report.mismatched else 'missing'})"
        for key in (*report.mismatched, *report.missing)
        if not key.endswith("num_batches_tracked")
    ]
    if failed:
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        raise LoadError(
            f"pretrained: {len(failed)} of the {report.num_model_keys} tensors of {what} "
            f"would not load ({', '.join(failed[:5])}{more}). Is it a checkpoint of {what}? "
            "build_backbone(pretrained=...) loads the backbone's own weights and nothing "
            "else. To load a part of another checkpoint, build the backbone without "
            "pretrained and call visionblocks.weights.load_partial(backbone, path, "
            "rename=..., min_loaded=...) yourself",
            report,
        )
    return load_partial(backbone, source, rename=rename)
