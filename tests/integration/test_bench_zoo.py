"""Smoke tests of the zoo benchmark (bench/zoo.py): it starts as its docstring says, from the checkout's root,
and its factories refuse what they cannot honour. It benchmarks nothing here (its models build in its run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is a folder of the checkout, not an installed package
    sys.path.insert(0, str(REPO))

pytest.importorskip("transformers")


def test_the_zoo_starts_as_documented():
    # `python -m bench.zoo` imports the conformance tests' models, which import the tests' helpers: a fresh
    # interpreter, as a user runs it, must find both (it did not, 2026-12-07).
    run = subprocess.run(
        [sys.executable, "-m", "bench.zoo", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--models" in run.stdout and "wav2vec2" in run.stdout


def test_every_zoo_factory_refuses_what_it_cannot_honour_before_building():
    from bench.zoo import ZOO

    for factory in ZOO.values():
        with pytest.raises(ValueError, match="cannot honour"):
            factory(device="cuda")
