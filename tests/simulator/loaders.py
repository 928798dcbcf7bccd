"""The check every loader of a simulator file passes: a file of another format is refused,
naming its format, and a missing file as one that cannot be read."""

from collections.abc import Callable
from pathlib import Path

import pytest

from ddlsim.data.errors import InvalidOptionError


def assert_refuses_other_files(
    load: Callable[[Path], object], other_format: Path, *, format_number: int
) -> None:
    """``load`` refuses ``other_format``, a file of format ``format_number``, naming it, and a
    missing file beside it."""
    with pytest.raises(InvalidOptionError, match=f"format {format_number}"):
        load(other_format)
    with pytest.raises(InvalidOptionError, match="cannot be read"):
        load(other_format.with_name(f"missing-{other_format.name}"))
