"""check_real accepts every finite numbers.Real (Fraction included) and rejects the rest."""

from fractions import Fraction

import numpy as np
import pytest

from hashlearn._utils.validation import check_real


@pytest.mark.parametrize("value", [0.25, 3, np.float32(0.5), np.int64(2), Fraction(1, 3)])
def test_finite_reals_are_accepted(value):
    # np.isfinite raised a TypeError on a Fraction; math.isfinite takes any Real
    assert check_real(value, "alpha", "X", low=0) == float(value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -np.inf, True, "1", None, 1j])
def test_non_finite_or_non_real_raise_value_error(value):
    with pytest.raises(ValueError, match="'alpha' parameter of X"):
        check_real(value, "alpha", "X")
