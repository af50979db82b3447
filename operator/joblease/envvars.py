"""Reading ``JOBLEASE_*`` variables: one parser per type, errors naming the variable.

Every ``read_*`` takes the environment (a mapping, ``os.environ`` or a test's
dict) and the variable's name; a variable that is absent or empty reads as
``default`` (``None`` unless given), so the config dataclass's own default
applies (except :func:`read_path`: there an empty value is "no file"). A value
that cannot be parsed raises :class:`~joblease.errors.InvalidInputError` naming
the variable, before anything starts. Shared by the sidecar's and the
operator's configs (which may not import each other).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import overload

from joblease.errors import InvalidInputError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(value: str, name: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); the empty string is false."""
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise InvalidInputError(f"{name}: expected true/false, got {value!r}")


def split_list(text: str) -> tuple[str, ...]:
    """``a, b,,c`` -> ``("a", "b", "c")``: comma separated, blanks dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _raw(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return None if raw is None or raw.strip() == "" else raw


def read_str(env: Mapping[str, str], name: str) -> str | None:
    """The value as given; ``None`` when absent or empty."""
    return _raw(env, name)


@overload
def read_bool(env: Mapping[str, str], name: str, default: bool) -> bool: ...
@overload
def read_bool(env: Mapping[str, str], name: str, default: None = None) -> bool | None: ...
def read_bool(env: Mapping[str, str], name: str, default: bool | None = None) -> bool | None:
    """:func:`parse_bool` of the value; ``default`` when absent or empty."""
    raw = _raw(env, name)
    return default if raw is None else parse_bool(raw, name)


@overload
def read_int(env: Mapping[str, str], name: str, default: int) -> int: ...
@overload
def read_int(env: Mapping[str, str], name: str, default: None = None) -> int | None: ...
def read_int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInputError(f"{name}: expected an integer, got {raw!r}") from None


@overload
def read_float(env: Mapping[str, str], name: str, default: float) -> float: ...
@overload
def read_float(env: Mapping[str, str], name: str, default: None = None) -> float | None: ...
def read_float(env: Mapping[str, str], name: str,
               default: float | None = None) -> float | None:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise InvalidInputError(f"{name}: expected a number, got {raw!r}") from None


def read_path(env: Mapping[str, str], name: str, default: str | None = None) -> Path | None:
    """A path; ``default`` (as a path) when absent, ``None`` when empty."""
    raw = env.get(name, default)
    return Path(raw) if raw else None


def read_list(env: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    """A comma-separated list (:func:`split_list`); ``None`` when absent or empty."""
    raw = _raw(env, name)
    return None if raw is None else split_list(raw)
