"""The type of the ``profile_batch`` fixture (tests/conftest.py): it runs ``ddlsim profile
batch --json`` on a batch file of the given YAML text and returns the exit status and the
JSON summary."""

from collections.abc import Callable
from typing import Any

BatchRun = Callable[[str], tuple[int, dict[str, Any]]]
