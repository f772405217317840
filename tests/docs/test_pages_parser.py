"""The reading of a docs page into steps (tests/docs/pages.py) does what its docstring says."""

from __future__ import annotations

import pytest

from .pages import blocks, steps

PAGE = """# A page

```python
x = 1
print(x)
```

```text
1
```

Prose, then a text block that is not output:

```text
not output
```

<!-- docs-test: skip: needs a GPU -->
```python
x.cuda()
```

```python
# my_package/mod.py
VALUE = 2
```

```console
$ echo hi
hi
$ true
```

!!! note
    ```python
    y = 2
    ```
"""


def test_a_page_reads_as_steps_in_order(tmp_path):
    page = tmp_path / "probe.md"
    page.write_text(PAGE)
    found = steps(page)
    kinds = [(step.kind, step.skip) for step in found]
    assert kinds == [
        ("python", None), ("python", "needs a GPU"), ("file", None),
        ("console", None), ("console", None), ("python", None),
    ]  # fmt: skip
    assert found[0].expected == "1\n"
    assert found[1].expected is None  # the second text block follows prose, not code
    assert found[2].extra == {"path": "my_package/mod.py"}
    assert (found[3].code, found[3].expected) == ("echo hi", "hi\n")
    assert (found[4].code, found[4].expected) == ("true", "")
    assert found[5].code == "y = 2\n"  # dedented out of the admonition


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- docs-test: skp -->\n", "malformed docs-test marker"),
        ("<!-- docs-test: skip: -->\n```python\nx\n```\n", "needs a reason"),
        ("```python\nx = 1\n", "unclosed code fence"),
        ("<!-- docs-test: quick: steps = 9 -->\n```python\nsteps = 9\n```\n", "OLD -> NEW"),
        (
            "<!-- docs-test: quick: steps = 9 -> steps = 1 -->\n```python\nn = 9\n```\n",
            "not in the block below",
        ),
    ],
)
def test_mistakes_in_markers_and_fences_are_reported(text, message):
    with pytest.raises(ValueError, match=message):
        blocks(text, "probe.md")


def test_a_marker_quoted_in_prose_is_not_a_marker():
    assert blocks("Write `<!-- docs-test: skip: REASON -->` above it.\n", "probe.md") == []


def test_quick_settings_apply_only_in_quick_mode(tmp_path):
    page = tmp_path / "probe.md"
    page.write_text(
        "<!-- docs-test: quick: steps = 600 -> steps = 4; n=512 -> n=8 -->\n"
        "```python\nsteps = 600\ndata(n=512)\n```\n"
    )
    assert steps(page)[0].code == "steps = 600\ndata(n=512)\n"
    assert steps(page, quick=True)[0].code == "steps = 4\ndata(n=8)\n"
