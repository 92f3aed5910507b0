"""The installed layout of the `memsched` package as a tree of symbolic links under build/installed-view/.

setuptools' package-dir maps the top-level optimizer/, runtime/ and api/ folders into the `memsched` namespace, so
tools that find modules by walking folders (import-linter, mypy) see neither those three under `memsched` nor the
imports between them. The tree is built from the same package-dir table, so the checks and the install cannot
disagree. Used by .ci/lint-imports and .ci/typecheck.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIEW = ROOT / "build" / "installed-view"


def build_view() -> None:
    package_dir: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    shutil.rmtree(VIEW, ignore_errors=True)
    # Outer packages first: a nested one whose folder already sits where it belongs needs no link of its own.
    for name, folder in sorted(package_dir.items(), key=lambda kv: kv[0].count(".")):
        target, source = VIEW.joinpath(*name.split(".")), ROOT / folder
        if target.exists():
            assert target.resolve() == source.resolve(), f"{name}: {target} is not {source}"
            continue
        if "." not in name:  # a root package: a real folder of links, so its mapped subpackages can join it
            target.mkdir(parents=True)
            for child in source.iterdir():
                if child.name != "__pycache__" and child.name not in {n.split(".")[1] for n in package_dir if "." in n}:
                    (target / child.name).symlink_to(child)
        else:
            target.symlink_to(source, target_is_directory=True)
