"""Credentials that settings carry inside URLs, found and masked in one place.

A URL setting may carry a secret in three forms: a password in its userinfo
(``redis://:PASSWORD@host``, ``https://user:PASSWORD@host``), a lone token in its place
(``https://TOKEN@host``), or a query parameter named like a credential (``?password=``, the
form redis-py takes for a unix socket; ``token``, ``secret``, ``key``…). ``mask_credentials``
replaces each with ``***`` (``check-config``'s output and every settings ``repr``);
``url_credentials`` lists them (so the log formatter redacts them); ``url_password`` tells
whether a Redis URL takes a password. Pure functions: no I/O.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
_SECRET_PARAMETER = re.compile(r"pass|secret|token|key|auth|credential|signature", re.IGNORECASE)
_PARAMETER = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&;#]*)=(?P<value>[^&;#]*)")


def _split_url(url: str) -> tuple[str, str, str, str] | None:
    """``scheme://``, the userinfo (without its ``@``; "" when none), the rest of the authority
    and path, and the query with its ``?`` (or "") — None when ``url`` is no URL. A password
    may hold ``@``, ``/`` or ``?``: the userinfo ends at the *last* ``@`` (which may mask more
    than a strict parser would, never less)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return None
    userinfo, at, after = rest.rpartition("@")
    remainder = after if at else rest
    cut = min((i for i in (remainder.find("?"), remainder.find("#")) if i >= 0), default=len(remainder))
    return scheme + sep, userinfo if at else "", remainder[:cut], remainder[cut:]


def url_credentials(text: str) -> list[str]:
    """The credentials a URL carries: its userinfo's password (or a lone token in its place)
    and the value of any query parameter named like a credential (``?password=``, redis-py's
    form for unix sockets; ``token``, ``secret``, ``key``…), each as written and as a client
    decodes it (percent-escapes undone)."""
    parts = _split_url(text.strip())
    if parts is None:
        return []
    _, userinfo, _, query = parts
    found = []
    if userinfo:
        user, colon, password = userinfo.partition(":")
        found.append(password if colon else user)
    for match in _PARAMETER.finditer(query):
        if _SECRET_PARAMETER.search(match["name"]) and match["value"]:
            found.append(match["value"])
    decoded = [unquote(value) for value in found]  # what a client sends: %2F is a "/" in the password
    return list(dict.fromkeys(value for value in found + decoded if value))


def url_password(text: str) -> str | None:
    """The password a URL carries (``scheme://user:PASSWORD@…`` or ``?password=PASSWORD``), or None."""
    parts = _split_url(text.strip())
    if parts is None:
        return None
    _, userinfo, _, query = parts
    _, colon, password = userinfo.partition(":")
    if colon and password:
        return password
    for match in _PARAMETER.finditer(query):
        if match["name"].lower() == "password" and match["value"]:
            return match["value"]
    return None


def mask_credentials(text: str) -> str:
    """``text`` with every credential a URL in it may carry replaced by ``***``, safe to print:
    ``redis://:pw@host`` → ``redis://:***@host``, ``redis://user:pw@host`` → ``redis://user:***@host``,
    ``https://token@host`` → ``https://***@host``, ``unix:///s.sock?password=pw`` →
    ``unix:///s.sock?password=***``. Text that is no URL is returned as it is. Every setting
    printed (``Settings.describe``: ``check-config``) goes through this."""
    parts = _split_url(text)
    if parts is None:
        return text
    scheme, userinfo, rest, query = parts
    if userinfo:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:{MASK}@" if colon else f"{MASK}@"

    def masked(match: re.Match[str]) -> str:
        if not _SECRET_PARAMETER.search(match["name"]):
            return match[0]
        return f"{match['sep']}{match['name']}={MASK}"

    return f"{scheme}{userinfo}{rest}{_PARAMETER.sub(masked, query)}"
