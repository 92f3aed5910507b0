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

PARTS = ["memsched.optimizer", "memsched.runtime", "memsched.api", "memsched.service", "memsched.cli"]


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        (
            ["memsched.optimizer"],
            ["torch", "transformers", "memsched.runtime", "memsched.api", "memsched.service", "memsched.cli"],
        ),
        (["memsched.schema", "memsched.units", "memsched.errors", "memsched.io"], PARTS),
    ],
    ids=["optimizer", "core"],
)
def test_a_layer_loads_none_of_the_layers_it_must_not_know(modules, forbidden):
    code = CHECK.format(modules=modules, forbidden=forbidden)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
