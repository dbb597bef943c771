"""Where the executor key may go, and which ids may reach an argument list, a path or a label (pure).

The executor sends the environment key (``CODEX_API_KEY``) to whatever ``--remote`` names, so
a session's ``remote_url`` decides who receives it (L2). It must:

- be ``https``, or ``http`` to a loopback host only (``localhost``, ``127.0.0.0/8``, ``[::1]``);
- name a host that matches one of the allow-list patterns
  (``CONTROLLER_REMOTE_URL_ALLOWLIST``, default ``*.openai.com,*.openai.org``: the hosts the
  executor itself trusts with its key);
- carry no userinfo (``https://api.openai.com@evil.example``), query or fragment, no
  percent-escapes, backslashes, whitespace or non-ASCII; a port (1–65535) and a plain path
  (``/v1/…``; letters, digits, ``._~-/``, no ``.``/``..`` segments) are allowed.

Patterns: ``*.example.com`` matches any name *below* ``example.com`` (``api.example.com``,
``a.b.example.com``) and not ``example.com`` itself (list it too to allow it); any other
pattern is one exact host name or IP address (``127.0.0.1``, ``::1`` or ``[::1]``). Patterns
name hosts, never ports. Host names compare case-insensitively; a trailing dot is refused.

Ids: session and environment ids must match ``ID_PATTERN`` (``sess_…``, ``env_…``: letters,
digits, ``_`` and ``-``, starting with a letter or digit, at most 128 characters), so that an
id can never be read as an option (``--flag``), a path (``../``) or anything else.

``untrusted(session, policy)`` is what ``decide.decide`` asks; ``spec_problem(spec)`` is the
runners' last line of defence before an argument list or a manifest (ids and URL shape; the
allow-list is the decision's business).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from controller.model import SandboxSpec, Session

DEFAULT_ALLOWLIST: tuple[str, ...] = ("*.openai.com", "*.openai.org")
MAX_ID_CHARS = 128
ID_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_-]{{0,{MAX_ID_CHARS - 1}}}")
MAX_URL_LENGTH = 2048

# Refusal kinds: a fixed set, fit for metric labels.
SESSION_ID = "session_id"
ENVIRONMENT_ID = "environment_id"
REMOTE_URL = "remote_url"

_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_PATH = re.compile(r"(/[A-Za-z0-9._~-]*)*")
_PRINTABLE = re.compile(r"[\x21-\x7e]*")
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def valid_id(value: object) -> bool:
    """Whether ``value`` is an id safe for an argument list, a path and a label."""
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


def printable(value: object, limit: int = 80) -> str:
    """``value`` as a short, escaped string, safe to log whatever it holds."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Refusal:
    """Why a session may not be started: ``kind`` is a fixed word, ``reason`` says more."""

    kind: str
    reason: str


def _ip(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return None


def _is_host_name(host: str) -> bool:
    labels = host.split(".")
    return (
        len(host) <= 253
        and all(_LABEL.fullmatch(label) for label in labels)
        and not labels[-1].isdigit()  # "127.1" or "1.2.3" are not names
    )


def pattern_problem(pattern: str) -> str | None:
    """What is wrong with one allow-list pattern, or None when it is valid."""
    text = pattern.strip().lower()
    if not text:
        return "empty pattern"
    if _ip(text) is not None:
        return None
    if text.startswith("*."):
        rest = text[2:]
        if not _is_host_name(rest):
            return f"{pattern!r}: after '*.' must come a host name"
        if "." not in rest:
            return f"{pattern!r}: a wildcard must stand below a domain of two labels or more (e.g. *.example.com)"
        return None
    if "*" in text:
        return f"{pattern!r}: '*' is allowed only as a leading '*.'"
    if not _is_host_name(text):
        return f"{pattern!r} is not a host name or IP address (no scheme, port or path)"
    return None


@dataclass(frozen=True)
class Policy:
    """The remote_url allow-list, as parsed (patterns validated by ``config``)."""

    allowlist: tuple[str, ...] = DEFAULT_ALLOWLIST

    def allows_host(self, host: str) -> bool:
        """Whether ``host`` (lower-case, IPv6 in brackets or not) matches a pattern."""
        address = _ip(host)
        for raw in self.allowlist:
            pattern = raw.strip().lower()
            if address is not None:
                if _ip(pattern) == address:
                    return True
            elif pattern.startswith("*."):
                if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                    return True
            elif host == pattern:
                return True
        return False


DEFAULT_POLICY = Policy()


def is_loopback(host: str) -> bool:
    """``localhost``, an address in 127.0.0.0/8, or ``::1``."""
    if host == "localhost":
        return True
    address = _ip(host)
    if isinstance(address, ipaddress.IPv4Address):
        return address.is_loopback
    return address is not None and address == ipaddress.IPv6Address("::1")


def _url_shape_problem(url: object) -> tuple[str | None, str]:
    """(problem, host): the URL's shape, independent of any allow-list."""
    if not isinstance(url, str) or not url:
        return "remote_url is empty", ""
    if len(url) > MAX_URL_LENGTH:
        return "remote_url is too long", ""
    if not _PRINTABLE.fullmatch(url):
        return "remote_url holds whitespace, control or non-ASCII characters", ""
    if "\\" in url or "%" in url:
        return "remote_url holds a backslash or a percent-escape", ""
    if "?" in url or "#" in url:
        return "remote_url has a query or a fragment", ""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in ("https", "http"):
        return "remote_url scheme is not https or http", ""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced "[" in the host
        return "remote_url is not a valid URL", ""
    netloc = rest.split("/", 1)[0]
    if "@" in netloc:
        return "remote_url carries userinfo", ""
    host = (parts.hostname or "").lower()
    if not host:
        return "remote_url has no host", ""
    if netloc.endswith(":"):
        return "remote_url has an empty port", ""
    try:
        port = parts.port
    except ValueError:
        return "remote_url has an invalid port", ""
    if port == 0:
        return "remote_url has an invalid port", ""
    if _ip(host) is None and not _is_host_name(host):
        return "remote_url host is not a valid host name or IP address", ""
    if not _PATH.fullmatch(parts.path) or any(s in (".", "..") for s in parts.path.split("/")):
        return "remote_url path holds characters or segments that are not allowed", ""
    if parts.scheme.lower() == "http" and not is_loopback(host):
        return "remote_url uses plain http to a host that is not loopback", ""
    return None, host


def remote_url_problem(url: object, policy: Policy) -> str | None:
    """Why the executor key must not go to ``url``, or None when it may."""
    problem, host = _url_shape_problem(url)
    if problem is not None:
        return problem
    if not policy.allows_host(host):
        return "remote_url host is not allowed"
    return None


def untrusted(session: Session, policy: Policy) -> Refusal | None:
    """Why this session must not get a sandbox (ids, remote_url), or None when it may."""
    if not valid_id(session.id):
        return Refusal(SESSION_ID, "session id does not match the id pattern")
    env = session.environment
    if not valid_id(env.id):
        return Refusal(ENVIRONMENT_ID, "environment id does not match the id pattern")
    problem = remote_url_problem(env.remote_url, policy)
    if problem is not None:
        return Refusal(REMOTE_URL, problem)
    return None


def spec_problem(spec: SandboxSpec) -> str | None:
    """What makes a spec unsafe to turn into an argument list or a manifest, or None."""
    if not valid_id(spec.session_id):
        return f"session id {printable(spec.session_id)} does not match the id pattern"
    if not valid_id(spec.environment_id):
        return f"environment id {printable(spec.environment_id)} does not match the id pattern"
    problem, _ = _url_shape_problem(spec.remote_url)
    return problem
