"""The validation vocabulary: every helper names expected and received values."""

import pytest
import torch

from visionblocks._core.checks import check_choice, check_range, check_type
from visionblocks._core.tensor_checks import (
    check_floating,
    check_last_dim,
    check_same_shape,
    check_tensor,
)


def test_check_type():
    check_type("x", 1, (int, float))
    with pytest.raises(TypeError, match=r"x must be int or float, got str \('a'\)"):
        check_type("x", "a", (int, float))


def test_check_choice():
    check_choice("mode", "a", ["a", "b"])
    with pytest.raises(ValueError, match="mode must be one of 'a', 'b'; got 'c'"):
        check_choice("mode", "c", ["a", "b"])


@pytest.mark.parametrize(
    ("value", "kwargs", "ok"),
    [
        (0.0, {"low": 0.0, "high": 1.0}, True),
        (1.0, {"low": 0.0, "high": 1.0}, True),
        (0.0, {"low": 0.0, "high": 1.0, "low_inclusive": False}, False),
        (1.0, {"low": 0.0, "high": 1.0, "high_inclusive": False}, False),
        (-1.0, {"low": 0.0}, False),
        (1e9, {"low": 0.0}, True),
        (2.0, {"high": 1.0}, False),
    ],
)
def test_check_range(value, kwargs, ok):
    if ok:
        check_range("v", value, **kwargs)
    else:
        with pytest.raises(ValueError, match="v must be in"):
            check_range("v", value, **kwargs)


def test_check_range_message_shows_open_bounds():
    with pytest.raises(ValueError, match=r"v must be in \(0.0, inf\), got 0.0"):
        check_range("v", 0.0, low=0.0, low_inclusive=False)


def test_tensor_checks():
    x = torch.zeros(2, 4)
    assert check_tensor("x", x) is x
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        check_tensor("x", [1])
    assert check_floating("x", x) is x
    with pytest.raises(TypeError, match="floating-point tensor, got dtype torch.int64"):
        check_floating("x", x.long())
    check_same_shape("a", x, "b", torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"got \(2, 4\) and \(4, 2\)"):
        check_same_shape("a", x, "b", torch.ones(4, 2))
    check_last_dim("boxes", x, 4)
    with pytest.raises(ValueError, match=r"boxes must have shape \(\.\.\., 4\), got \(\)"):
        check_last_dim("boxes", torch.tensor(1.0), 4)
    with pytest.raises(ValueError, match=r"got \(2, 3\)"):
        check_last_dim("boxes", torch.zeros(2, 3), 4)
