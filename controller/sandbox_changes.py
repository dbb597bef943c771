"""Which changes to a sandbox ask for a fresh look at its session (pure).

The Kubernetes runner's pod watch (``runners.kubernetes.watch``) reports each pod it sees as a
``Sighting`` (what the lifecycle cares about, nothing else) and asks ``look_again`` whether the
change from the last sighting matters. It matters when the sandbox can no longer serve its
session or has just become able to:

- it is gone (deleted, by us or by anyone: a node drain, ``kubectl delete``);
- it failed: the pod's phase turned Failed or Succeeded, or a container terminated
  (``Health.FAILED``);
- a container restarted (its restart count went up);
- it became Ready (the executor's grace period can be counted from a real start).

Anything else (a label, a status timestamp, a bookmark, the pod being scheduled) asks for
nothing. A look is never an action: the worker re-reads the session under its lease and
decides with ``decide.decide`` (L7, L12, L13), exactly as for a sweep or a timer.

After the watch had to list the pods again (its resource version expired: HTTP 410),
``look_again_after_list`` compares what it knew with what the list shows: a pod it knew that
is not listed was deleted in between, and each listed pod is compared with its last sighting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.model import Health


@dataclass(frozen=True)
class Sighting:
    """One sandbox as the watch last saw it."""

    session_id: str
    uid: str
    health: Health
    """``STARTING``, ``RUNNING``, ``FAILED`` (phase Failed/Succeeded or a terminated container)
    or ``TERMINATING`` (being deleted)."""
    ready: bool = False
    restarts: int = 0
    """Restarts summed over the sandbox's containers."""


def look_again(before: Sighting | None, after: Sighting | None) -> str | None:
    """The session to look at again when a sandbox went from ``before`` (None: never seen) to
    ``after`` (None: deleted), or None when the change asks for nothing."""
    if after is None:
        return before.session_id if before is not None and before.session_id else None
    if not after.session_id:
        return None  # not one of ours to work (no session id on it)
    if after.health is Health.FAILED:
        return after.session_id if before is None or before.health is not Health.FAILED else None
    if before is None:
        return None  # first sight of a live sandbox: nothing happened to it
    if after.restarts > before.restarts:
        return after.session_id
    if after.ready and not before.ready:
        return after.session_id
    return None


def look_again_after_list(known: Mapping[str, Sighting], listed: Iterable[Sighting]) -> list[str]:
    """The sessions to look at again after a fresh list of every sandbox, given the sightings
    known before it (by uid): sandboxes gone since, and listed ones whose change matters.
    Sorted, each session once."""
    listed_by_uid = {sighting.uid: sighting for sighting in listed}
    sessions = {look_again(known.get(uid), sighting) for uid, sighting in listed_by_uid.items()}
    sessions |= {look_again(sighting, None) for uid, sighting in known.items() if uid not in listed_by_uid}
    return sorted(session for session in sessions if session)
