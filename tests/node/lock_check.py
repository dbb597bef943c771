"""Run inside the controller image (tests/node/images.sh): its Python environment holds exactly
the pins of lock/product.txt that apply to it, plus the package itself and the base's pip.

    python lock_check.py LOCK_FILE

Prints one line per difference and exits 1 when there is any. Reads the lock the way
tests/unit/test_lock.py does; needs only the standard library and ``packaging`` (a pin of the
lock itself).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import sysconfig

from packaging.markers import Marker
from packaging.utils import canonicalize_name

PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>[^ ;\\]+)\s*(?:;\s*(?P<marker>[^\\]+?))?\s*\\?$")
# Installed, not pinned: the package itself (--no-deps) and the installer of the base's venv.
NOT_LOCKED = {"sandbox-controller", "pip"}


def main(lock: str) -> int:
    wanted: dict[str, str] = {}
    with open(lock) as text:
        for line in text:
            match = PIN.match(line.rstrip("\n"))
            if match and (match["marker"] is None or Marker(match["marker"]).evaluate()):
                wanted[canonicalize_name(match["name"])] = match["version"]
    where = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    have = {
        canonicalize_name(d.metadata["Name"]): d.version
        for d in importlib.metadata.distributions(path=where)
        if canonicalize_name(d.metadata["Name"]) not in NOT_LOCKED
    }
    problems = [
        f"{n}: lock {wanted[n]}, installed {have[n]}"
        for n in sorted(wanted.keys() & have.keys())
        if wanted[n] != have[n]
    ]
    problems += [f"{n}: lock {wanted[n]}, not installed" for n in sorted(wanted.keys() - have.keys())]
    problems += [f"{n}: installed {have[n]}, not in the lock" for n in sorted(have.keys() - wanted.keys())]
    for problem in problems:
        print(f"controller image differs from {lock}: {problem}")
    if not problems:
        print(f"controller image: {len(have)} packages, exactly the lock's")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
