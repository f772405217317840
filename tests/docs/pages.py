"""Read the code of a Markdown page as the steps a reader would run, in page order.

Conventions (also stated in ``docs/architecture.md``):

- every ```` ```python ```` block runs, in page order, in one namespace shared by the page;
- a ```` ```text ```` block right after a python block (blank lines between are fine) is what
  that block prints;
- a ```` ```console ```` block holds ``$ command`` lines, each followed by what it prints;
  the commands run in the page's working directory, after the python blocks above them;
- expected output follows doctest's ``ELLIPSIS`` rule: ``...`` stands for any text;
- a python or toml block whose first line is a comment naming a relative file
  (``# my_package/backbones.py``) is a file of the reader's project: it is written there, not
  run, and the working directory is on ``sys.path`` (as for a script run from the project);
- the HTML comment ``<!-- docs-test: skip: REASON -->`` on the line before a fence skips
  that block (a GPU, a large file, a library or package that is not installed); the reason
  is required;
- the HTML comment ``<!-- docs-test: quick: OLD -> NEW; OLD2 -> NEW2 -->`` on the line before
  a fence gives the block's quick settings: with ``VISIONBLOCKS_QUICK=1`` (``make test``) each
  ``OLD`` text of the block is replaced by ``NEW`` before it runs (fewer training steps or
  images), as the examples' quick mode does; every ``OLD`` must occur in the block.

``bash``, ``toml``, ``diff`` and other blocks are instructions to read, not steps.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*$")
_SKIP = re.compile(r"^\s*<!--\s*docs-test:\s*skip:\s*(?P<reason>.*?)\s*-->\s*$")
_QUICK = re.compile(r"^\s*<!--\s*docs-test:\s*quick:\s*(?P<subs>.*?)\s*-->\s*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test")  # a marker line (not one quoted in prose)
_FILE = re.compile(r"^# (?P<path>[\w.-]+(?:/[\w.-]+)*\.(?:py|toml|cfg|txt|json|yaml))\s*$")


@dataclass
class Block:
    """One fenced block: its language, its code, where it starts and whether it is skipped."""

    lang: str
    code: str
    line: int
    end: int
    skip: str | None = None
    quick: tuple[tuple[str, str], ...] = ()


@dataclass
class Step:
    """Something to run: python code or a shell command, and the output the page shows."""

    kind: str  # "python", "console" or "file" (extra["path"])
    code: str
    line: int
    expected: str | None = None
    skip: str | None = None
    extra: dict = field(default_factory=dict)


def blocks(text: str, where: str = "page") -> list[Block]:
    """Every fenced block of ``text``, dedented, with the skip marker above it."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            if _MARKER.search(lines[i]) and not (_SKIP.match(lines[i]) or _QUICK.match(lines[i])):
                raise ValueError(f"{where}:{i + 1}: malformed docs-test marker {lines[i]!r}")
            i += 1
            continue
        indent, start = opening["indent"], i
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if i == len(lines):
            raise ValueError(f"{where}:{start + 1}: unclosed code fence")
        body = "\n".join(line[len(indent) :] if line.startswith(indent) else line.lstrip()
                         for line in lines[start + 1 : i])  # fmt: skip
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = _SKIP.match(previous)
        if marker and not marker["reason"]:
            raise ValueError(f"{where}:{start}: a docs-test skip marker needs a reason")
        quick = _QUICK.match(previous)
        code = textwrap.dedent(body) + "\n" if body else ""
        found.append(
            Block(
                opening["lang"], code, start + 1, i + 1, marker["reason"] if marker else None,
                _substitutions(quick["subs"], code, f"{where}:{start}") if quick else (),
            )
        )  # fmt: skip
        i += 1
    return found


def _substitutions(text: str, code: str, where: str) -> tuple[tuple[str, str], ...]:
    """Parse ``OLD -> NEW; ...`` of a quick marker; every ``OLD`` must occur in ``code``."""
    pairs = []
    for item in text.split(";"):
        old, arrow, new = item.partition("->")
        old, new = old.strip(), new.strip()
        if not arrow or not old or not new:
            raise ValueError(f"{where}: a docs-test quick marker needs 'OLD -> NEW', got {item!r}")
        if old not in code:
            raise ValueError(f"{where}: docs-test quick text {old!r} is not in the block below")
        pairs.append((old, new))
    return tuple(pairs)


def _console_steps(block: Block) -> list[Step]:
    steps: list[Step] = []
    for offset, line in enumerate(block.code.splitlines()):
        if line.startswith("$ "):
            steps.append(Step("console", line[2:], block.line + offset + 1, "", block.skip))
        elif steps:
            steps[-1].expected += line + "\n"
        elif line.strip():
            raise ValueError(f"line {block.line}: console output before any '$ ' command")
    return steps


def steps(path: Path, quick: bool = False) -> list[Step]:
    """The runnable steps of one page, in page order, with their expected output; ``quick``
    applies the blocks' quick settings (``<!-- docs-test: quick: ... -->``)."""
    where = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    text = path.read_text()
    lines = text.splitlines()
    result: list[Step] = []
    previous: Block | None = None
    for block in blocks(text, where):
        named = (
            _FILE.match(block.code.split("\n", 1)[0]) if block.lang in ("python", "toml") else None
        )
        if named:
            path = named["path"]
            result.append(Step("file", block.code, block.line, None, block.skip, {"path": path}))
        elif block.lang == "python":
            code = block.code
            for old, new in block.quick if quick else ():
                code = code.replace(old, new)
            result.append(Step("python", code, block.line, None, block.skip))
        elif block.lang == "text" and _follows(previous, block, lines):
            result[-1].expected = block.code
        elif block.lang == "console":
            result.extend(_console_steps(block))
        previous = block
    return result


def _follows(previous: Block | None, block: Block, lines: list[str]) -> bool:
    """Whether ``block`` comes right after a python block, with only blank lines between."""
    if previous is None or previous.lang != "python":
        return False
    return all(not line.strip() for line in lines[previous.end : block.line - 1])
