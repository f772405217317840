"""`LoadReport` and `LoadError`: what `load_partial` did (see `visionblocks.weights`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from visionblocks._core.checks import format_shape
from visionblocks._core.namespace import public_dir

__all__ = ["LoadError", "LoadReport"]
__dir__ = public_dir(__name__, __all__)

_SHOW = 10  # list entries shown per section of str(LoadReport)

Shape = tuple[int, ...]


@dataclass
class LoadReport:
    """What `load_partial` did with each key.

    Every key of the model's state dict (parameters *and* buffers, such as BatchNorm running
    statistics and ``num_batches_tracked``) is in exactly one of ``loaded``, ``mismatched``
    and ``missing``. Keys are model names, i.e. checkpoint names after prefix stripping and
    renaming.

    Attributes:
        loaded: Model keys that received a tensor (adapted ones included).
        missing: Model keys for which the checkpoint had no tensor.
        unexpected: Checkpoint keys (after renaming) that the model does not have.
        mismatched: ``{key: (checkpoint_shape, model_shape)}`` for tensors skipped because
            their shapes differ.
        adapted: Keys loaded after adapting the first convolution to the model's number of
            input channels.
        renamed: ``{checkpoint key: new key}`` for every key that prefix stripping,
            ``rename`` or the automatic prefix change changed.
        prefix_change: ``(removed, added)`` when ``load_partial`` found a key prefix to
            remove (``("model.", "")``) or to add (``("", "backbone.")``) by itself
            (``auto_prefix``); None otherwise.
        dry_run: True when nothing was copied (``load_partial(..., dry_run=True)``).

    Examples:
        >>> report = LoadReport(loaded=["a"], missing=["b"], unexpected=["c"])
        >>> report.num_loaded, report.num_model_keys, report.fraction_loaded, report.ok
        (1, 2, 0.5, False)
        >>> print(report)
        loaded 1/2 model keys (50.0%): 1 missing, 0 mismatched, 1 unexpected, 0 adapted, 0 renamed
        missing (1):
          b
        unexpected (1):
          c
    """

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: dict[str, tuple[Shape, Shape]] = field(default_factory=dict)
    adapted: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)
    prefix_change: tuple[str, str] | None = None
    dry_run: bool = False

    @property
    def num_loaded(self) -> int:
        """Number of model keys that received a tensor."""
        return len(self.loaded)

    @property
    def num_model_keys(self) -> int:
        """Number of keys in the model's state dict."""
        return len(self.loaded) + len(self.mismatched) + len(self.missing)

    @property
    def fraction_loaded(self) -> float:
        """``num_loaded / num_model_keys`` (1.0 for a model without state)."""
        total = self.num_model_keys
        return self.num_loaded / total if total else 1.0

    @property
    def ok(self) -> bool:
        """True when nothing is missing, unexpected or mismatched."""
        return not (self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        head = (
            f"loaded {self.num_loaded}/{self.num_model_keys} model keys "
            f"({100 * self.fraction_loaded:.1f}%): {len(self.missing)} missing, "
            f"{len(self.mismatched)} mismatched, {len(self.unexpected)} unexpected, "
            f"{len(self.adapted)} adapted, {len(self.renamed)} renamed"
        )
        lines = [head + (" (dry run: nothing copied)" if self.dry_run else "")]
        if self.prefix_change is not None:
            removed, added = self.prefix_change
            what = f"removed {removed!r}" if removed else f"added {added!r}"
            lines.append(f"prefix: {what} (found automatically; auto_prefix=False turns it off)")
        mismatched = [
            f"{k}: {format_shape(a)} vs {format_shape(b)}" for k, (a, b) in self.mismatched.items()
        ]
        sections = [
            ("missing", "", self.missing),
            ("mismatched", ", checkpoint vs model shape", mismatched),
            ("unexpected", "", self.unexpected),
            ("adapted", "", self.adapted),
            ("renamed", "", [f"{old} -> {new}" for old, new in self.renamed.items()]),
        ]
        for name, note, items in sections:
            if items:
                lines.append(f"{name} ({len(items)}{note}):")
                lines.extend(f"  {item}" for item in items[:_SHOW])
                if len(items) > _SHOW:
                    lines.append(f"  ... and {len(items) - _SHOW} more")
        return "\n".join(lines)


class LoadError(RuntimeError):
    """A guard of `load_partial` failed; ``report`` holds the `LoadReport` (nothing was copied).

    Attributes:
        report: What the load would have done.
    """

    def __init__(self, message: str, report: LoadReport) -> None:
        super().__init__(f"{message}\n{report}")
        self.report = report
