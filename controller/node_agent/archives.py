"""The kubelet's checkpoint archives as the agent finds them (pure).

The kubelet (v1.37, ``CheckpointContainer``) writes each archive as
``<its checkpoints directory>/checkpoint-<pod>_<namespace>-<container>-<RFC 3339 time>.tar`` and
answers with that **host** path (``{"items": [path]}``). The agent sees the directory where it
is mounted (``CONTROLLER_NODE_AGENT_CHECKPOINT_DIRECTORY``): ``archive_path`` takes only the
answer's file name, and only when it is the name the kubelet gives an archive of the very pod
asked about, so an answer cannot point the agent at any other file. The agent writes the OCI
archive of the image beside it (``oci_path``) and removes both, whatever happens; ``strays``
names what a crashed agent left there: files named as those two are for the sandbox
namespace's pods, older than the grace, and nothing else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

_STAMP = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})"
_POD = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
OCI_SUFFIX = ".oci.tar"


class ArchiveRefused(ValueError):
    """The kubelet's answer names no archive of the pod asked about."""


def archive_name(pod: str, namespace: str, container: str) -> re.Pattern[str]:
    """The file names the kubelet gives the archives of ``container`` in ``namespace/pod``."""
    return re.compile(rf"checkpoint-{re.escape(pod)}_{re.escape(namespace)}-{re.escape(container)}-{_STAMP}\.tar")


def archive_path(directory: Path, answer: str, pod: str, namespace: str, container: str) -> Path:
    """The archive the kubelet's 200 answer names, inside ``directory`` (where the agent has the
    kubelet's checkpoints directory); ``ArchiveRefused`` when the answer names anything but
    exactly one archive of that pod's container (another file, a path game, another pod's)."""
    try:
        items = json.loads(answer)["items"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ArchiveRefused(f"the kubelet's answer names no archive: {answer[:200]!r}") from exc
    if not isinstance(items, list) or len(items) != 1 or not isinstance(items[0], str):
        raise ArchiveRefused(f"the kubelet's answer names {items!r:.200} instead of one archive")
    name = PurePosixPath(items[0]).name
    if not archive_name(pod, namespace, container).fullmatch(name):
        raise ArchiveRefused(f"the kubelet's answer names {items[0][:200]!r}, no archive of {namespace}/{pod}")
    return directory / name


def oci_path(archive: Path) -> Path:
    """Where the agent writes the checkpoint image's OCI archive: beside the kubelet's archive
    (on the node's disk, not the agent's writable layer)."""
    return archive.with_name(archive.name + OCI_SUFFIX)


def strays(
    files: Iterable[tuple[str, float]], namespace: str, container: str, now: float, grace_seconds: float
) -> list[str]:
    """Of ``files`` (name, modification time) in the checkpoints directory, those a crash of the
    agent left: named as the kubelet names an archive of ``container`` in a pod of ``namespace``
    (or as the agent names its OCI archive beside one) and unchanged for ``grace_seconds``. Any
    other file (an archive of another namespace's pod, one still being written) is not the
    agent's. (A pod name has no ``_`` and the container is fixed, so a longer namespace's
    archive never reads as one of ``namespace``.)"""
    pattern = re.compile(rf"checkpoint-{_POD}_{re.escape(namespace)}-{re.escape(container)}-{_STAMP}\.tar")
    return sorted(
        name
        for name, modified in files
        if pattern.fullmatch(name.removesuffix(OCI_SUFFIX)) and now - modified >= grace_seconds
    )
