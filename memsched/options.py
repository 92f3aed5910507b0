"""How to solve: the one definition of the solve options, shared by the optimizer, the CLI, the API, its job
rows and the client (a core contract, like the Trace and the Schedule).

Adding an option is one field here plus its use in the optimizer: the API's request and job bodies extend
this model, a job row stores it as one JSON column, the client sends `model_dump()`, and a test checks that
the CLI's `solve` command has a flag for every field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from memsched.errors import MemschedError
from memsched.hardware import LinkPreset, parse_link
from memsched.schema import Action, Trace
from memsched.units import MAX_BYTES, parse_bytes


class SolverName(StrEnum):
    """Which solver runs (docs/formulation.md, 'How solve() proceeds')."""

    AUTO = "auto"
    """The exact DP, the MILP on small traces where the DP leaves a gap, the local search on long ones."""
    DP = "dp"
    """The exact memory-state DP only (with the searches that give it candidates)."""
    CBC = "cbc"
    """The DP's bound, then the MILP with CBC (PuLP) for the rest of the time."""
    HIGHS = "highs"
    """The DP's bound, then the MILP with HiGHS."""
    CPSAT = "cpsat"
    """The DP's bound, then the MILP with OR-Tools CP-SAT."""
    HEURISTIC = "heuristic"
    """The greedy heuristic and the baselines only: fast, no bound."""


MILP_SOLVERS = (SolverName.CBC, SolverName.HIGHS, SolverName.CPSAT)
"""The solvers that name a MILP backend."""

SERVER_QUEUE_SLACK_S = 120.0
"""`solve --server` waits this long past the solve's time limit for the job's turn in the server's queue and
for the transfers (the server's limit counts from when a worker starts the job); then it names the job to fetch
later. No local process stops the solve there: it goes on, and its answer is kept."""


def not_a_bool(value: object, what: str) -> object:
    """`value` unchanged, unless it is true / false where `what` (a number) is asked: pydantic reads those as 1 / 0,
    so `"gap": false` would ask for a proof of gap 0 and `"time_limit_s": true` for one second, with no word said.
    For a field validator in `before` mode."""
    if isinstance(value, bool):
        raise ValueError(f"is {what}, not {str(value).lower()}")
    return value


MAX_WINDOW = 100_000
"""The largest window / segment length accepted (a bound on request size, far beyond any real trace)."""


class SolveOptions(BaseModel):
    """The options of one solve: what, besides the trace and the budget, decides its answer."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    solver: SolverName = SolverName.AUTO
    """Solver: auto | dp | cbc | highs | cpsat | heuristic."""
    time_limit_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """Wall-clock limit of the whole solve, seconds (candidates, searches and backends together)."""
    gap: float = Field(default=0.01, ge=0, lt=1, allow_inf_nan=False)
    """Relative optimality gap at which the solver may stop (0.01 = 1%)."""
    window: int | None = Field(default=None, ge=1, le=MAX_WINDOW)
    """MILP window W: a layer's offload done-by / prefetch-at stages lie within W layers of it (None: n on small
    traces, else 12). The DP has no window."""
    max_segment: int | None = Field(default=None, ge=1, le=MAX_WINDOW)
    """MILP segment cap L: the longest recompute segment the MILP may choose (None: n on small traces, else 16).
    The DP has no cap."""
    actions: list[Action] | None = None
    """Actions a plan may use, e.g. keep,recompute; keep is always among them. None: keep, offload and recompute,
    except on a trace measured on the CPU, where host memory is device memory and an offload lowers no peak:
    keep and recompute (give keep,offload,recompute to emulate offload there)."""

    link: LinkPreset | float | None = None
    """Host link the copies run over, for planning another machine without re-tracing: pcie3 | pcie4 | pcie5 |
    gh200 (measured pinned-copy rates, docs/hardware.md) or a rate in bytes/s such as 25e9. None: the trace's
    measured rates."""
    ranks_per_link: int | None = Field(default=None, ge=1, le=4096)
    """GPUs that share one host link (e.g. 8 behind one PCIe switch): each plans with 1/N of its rates.
    None: 1."""
    host_budget: int | None = Field(default=None, ge=0, le=MAX_BYTES)
    """Host-memory budget, bytes (or a size such as 64GiB): the most pinned host bytes a plan's offloaded
    copies may hold at once; the replay's pinned pool refuses to grow past it. 0 allows no offload (keep and
    recompute only). None: no limit."""

    @field_validator("time_limit_s", "gap", "window", "max_segment", "ranks_per_link", mode="before")
    @classmethod
    def _a_number(cls, v: object) -> object:
        return not_a_bool(v, "a number")

    @field_validator("link", mode="before")
    @classmethod
    def _link(cls, v: object) -> LinkPreset | float | None:
        return None if v is None else parse_link(v)

    @field_validator("host_budget", mode="before")
    @classmethod
    def _host_budget(cls, v: object) -> object:
        return None if v is None else parse_host_budget(v)

    @field_validator("actions")
    @classmethod
    def _actions(cls, v: list[Action] | None) -> list[Action] | None:
        if v is None:
            return None
        if Action.KEEP not in v:
            raise ValueError("must include keep (every plan keeps some layers), e.g. keep,recompute")
        return [a for a in Action if a in v]  # one order and no repeats: equal sets are equal options

    def least_budget_is_offloads(self, trace: Trace) -> bool:
        """Whether the smallest budget these options' plans reach is offload-all's, synchronously (one simulation:
        optimizer.budget.min_feasible_budget): offload allowed, with no host budget. Elsewhere it lies above that
        one, and only a solve finds it (the exact DP; with a host budget, the least host each budget needs)."""
        return Action.OFFLOAD in self.allowed_actions(trace) and self.host_budget is None

    def allowed_actions(self, trace: Trace) -> frozenset[Action]:
        """The actions a plan for `trace` may use (see `actions`)."""
        if self.host_budget == 0:
            # No host bytes at all: no offload, whatever else was asked (docs/formulation.md, 'Host budget').
            base = frozenset(self.actions) if self.actions is not None else frozenset(Action)
            return base - {Action.OFFLOAD}
        if self.actions is not None:
            return frozenset(self.actions)
        if trace.device.is_host:
            return frozenset({Action.KEEP, Action.RECOMPUTE})
        return frozenset(Action)

    @classmethod
    def from_user(cls, **values: Any) -> SolveOptions:
        """The options as a user gave them (CLI flags, a script): a bad value is a MemschedError with one line per
        field, naming it and its flag. (The API validates its request bodies itself and answers 422.)"""
        try:
            return cls(**values)
        except ValidationError as e:
            raise MemschedError(describe_validation_error(e)) from None

    @property
    def is_milp(self) -> bool:
        """Whether the solver names a MILP backend."""
        return self.solver in MILP_SOLVERS

    def job_fields(self) -> dict[str, Any]:
        """The options as JSON values: what a job's cache key hashes. Fields added after the first five leave
        the key when unset, so the jobs stored before they existed keep their keys (and their answers)."""
        out = self.model_dump(mode="json")
        for name in _ADDED_LATER:
            if out.get(name) is None:
                out.pop(name, None)
        return out


@dataclass(frozen=True)
class SolveResources:
    """How a solve runs, where that does not change its answer (so neither a job nor its cache key holds it)."""

    threads: int | None = None
    """MILP solver threads; None = the backend's default (CP-SAT: 2). The server sets it, not the request."""
    export_model: Path | None = None
    """Where to write the MILP model (LP/MPS or CP-SAT proto) for reproduction, if anywhere (the CLI's)."""
    started_at: float | None = None
    """time.perf_counter() value from which the time limit counts (None: when the solve is called). The CLI
    gives its process's start, so that the limit bounds what its user waits for, imports included."""


_HOST_HELP = "write it like 64GiB, 500MB or 1073741824 (bytes; 0 allows no offload)"
_ZERO_SIZE = re.compile(r"^\s*0*(\.0*)?\s*[a-zA-Z]*\s*$")


def parse_host_budget(value: object) -> int:
    """A host budget as a user gave it: bytes (an integer) or a size such as 64GiB (the one size parser,
    units.parse_bytes); 0 is allowed (no offload). Raises ValueError naming what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"a host budget is a size, not {value!r}; {_HOST_HELP}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be >= 0 bytes, got {value}; {_HOST_HELP}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"cannot read {value!r} as a size; {_HOST_HELP}")
    text = value.strip()
    if text.endswith("%"):
        raise ValueError(f"a host budget is a size, not a share ({value!r}); {_HOST_HELP}")
    if _ZERO_SIZE.match(text) and any(c.isdigit() for c in text):
        return 0
    try:
        return parse_bytes(text, "host_budget")
    except MemschedError:
        raise ValueError(f"cannot read {value!r} as a size; {_HOST_HELP}") from None


_ADDED_LATER = ("actions", "link", "ranks_per_link", "host_budget")
"""Options added after memsched 0.1's solver, time_limit_s, gap, window and max_segment (see job_fields)."""

_FLAG = {name: "--" + name.removesuffix("_s").replace("_", "-") for name in SolveOptions.model_fields}
"""The CLI flag of each option (time_limit_s -> --time-limit)."""


def cli_flag(name: str) -> str:
    """The CLI flag that sets option `name`."""
    return _FLAG[name]


def option_help(name: str) -> str:
    """The option's docstring, as the CLI's --help shows it (the API's OpenAPI shows the same text)."""
    return " ".join((SolveOptions.model_fields[name].description or "").split())


def describe_validation_error(e: ValidationError) -> str:
    """One line per bad field, naming the field and what it accepts."""
    parts = []
    for err in e.errors():
        field = ".".join(str(p) for p in err["loc"]) or "options"
        name = field.split(".")[-1]
        hint = f" ({cli_flag(name)} on the command line)" if name in _FLAG else ""
        parts.append(f"{field}: {err['msg']}, got {err.get('input')!r}{hint}")
    return "; ".join(parts)
