"""Reading and writing Trace / Schedule files with errors that name the field path and the fix."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from memsched.errors import TraceFormatError
from memsched.schema import Schedule, Trace

M = TypeVar("M", bound=BaseModel)

_FIXES = {
    "greater_than_equal": "use a value >= the limit",
    "greater_than": "use a value above the limit",
    "finite_number": "use a finite number (not NaN or infinity)",
    "missing": "add the field",
    "extra_forbidden": "remove the field (or check its spelling)",
    "int_type": "use an integer",
    "int_from_float": "use a whole number of bytes",
    "float_type": "use a number",
    "float_parsing": "use a number",
    "string_type": "use a string",
    "list_type": "use a list",
    "too_short": "add at least one entry",
    "enum": "use one of the allowed values",
}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def describe_validation_error(err: ValidationError, what: str) -> str:
    """One line per problem (at most 5), each naming the field path, the problem and the fix."""
    lines = []
    for e in err.errors()[:5]:
        msg = e["msg"].removeprefix("Value error, ")
        fix = _FIXES.get(e["type"], "")
        ctx = e.get("ctx") or {}
        if e["type"] == "greater_than_equal":
            fix = f"use a value >= {ctx.get('ge')}"
        elif e["type"] == "greater_than":
            fix = f"use a value > {ctx.get('gt')}"
        got = f" (got {e['input']!r})" if e["type"] not in ("missing", "value_error") and "input" in e else ""
        if len(got) > 80:
            got = ""
        line = f"{what}: {_loc(tuple(e['loc']))}: {msg}{got}"
        if fix:
            line += f"; fix: {fix}"
        lines.append(line)
    more = len(err.errors()) - 5
    if more > 0:
        lines.append(f"... and {more} more problem(s)")
    return "\n".join(lines)


def parse_model(model: type[M], data: Any, what: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise TraceFormatError(describe_validation_error(err, what)) from None


def _read_json(path: str | Path, what: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise TraceFormatError(f"{what} file {str(p)!r} does not exist; check the path")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise TraceFormatError(
            f"{what} file {str(p)!r} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            f"fix the file or re-export it"
        ) from None
    except UnicodeDecodeError:
        raise TraceFormatError(f"{what} file {str(p)!r} is not UTF-8 text JSON; give a JSON file") from None


def load_trace(path: str | Path) -> Trace:
    return parse_model(Trace, _read_json(path, "trace"), f"trace {Path(path).name}")


def load_schedule(path: str | Path) -> Schedule:
    return parse_model(Schedule, _read_json(path, "schedule"), f"schedule {Path(path).name}")


def save_model(obj: BaseModel, path: str | Path) -> None:
    """Write atomically (temp file + rename) so an interrupted write never leaves half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(obj.model_dump_json(indent=2))
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
