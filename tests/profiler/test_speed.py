"""The machine's speed probe."""

import pytest

from ddlsim.data.errors import InvalidOptionError
from ddlsim.profiler.speed import probe_ms


def test_the_probe_times_its_unit_of_work() -> None:
    first, second = probe_ms(repeats=3), probe_ms(repeats=3)
    assert 0 < first < 1000 and 0 < second < 1000
    with pytest.raises(InvalidOptionError, match=r"repeats\(0\) must be >= 1"):
        probe_ms(repeats=0)
