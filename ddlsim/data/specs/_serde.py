"""Small helpers shared by the specs' ``from_dict`` constructors and JSON loaders."""

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def check_keys(
    mapping: Mapping[str, Any], allowed: set[str], where: str, error: type[Exception]
) -> None:
    """Raise ``error`` naming the first unknown key of ``mapping`` and the allowed ones."""
    if not isinstance(mapping, Mapping):
        raise error(f"{where} must be a JSON object, got {type(mapping).__name__}: {mapping!r}")
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise error(
            f"unknown key {unknown[0]!r} in {where}; allowed: {', '.join(sorted(allowed))}"
        )


def present(**values: Any) -> dict[str, Any]:
    """The given keys whose value is not ``None``, in the given order (a JSON form leaves an
    unset optional field out rather than writing ``null``)."""
    return {key: value for key, value in values.items() if value is not None}


def expect_int(value: Any, where: str, error: type[Exception], *, minimum: int = 1) -> int:
    """Return ``value`` if it is an int (not a bool) ``>= minimum``, else raise ``error``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{where} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise error(f"{where} must be >= {minimum}, got {value}")
    return value


def expect_choice(value: Any, allowed: Sequence[str], where: str, error: type[Exception]) -> None:
    """Raise ``error`` naming ``value`` and the ``allowed`` ones unless it is one of them."""
    if value not in allowed:
        raise error(f"{where} {value!r} is not supported; allowed: {', '.join(allowed)}")


def expect_number(
    value: Any, where: str, error: type[Exception], *, positive: bool = True
) -> float:
    """Return ``value`` as float if it is a finite real number (``> 0`` when ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{where} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise error(f"{where} must be finite, got {value!r}")
    if positive and number <= 0:
        raise error(f"{where} must be > 0, got {value!r}")
    if not positive and number < 0:
        raise error(f"{where} must be >= 0, got {value!r}")
    return number


def load_json_or_file(text: str, what: str, error: type[Exception]) -> dict[str, Any]:
    """Parse ``text`` as inline JSON (starting with ``{``) or as a JSON/YAML file path."""
    stripped = text.strip()
    if stripped.startswith("{"):
        source = "inline JSON"
        raw = stripped
    else:
        path = Path(text)
        if not path.is_file():
            raise error(f"{what} {text!r} is neither inline JSON nor an existing file")
        source = str(path)
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise error(
                f"{what} file {source} is not UTF-8 text (JSON or YAML expected)"
            ) from None
        except OSError as exc:
            raise error(f"{what} file {source} cannot be read: {exc.strerror}") from None
        if path.suffix.lower() in {".yaml", ".yml"}:
            import yaml

            try:
                loaded = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise error(f"{what} file {source} is not valid YAML: {exc}") from None
            if not isinstance(loaded, dict):
                raise error(f"{what} file {source} must hold a mapping, got {loaded!r}")
            return loaded
    try:
        loaded = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} {source} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(loaded, dict):
        raise error(f"{what} {source} must be a JSON object, got {type(loaded).__name__}")
    return loaded
