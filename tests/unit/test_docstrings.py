"""Every public name of the documented API has a docstring: the names the API reference is
generated from (the top level, ``taiji.policies``, ``taiji.strategies``, ``taiji.data``,
``taiji.errors``) and the public methods and properties of their classes."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = ("taiji", "taiji.policies", "taiji.strategies", "taiji.data", "taiji.errors")


def public_names(module) -> list[str]:
    """``__all__``, or else the classes and functions the module defines without a leading ``_``."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module.__name__
    ]


def own_doc(obj) -> str | None:
    """The object's own docstring; a dataclass's generated signature does not count."""
    doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
    if inspect.isclass(obj) and doc and doc.startswith(f"{obj.__name__}(") and doc.rstrip().endswith(")"):
        try:
            if doc == obj.__name__ + str(inspect.signature(obj)).replace(" -> None", ""):
                return None
        except (TypeError, ValueError):
            pass
    return doc.strip() if doc else None


def members(cls) -> list[tuple[str, object]]:
    """The public methods and properties a class defines itself (inherited ones are checked where
    they are defined; an override inherits its base's docstring)."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            found.append((name, getattr(cls, name) if not isinstance(value, property) else value))
    return found


def undocumented(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    missing = []
    for name in public_names(module):
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue  # modules, type aliases (Decision) and constants hold no docstring of their own
        if not own_doc(obj):
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(obj) and obj.__module__.startswith("taiji"):
            missing += [
                f"{module_name}.{name}.{member}"
                for member, value in members(obj)
                if not inspect.getdoc(value)
            ]
    return missing


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_has_a_docstring(module_name):
    assert undocumented(module_name) == []


def test_the_check_sees_a_missing_docstring():
    class Documented:
        """A class."""

        def method(self):
            """A method."""

    class Bare:
        def method(self):
            pass

    assert own_doc(Documented) == "A class." and own_doc(Bare) is None
    assert [name for name, value in members(Bare) if not inspect.getdoc(value)] == ["method"]
    assert [name for name, value in members(Documented) if not inspect.getdoc(value)] == []
