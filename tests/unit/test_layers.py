"""The import boundaries at run time, beside the static contracts of `make lint` (.ci/lint-imports): importing
a layer loads none of the layers it must not know, torch included (the core install has no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import importlib, pkgutil, sys
for name in {modules!r}:
    mod = importlib.import_module(name)
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), name + "."):
        importlib.import_module(info.name)
print(sorted({{m for m in sys.modules for f in {forbidden!r} if m == f or m.startswith(f + ".")}}))
"""


def _forbidden_contracts() -> list[tuple[str, list[str], list[str]]]:
    """The static contracts of pyproject.toml (one home for the rules): each forbidden contract whose indirect
    imports count too, as (name, source modules, forbidden modules)."""
    import tomllib
    from pathlib import Path

    doc = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    return [
        (c["name"], c["source_modules"], c["forbidden_modules"])
        for c in doc["tool"]["importlinter"]["contracts"]
        if c["type"] == "forbidden" and not c.get("allow_indirect_imports", False)
    ]


@pytest.mark.parametrize(("name", "modules", "forbidden"), _forbidden_contracts(), ids=lambda v: str(v)[:40])
def test_a_layer_loads_none_of_the_layers_it_must_not_know(name, modules, forbidden):
    code = CHECK.format(modules=modules, forbidden=forbidden)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", name
