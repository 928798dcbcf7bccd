"""One copy pass over a buffer, measured and fitted."""

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.profiler.runtime_costs import measure_copy


def test_copy_cost_is_fitted_to_every_size() -> None:
    alpha, per_byte, medians = measure_copy([64 * 1024, 1024 * 1024], repeats=3)
    assert sorted(medians) == [64 * 1024, 1024 * 1024]
    assert all(t > 0 for t in medians.values())
    assert alpha >= 0 and per_byte >= 0


@pytest.mark.parametrize(
    ("sizes", "repeats"), [([1024], 3), ([1024, 1024], 3), ([2, 1024], 3), ([1024, 4096], 0)]
)
def test_bad_sizes_or_repeats_are_refused(sizes: list[int], repeats: int) -> None:
    with pytest.raises(InvalidOptionError, match="sizes"):
        measure_copy(sizes, repeats=repeats)
