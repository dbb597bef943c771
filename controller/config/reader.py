"""Reading ``CONTROLLER_*`` variables: each converted once, every problem collected (not
raised), and what was read, each number's range and each default recorded, so ``KEYS``,
``BOUNDS`` and ``DEFAULTS`` come from a parse rather than from a list kept by hand.

The sections (``receiver``, ``queue``, ``runner``…) read their variables through a ``Reader``;
what is particular to one section (a uid range, Sentinel addresses) lives with that section."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Mapping
from typing import TypeVar, overload

from controller import files
from controller.config.masked import Secret

PREFIX = "CONTROLLER_"
DAY = 24 * 3600
T = TypeVar("T")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def number_text(value: float) -> str:
    """A bound as README writes it: ``300``, ``0.1``."""
    return str(int(value)) if float(value).is_integer() else str(value)


class Reader:
    """Reads variables, converting each once, collecting every problem."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.env = environ
        self.problems: list[str] = []
        self.read: set[str] = set()
        """Every variable name this parser looked up (so ``KEYS`` is what it really reads)."""
        self.bounds: dict[str, tuple[float, float]] = {}
        """Each numeric setting's (minimum, maximum), as ``number`` checks them (``BOUNDS``)."""
        self.defaults: dict[str, float | str | bool] = {}
        """Each number's, text's and flag's default, as the parser falls back to it (``DEFAULTS``)."""

    @overload
    def get(self, key: str) -> str | None: ...

    @overload
    def get(self, key: str, default: str) -> str: ...

    def get(self, key: str, default: str | None = None) -> str | None:
        """``environ.get``, remembering the name."""
        self.read.add(key)
        return self.env.get(key, default)

    def text(self, name: str, default: str) -> str:
        self.defaults[PREFIX + name] = default
        value = self.get(PREFIX + name, "").strip()
        return value or default

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        """A text, lower-cased, that must be one of ``choices``."""
        value = self.text(name, default).lower()
        if value not in choices:
            self.problems.append(f"{PREFIX}{name} must be one of {', '.join(choices)}, got {value!r}")
        return value

    def command(self, name: str, default: str) -> str:
        """A command line, split as the runner splits it (``shlex``): an unbalanced quote is a
        problem here, not a crash in every task."""
        value = self.text(name, default)
        try:
            parts = shlex.split(value)
            if not parts or not parts[0]:
                raise ValueError("it names no program")
        except ValueError as exc:
            self.problems.append(f"{PREFIX}{name} is not a command line ({exc})")
        return value

    def flag(self, name: str, default: bool) -> bool:
        self.defaults[PREFIX + name] = default
        raw = self.get(PREFIX + name, "").strip().lower()
        if not raw:
            return default
        if raw in ("true", "1", "yes"):
            return True
        if raw in ("false", "0", "no"):
            return False
        self.problems.append(f"{PREFIX}{name} must be true or false, got {raw!r}")
        return default

    def object_name(self, name: str) -> str | None:
        """A Kubernetes object name (a DNS-1123 subdomain), or None when unset."""
        value = self.get(PREFIX + name, "").strip()
        if not value:
            return None
        if len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
            self.problems.append(
                f"{PREFIX}{name} must be a Kubernetes object name (lower-case letters, digits, '-', '.'), got {value!r}"
            )
            return None
        return value

    def words(self, name: str) -> tuple[str, ...]:
        return tuple(w.strip() for w in self.get(PREFIX + name, "").split(",") if w.strip())

    def number(self, name: str, default: T, cast: Callable[[str], T], minimum: float, maximum: float) -> T:
        """A number within ``[minimum, maximum]`` (both documented in README's settings table:
        ``BOUNDS``). Every number has a maximum: an absurd one (``1e20`` seconds) would pass
        parsing and then break at run time (a Redis expiry out of range, every delivery 503)."""
        assert minimum <= default <= maximum, name  # type: ignore[operator]  # a default out of its own range is a bug
        self.bounds[PREFIX + name] = (minimum, maximum)
        self.defaults[PREFIX + name] = default  # type: ignore[assignment]  # T is a number here
        raw = self.get(PREFIX + name, "").strip()
        if not raw:
            return default
        try:
            value = cast(raw)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(raw)  # nan/inf would pass the minimum check and break at run time
        except ValueError:
            self.problems.append(f"{PREFIX}{name} must be a{'n integer' if cast is int else ' number'}, got {raw!r}")
            return default
        if value < minimum:  # type: ignore[operator]
            self.problems.append(f"{PREFIX}{name} must be at least {number_text(minimum)}, got {raw!r}")
        elif value > maximum:  # type: ignore[operator]
            self.problems.append(f"{PREFIX}{name} must be at most {number_text(maximum)}, got {raw!r}")
        return value

    def raw_secret(self, name: str) -> str | None:
        """A secret from NAME or from the file NAME_FILE names (not both)."""
        direct = self.get(PREFIX + name)
        path = self.get(PREFIX + name + "_FILE")
        if direct and path:
            self.problems.append(f"set {PREFIX}{name} or {PREFIX}{name}_FILE, not both")
            return None
        if path:
            try:
                # Never blocks (a FIFO is refused, not waited on) and never echoes the content.
                return files.read_small(path).strip() or None
            except OSError as exc:
                self.problems.append(f"{PREFIX}{name}_FILE: cannot read {path}: {exc.strerror}")
                return None
        return direct.strip() if direct and direct.strip() else None

    def secret(self, name: str) -> Secret | None:
        value = self.raw_secret(name)
        return Secret(value) if value else None
