"""The machine's speed probe."""

import pytest

from ddlsim.cluster.speed import probe_ms
from ddlsim.data.errors import InvalidOptionError


def test_the_probe_times_its_unit_of_work() -> None:
    first, second = probe_ms(repeats=3, units=2), probe_ms(repeats=1, units=1)
    assert 0 < first < 1000 and 0 < second < 1000
    with pytest.raises(InvalidOptionError, match=r"repeats\(0\) and units\(1\) must be >= 1"):
        probe_ms(repeats=0, units=1)
    with pytest.raises(InvalidOptionError, match=r"units\(0\) must be >= 1"):
        probe_ms(units=0)
