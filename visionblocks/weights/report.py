"""`LoadReport` and `LoadError`: what `load_partial` did (see `visionblocks.weights`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from visionblocks._core.checks import check_type, format_shape
from visionblocks._core.namespace import public_dir

__all__ = ["LoadError", "LoadReport"]
__dir__ = public_dir(__name__, __all__)

_SHOW = 10  # list entries shown per section of str(LoadReport)

Shape = tuple[int, ...]


@dataclass
class LoadReport:
    """What `load_partial` did with each key.

    Every key of the model's state dict (parameters *and* buffers, such as BatchNorm running
    statistics) is in exactly one of ``loaded``, ``mismatched`` and ``missing``. Keys are
    model names (checkpoint names after prefix stripping and renaming). With
    ``match="structure"`` every pairing of two names is in ``renamed``, ``fused`` or
    ``split``, and ``mismatched`` is empty.

    Attributes:
        loaded: Model keys that received a tensor (adapted ones included).
        missing: Model keys for which the checkpoint had no tensor.
        unexpected: Checkpoint keys (after renaming) that the model does not have.
        mismatched: ``{key: (checkpoint_shape, model_shape)}`` for tensors skipped because
            their shapes differ.
        adapted: Keys loaded after adapting the first convolution to the model's number of
            input channels.
        renamed: ``{checkpoint key: new key}`` for every key that prefix stripping,
            ``rename``, the automatic prefix change or (one to one) structure matching
            changed.
        prefix_change: ``(removed, added)``, e.g. ``("model.", "")`` or ``("", "backbone.")``,
            when ``auto_prefix`` found a prefix change; None otherwise.
        dry_run: True when nothing was copied (``load_partial(..., dry_run=True)``).
        match: ``load_partial``'s ``match``: ``"names"`` or ``"structure"``.
        reshaped: ``{model key: (checkpoint shape, model shape)}`` for tensors loaded with
            ``reshape`` (shapes equal once dimensions of size 1 are dropped).
        fused: ``{model key: [checkpoint keys]}`` for a model tensor loaded with their
            concatenation along dim 0 (``q``, ``k``, ``v`` into ``qkv``).
        split: ``{model key: (checkpoint key, chunk, chunks)}`` for a model tensor loaded
            with chunk ``chunk`` (from 0) of a checkpoint tensor cut into ``chunks`` along
            dim 0.

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
        >>> paired = LoadReport(
        ...     loaded=["qkv.weight", "scale"], match="structure",
        ...     renamed={"gamma": "scale"}, reshaped={"scale": ((8,), (8, 1, 1))},
        ...     fused={"qkv.weight": ["q.weight", "k.weight", "v.weight"]})
        >>> print(paired)
        loaded 2/2 model keys (100.0%): 0 missing, 0 mismatched, 0 unexpected, 0 adapted, 1 renamed
        matched by structure: module-tree order and shapes (describe(all_pairs=True) lists every pairing)
        reshaped (1, checkpoint vs model shape):
          scale: (8,) vs (8, 1, 1)
        fused (1, concatenated along dim 0):
          q.weight + k.weight + v.weight -> qkv.weight
        renamed (1):
          gamma -> scale
    """

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: dict[str, tuple[Shape, Shape]] = field(default_factory=dict)
    adapted: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)
    prefix_change: tuple[str, str] | None = None
    dry_run: bool = False
    match: str = "names"
    reshaped: dict[str, tuple[Shape, Shape]] = field(default_factory=dict)
    fused: dict[str, list[str]] = field(default_factory=dict)
    split: dict[str, tuple[str, int, int]] = field(default_factory=dict)

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
        return self.describe()

    def describe(self, all_pairs: bool = False) -> str:
        """The counts, then each non-empty section (what `str` gives).

        Args:
            all_pairs: List every pairing (the ``reshaped``, ``fused``, ``split`` and
                ``renamed`` sections) in full instead of the first 10 and ``... and N
                more``; the other sections stay short.

        Returns:
            str: One line of counts, then a header and the entries of each section.

        Examples:
            >>> report = LoadReport(loaded=[f"k{i}" for i in range(12)],
            ...                     renamed={f"c{i}": f"k{i}" for i in range(12)})
            >>> report.describe().splitlines()[-1]
            '  ... and 2 more'
            >>> report.describe(all_pairs=True).splitlines()[-1]
            '  c11 -> k11'
        """
        check_type("all_pairs", all_pairs, bool)
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
        if self.match == "structure":
            lines.append(
                "matched by structure: module-tree order and shapes "
                "(describe(all_pairs=True) lists every pairing)"
            )
        mismatched = [
            f"{k}: {format_shape(a)} vs {format_shape(b)}" for k, (a, b) in self.mismatched.items()
        ]
        reshaped = [
            f"{k}: {format_shape(a)} vs {format_shape(b)}" for k, (a, b) in self.reshaped.items()
        ]
        fused = [f"{' + '.join(parts)} -> {k}" for k, parts in self.fused.items()]
        split = [
            f"{old} -> {k} (chunk {chunk + 1} of {chunks})"
            for k, (old, chunk, chunks) in self.split.items()
        ]
        renamed = [f"{old} -> {new}" for old, new in self.renamed.items()]
        sections = [  # name, note, entries, whether they are pairings
            ("missing", "", self.missing, False),
            ("mismatched", ", checkpoint vs model shape", mismatched, False),
            ("unexpected", "", self.unexpected, False),
            ("adapted", "", self.adapted, False),
            ("reshaped", ", checkpoint vs model shape", reshaped, True),
            ("fused", ", concatenated along dim 0", fused, True),
            ("split", ", chunks along dim 0", split, True),
            ("renamed", "", renamed, True),
        ]
        for name, note, items, pairing in sections:
            if items:
                shown = len(items) if pairing and all_pairs else _SHOW
                lines.append(f"{name} ({len(items)}{note}):")
                lines.extend(f"  {item}" for item in items[:shown])
                if len(items) > shown:
                    lines.append(f"  ... and {len(items) - shown} more")
        return "\n".join(lines)


class LoadError(RuntimeError):
    """A guard of `load_partial` failed; ``report`` holds the `LoadReport` (nothing was copied).

    Attributes:
        report: What the load would have done.
    """

    def __init__(self, message: str, report: LoadReport) -> None:
        super().__init__(f"{message}\n{report}")
        self.report = report
