"""`panoptic_quality` against torchmetrics 1.9's ``PanopticQuality`` (random and hand-built
inputs, void and unknown categories, stuffs), and its errors."""

from __future__ import annotations

import pytest
import torch

from visionblocks.metrics import panoptic_quality

pytest.importorskip("torchmetrics")
from torchmetrics.detection import PanopticQuality

THINGS, STUFFS = {1, 3, 5}, {2, 8}


def _torchmetrics(preds, target, things, stuffs, allow_unknown=False) -> dict[str, torch.Tensor]:
    kw = {"allow_unknown_preds_category": allow_unknown, "return_sq_and_rq": True}
    overall = PanopticQuality(things, stuffs, **kw)(preds, target)
    per_class = PanopticQuality(things, stuffs, return_per_class=True, **kw)(preds, target)
    names = ("pq", "sq", "rq")
    return {
        **{n: overall[i] for i, n in enumerate(names)},
        **{f"{n}_per_class": per_class[:, i] for i, n in enumerate(names)},
    }


def _check(preds, target, things=THINGS, stuffs=STUFFS, allow_unknown=False):
    got = panoptic_quality(preds, target, things, stuffs, allow_unknown)
    want = _torchmetrics(preds, target, things, stuffs, allow_unknown)
    assert got.keys() == want.keys()
    for name in want:  # torchmetrics divides in float32 (IoU, RQ)
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-7, equal_nan=True)
    return got


def _scene(g: torch.Generator, b: int, h: int, w: int, unknown: tuple[int, ...] = ()):
    """Targets of stuff blocks with thing rectangles on top, and predictions that move,
    drop, relabel and add segments, plus pixel noise (also of ``unknown`` categories)."""
    stuff = torch.tensor(sorted(STUFFS) + list(unknown))
    coarse = stuff[torch.randint(len(stuff), (b, h // 8, w // 8), generator=g)]
    target = torch.stack(
        (
            coarse.repeat_interleave(8, 1).repeat_interleave(8, 2),
            torch.zeros(b, h, w, dtype=torch.long),
        ),
        -1,
    )
    target[..., 1] = torch.randint(0, 4, (b, h, w), generator=g)  # stuff instance ids: ignored
    preds = target.clone()
    things = torch.tensor(sorted(THINGS))
    for i in range(b):
        for n in range(6):
            y, x = torch.randint(0, h - 4, (2,), generator=g).tolist()
            hh, ww = torch.randint(3, h // 2, (2,), generator=g).tolist()
            cat = things[torch.randint(len(things), (1,), generator=g)].item()
            target[i, y : y + hh, x : x + ww] = torch.tensor([cat, n])
            kind = torch.randint(0, 4, (1,), generator=g).item()
            if kind == 3:  # missed
                continue
            dy, dx = torch.randint(-2, 3, (2,), generator=g).tolist() if kind < 2 else (hh // 2, 0)
            y2, x2 = max(y + dy, 0), max(x + dx, 0)
            preds[i, y2 : y2 + hh, x2 : x2 + ww] = torch.tensor([cat, 10 + 3 * n])  # other ids
    noise = torch.rand(b, h, w, generator=g) < 0.05
    cats = torch.tensor(sorted(THINGS | STUFFS) + list(unknown))
    preds[..., 0][noise] = cats[torch.randint(len(cats), (int(noise.sum()),), generator=g)]
    return preds, target


@pytest.mark.parametrize("seed", range(4))
def test_random_scenes_equal_torchmetrics(seed):
    g = torch.Generator().manual_seed(seed)
    preds, target = _scene(g, 3, 32, 40)
    got = _check(preds, target)
    assert got["pq"] > 0.2 and (got["rq_per_class"] > 0).sum() >= 3  # matches happen


@pytest.mark.parametrize("seed", range(3))
def test_void_target_and_unknown_predicted_categories(seed):
    g = torch.Generator().manual_seed(10 + seed)
    preds, target = _scene(g, 2, 32, 32, unknown=(0, 9))  # 0, 9: void in target
    with pytest.raises(ValueError, match=r"preds holds category ids .*\[0, 9\]"):
        panoptic_quality(preds, target, THINGS, STUFFS)
    _check(preds, target, allow_unknown=True)


def test_torchmetrics_docstring_example_and_layouts():
    preds = torch.tensor([[[[6, 0], [0, 0], [6, 0], [6, 0]],
                           [[0, 0], [0, 0], [6, 0], [0, 1]],
                           [[0, 0], [0, 0], [6, 0], [0, 1]],
                           [[0, 0], [7, 0], [6, 0], [1, 0]],
                           [[0, 0], [7, 0], [7, 0], [7, 0]]]])  # fmt: skip
    target = torch.tensor([[[[6, 0], [0, 1], [6, 0], [0, 1]],
                            [[0, 1], [0, 1], [6, 0], [0, 1]],
                            [[0, 1], [0, 1], [6, 0], [1, 0]],
                            [[0, 1], [7, 0], [1, 0], [1, 0]],
                            [[0, 1], [7, 0], [7, 0], [7, 0]]]])  # fmt: skip
    got = _check(preds, target, {0, 1}, {6, 7})
    torch.testing.assert_close(
        got["pq"], torch.tensor(0.5463, dtype=torch.float64), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        got["pq_per_class"],
        torch.tensor([0.5185, 0.0, 0.6667, 1.0], dtype=torch.float64),
        atol=1e-4,
        rtol=0,
    )
    # point clouds (B, N, 2) and volumes (B, D, H, W, 2); other integer dtypes
    _check(preds.reshape(1, 20, 2).int(), target.reshape(1, 20, 2).int(), {0, 1}, {6, 7})
    _check(preds.reshape(1, 2, 2, 5, 2), target.reshape(1, 2, 2, 5, 2), [0, 1], (6, 7))


def test_hand_built_void_rules():
    """A predicted segment mostly on void is no false positive; a target segment mostly under
    predicted void is no false negative; void leaves the union."""
    t = torch.tensor([[[1, 0], [1, 0], [1, 0], [1, 0], [0, 0], [0, 0], [0, 0], [3, 0]]])
    p = torch.tensor([[[1, 4], [1, 4], [1, 4], [9, 0], [1, 4], [3, 2], [3, 2], [9, 0]]])
    got = _check(p.unsqueeze(0)[0], t.unsqueeze(0)[0], {1, 3}, set(), allow_unknown=True)
    # thing 1: IoU 3 / (4 - 1 void + 4 - 1 void - 3) = 1 -> PQ 1; thing 3: the target segment
    # is all under predicted void (no FN) and the predicted one all on void (no FP).
    torch.testing.assert_close(got["pq_per_class"], torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert got["pq"] == 1.0


def test_empty_and_no_segments():
    empty = torch.zeros(0, 4, 4, 2, dtype=torch.long)
    assert panoptic_quality(empty, empty, {1}, {2})["pq"].isnan()
    void = torch.full((1, 4, 4, 2), 7)
    out = panoptic_quality(void, void, {1}, {2}, allow_unknown_preds_category=True)
    assert out["pq"].isnan() and out["pq_per_class"].tolist() == [0.0, 0.0]


def test_bad_input_is_refused_with_a_clear_error():
    x = torch.zeros(1, 4, 4, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="things and stuffs must be disjoint"):
        panoptic_quality(x, x, {0, 1}, {1})
    with pytest.raises(ValueError, match="not both be empty"):
        panoptic_quality(x, x, [], [])
    with pytest.raises(TypeError, match=r"things\[...\] must be int"):
        panoptic_quality(x, x, [0.0], [1])
    with pytest.raises(ValueError, match=r"target must have shape \(B, \*spatial, 2\)"):
        panoptic_quality(x, x[..., :1], {0}, {1})
    with pytest.raises(ValueError, match="same shape"):
        panoptic_quality(x, x[:, :2], {0}, {1})
    with pytest.raises(TypeError, match="preds must be an integer tensor"):
        panoptic_quality(x.float(), x, {0}, {1})
