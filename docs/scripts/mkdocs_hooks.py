"""mkdocs hooks of the visionblocks docs (named under ``hooks:`` in ``mkdocs.yml``).

- ``reference/api.md`` is generated at build time from the package's ``__all__`` lists
  (``public_api.py``), one line per public name, so it cannot go stale. Its links use
  autorefs, so under ``--strict`` a public name without a rendered entry fails the build.
- Prose pages get links for free: an inline code span that names a public object
  (`` `sigmoid_focal_loss` ``, `` `visionblocks.ops.warp_affine(...)` ``) becomes a link to its
  reference entry, the first time per section.
- Every rendered object on a reference page gets a "source" link to its lines in the
  repository (``repo_url``, branch ``$VISIONBLOCKS_DOCS_REF`` or ``main``).
- With ``VISIONBLOCKS_DOCS_GALLERY=1`` the build first regenerates the gallery pictures
  (``make_gallery.py``, a few minutes: it trains the demo detector).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))
import public_api

API_PAGE = "reference/api.md"
SOURCE_PACKAGES = ("visionblocks", "benchmarks")

_FENCE = re.compile(r"^\s*```")
_CODE_SPAN = re.compile(r"(?<![\[`])`(?P<code>[^`\n]+)`(?![`\]])")
_CALL = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?:\(.*\))?$")
# "torchvision's `sigmoid_focal_loss`" names the peer's function, not ours: never linked.
_PEER_BEFORE = re.compile(
    r"(?:torchvision|kornia|mmcv|mmdet|MMDetection|mmengine|detectron2|timm|fvcore|OpenCV|"
    r"cv2|torch|PyTorch|Lightning|their|the peer)(?:'s|’s)\s*(?:own\s*)?$",
    re.I,
)
_PACKAGES = "|".join(SOURCE_PACKAGES)
_HEADING = re.compile(
    rf'(<h[1-6] id="(?P<id>(?:{_PACKAGES})\.[\w.]+)" class="doc doc-heading">.*?)'
    r'(<a href="#(?P=id)" class="headerlink")',
    re.S,
)


@lru_cache(maxsize=1)
def _symbols() -> tuple[public_api.Symbol, ...]:
    return tuple(public_api.public_symbols())


@lru_cache(maxsize=1)
def _link_targets() -> dict[str, str]:
    return public_api.link_targets(list(_symbols()))


def on_pre_build(config) -> None:
    """Regenerate the gallery when asked to; clear the caches of a previous build (serve)."""
    _symbols.cache_clear()
    _link_targets.cache_clear()
    _griffe_collection.cache_clear()
    if os.environ.get("VISIONBLOCKS_DOCS_GALLERY") == "1":
        script = Path(__file__).with_name("make_gallery.py")
        subprocess.run([sys.executable, str(script)], check=True)


def on_files(files, config):
    """Add the generated API index page."""
    content = public_api.api_index_markdown(list(_symbols()))
    files.append(File.generated(config, API_PAGE, content=content))
    return files


def link_code_spans(markdown: str, targets: dict[str, str]) -> str:
    """Link code spans that name a public object, once per section, outside code blocks.

    Example:
        >>> link_code_spans("Use `box_iou`, then `box_iou` again.", {"box_iou": "a.box_iou"})
        'Use [`box_iou`][a.box_iou], then `box_iou` again.'
        >>> link_code_spans("Not torchvision's `box_iou`.", {"box_iou": "a.box_iou"})
        "Not torchvision's `box_iou`."
    """
    out, in_fence, linked = [], False, set()
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line):
            in_fence = not in_fence
        if in_fence or _FENCE.match(line):
            out.append(line)
            continue
        if line.startswith("#"):
            linked.clear()
            out.append(line)
            continue

        def link(match: re.Match, line: str = line) -> str:
            call = _CALL.match(match["code"])
            target = targets.get(call["name"]) if call else None
            if target is None or target in linked or _PEER_BEFORE.search(line[: match.start()]):
                return match.group(0)
            linked.add(target)
            return f"[{match.group(0)}][{target}]"

        out.append(_CODE_SPAN.sub(link, line))
    return "".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Cross-link the prose of every page to the reference entries."""
    if page.file.src_uri == API_PAGE:  # linked already
        return markdown
    return link_code_spans(markdown, _link_targets())


@lru_cache(maxsize=1)
def _griffe_collection():
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(public_api.ROOT)])
    for package in SOURCE_PACKAGES:
        loader.load(package)
    loader.resolve_aliases(external=False)
    return loader.modules_collection


def source_url(identifier: str, repo_url: str, ref: str) -> str | None:
    """The repository URL of the lines that define ``identifier``, or None if unknown."""
    try:
        obj = _griffe_collection()[identifier]
        obj = obj.final_target if obj.is_alias else obj
        path = obj.relative_package_filepath if obj.is_module else obj.relative_filepath
    except Exception:  # an identifier griffe cannot place: no link rather than a failed build
        return None
    lines = f"#L{obj.lineno}-L{obj.endlineno}" if obj.lineno and obj.endlineno else ""
    return f"{repo_url.rstrip('/')}/blob/{ref}/{Path(path).as_posix()}{lines}"


def on_page_content(content: str, page, config, files) -> str:
    """Give every rendered object on a reference page a link to its source lines."""
    repo_url = config.get("repo_url")
    if not repo_url or not page.file.src_uri.startswith("reference/"):
        return content
    ref = os.environ.get("VISIONBLOCKS_DOCS_REF", "main")

    def add_link(match: re.Match) -> str:
        url = source_url(match["id"], repo_url, ref)
        if url is None:
            return match.group(0)
        link = (
            f'<a href="{html.escape(url)}" class="vb-source-link" '
            f'title="Source of {match["id"]}">source</a>'
        )
        return match.group(1) + link + match.group(3)

    return _HEADING.sub(add_link, content)
