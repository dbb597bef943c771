"""The exception tree drawn in ``errors.py`` is the tree the code defines."""

from __future__ import annotations

import importlib
import pkgutil
import re

import controller
from controller import errors


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def test_the_drawn_tree_names_every_controller_error_under_its_parent() -> None:
    for module in pkgutil.walk_packages(controller.__path__, "controller."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)  # so subclasses defined anywhere are seen
    assert errors.__doc__ is not None
    drawn: dict[str, str] = {}
    parents: list[str] = []
    for line in errors.__doc__.splitlines():
        match = re.match(r"^    ((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)", line)
        if match is None:
            continue
        depth = len(match.group(1)) // 4 + (1 if "── " in line else 0)
        del parents[depth:]
        if parents:
            drawn[match.group(2)] = parents[-1]
        parents.append(match.group(2))
    defined = {cls.__name__: cls.__mro__[1].__name__ for cls in _subclasses(errors.ControllerError)}
    assert drawn == defined
    assert all(getattr(errors, name).__module__ == "controller.errors" for name in defined)
