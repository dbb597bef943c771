"""Settings that are safe to print: a ``Secret`` is masked wherever it is printed, and so are
the credentials of any URL a setting holds (``credentials.mask_credentials``), whichever field
holds it."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from controller.credentials import mask_credentials, url_credentials


class Secret:
    """A secret string: masked wherever it is printed, revealed only on purpose."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class Printable:
    """``repr`` of a settings dataclass, safe to print: secrets masked, and so are the
    credentials of any URL a setting holds (``mask_credentials``), whichever field it is."""

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={_shown(getattr(self, f.name))!r}" for f in fields(self))  # type: ignore[arg-type]
        return f"{type(self).__name__}({shown})"


def _shown(value: Any) -> Any:
    if isinstance(value, str):
        return mask_credentials(value)
    if isinstance(value, tuple):
        return tuple(_shown(v) for v in value)
    return value


def _describe(value: Any) -> Any:
    if isinstance(value, Secret):
        return str(value)
    if isinstance(value, str):
        return mask_credentials(value)  # any setting, present or future, that holds a URL
    if is_dataclass(value) and not isinstance(value, type):
        return describe_fields(value)
    if isinstance(value, tuple):
        return [_describe(v) for v in value]
    return value


def describe_fields(value: Any) -> dict[str, Any]:
    """A settings dataclass as plain data, secrets and URL credentials masked."""
    described: dict[str, Any] = {f.name: _describe(getattr(value, f.name)) for f in fields(value)}
    return described


def secret_values(value: Any) -> list[str]:
    """Every secret's value and every URL credential in a setting (or a dataclass of them)."""
    if isinstance(value, Secret):
        return [value.reveal()]
    if isinstance(value, str):
        return url_credentials(value)
    if is_dataclass(value) and not isinstance(value, type):
        return [found for f in fields(value) for found in secret_values(getattr(value, f.name))]
    if isinstance(value, tuple):
        return [found for item in value for found in secret_values(item)]
    return []
