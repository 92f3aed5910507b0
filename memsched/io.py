"""Reading and writing Trace / Schedule files with errors that name the field path and the fix."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from memsched.errors import MemschedError, TraceFormatError
from memsched.schema import Schedule, Trace, validate_trace

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
    if p.is_dir():
        raise TraceFormatError(f"{what} file {str(p)!r} is a directory; give the JSON file inside it")
    if not p.exists():
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
    except RecursionError:
        raise TraceFormatError(
            f"{what} file {str(p)!r} nests its JSON too deeply to read; a {what} is a few levels deep: fix the file"
        ) from None
    except ValueError:  # Python's limit on the digits of an integer (4,300), which no real size reaches
        raise TraceFormatError(
            f"{what} file {str(p)!r} holds an integer of thousands of digits, which no size or count has; fix the file"
        ) from None


def load_trace(path: str | Path) -> Trace:
    data, what = _read_json(path, "trace"), f"trace {Path(path).name}"
    _not_the_other(data, path, "trace", "schedule", ("actions", "trace_hash"))
    try:
        return validate_trace(data)
    except ValidationError as err:
        raise TraceFormatError(describe_validation_error(err, what)) from None


def load_schedule(path: str | Path) -> Schedule:
    data = _read_json(path, "schedule")
    _not_the_other(data, path, "schedule", "trace", ("layers", "baseline"))
    return parse_model(Schedule, data, f"schedule {Path(path).name}")


def _not_the_other(data: Any, path: str | Path, wanted: str, other: str, keys: tuple[str, ...]) -> None:
    """A schedule given where a trace is due (or the other way round: arguments swapped) is said in one line,
    not as every field the other format lacks."""
    if isinstance(data, dict) and all(k in data for k in keys):
        raise TraceFormatError(
            f"{str(path)!r} is a {other} file, where a {wanted} file is due; check the order of the arguments"
        )


def check_outputs_spare_inputs(outputs: dict[str, str | Path | None], inputs: dict[str, str | Path | None]) -> None:
    """Refuse, before any work, an output path that is one of the command's input files (`solve t.json -o t.json`
    would replace the trace with the schedule). Keys name the flags or arguments; None values are left out, as are
    '-' and devices or pipes, which are written through and replace nothing."""
    files = {}
    for name, path in inputs.items():
        if path is None or str(path) == "-":
            continue
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode):
                files[(st.st_dev, st.st_ino)] = name
    for flag, path in outputs.items():
        if path is None or str(path) == "-":
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue  # not there yet: no input can be it
        same = files.get((st.st_dev, st.st_ino))
        if same is not None:
            raise MemschedError(
                f"{flag} {str(path)!r} is the {same} this command reads: writing it would replace that file; "
                f"give another path for {flag}"
            )


def save_model(obj: BaseModel, path: str | Path) -> None:
    """Write a Trace / Schedule as indented JSON to `path` (see write_text for how each kind of path is written)."""
    write_text(path, obj.model_dump_json(indent=2) + "\n")


def write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 text to `path`; '-' means standard output (see write_bytes)."""
    write_bytes(path, text.encode())


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` the way a user expects of an output file, and safely.

    * '-' writes to standard output.
    * A character or block device (/dev/null, a terminal) or a FIFO is written straight through: replacing it
      would turn the device node into a regular file (as root, /dev/null then breaks every other program).
    * A regular file, or a path that does not exist yet, is replaced atomically: the bytes go to a temporary
      file beside it, are flushed to disk, then renamed over the target, so a crash or an error leaves either
      the old file or the new one, never half of one, and no temporary file behind.
    * Modes: a new file gets 0666 less the umask, as a plain open() gives (mkstemp's 0600 would hide a
      schedule from a training job running as another user). Replacing an existing file keeps its mode (and
      its owner where the process may set it), as overwriting it in place would: a file the user made
      group-readable stays so.
    * A symlink is followed: the file it points to is replaced, the link stays.
    """
    if str(path) == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    p = Path(os.path.realpath(path))
    try:
        st: os.stat_result | None = p.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise MemschedError(f"cannot write {str(path)!r}: {e.strerror}; give a path you may write") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise MemschedError(f"cannot write {str(path)!r}: it is a directory; give a file path inside it")
    try:
        if st is not None and not stat.S_ISREG(st.st_mode):
            # Devices, FIFOs, sockets: write through, never replace the node.
            with open(p, "wb") as f:
                f.write(data)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            _replace_atomically(p, data, st)
    except PermissionError as e:
        raise MemschedError(
            f"cannot write {str(path)!r}: permission denied ({e.filename}); give a path in a folder you may write"
        ) from None
    except OSError as e:  # a folder that takes no new files (/proc, a full or read-only disk), a name too long
        raise MemschedError(
            f"cannot write {str(path)!r}: {e.strerror or e}; give a path in a folder you may write"
        ) from None


def _replace_atomically(p: Path, data: bytes, old: os.stat_result | None) -> None:
    # O_EXCL on a random name instead of mkstemp: mkstemp forces mode 0600, while os.open's 0666 is reduced
    # by the umask in the kernel, exactly as for open(), and without reading the process-wide umask.
    while True:
        tmp = p.parent / f".{p.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            if old is not None:
                os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))
                if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                    # Only root (or the owner of both) may give the file back to its owner; anyone else
                    # writes a file of their own, as any editor's atomic save does.
                    with contextlib.suppress(PermissionError):
                        os.fchown(f.fileno(), old.st_uid, old.st_gid)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
