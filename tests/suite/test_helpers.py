"""The suite's own helpers must be able to fail."""

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from tests.helpers import TOLERANCES, assert_close, gradcheck


def test_assert_close_uses_dtype_table():
    x = torch.tensor([1.0, 2.0])
    assert_close(x + 1e-7, x)
    with pytest.raises(AssertionError):
        assert_close(x + 1e-3, x)
    # half tolerance admits the same difference
    assert_close((x + 1e-3).half(), x.half())


def test_tolerance_table_covers_float_dtypes():
    assert set(TOLERANCES) >= {torch.float64, torch.float32, torch.float16, torch.bfloat16}
    assert (
        TOLERANCES[torch.float64][0] < TOLERANCES[torch.float32][0] < TOLERANCES[torch.float16][0]
    )


def test_gradcheck_catches_wrong_backward():
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g  # should be 2 * x * g

    assert gradcheck(lambda x: x * x, [torch.rand(3)])
    with pytest.raises(GradcheckError):
        gradcheck(Wrong.apply, [torch.rand(3) + 1.0])
