"""User-facing error types. Every one of them is a ValueError whose message names the problem and the fix.

The CLI maps them to exit code 2 and the API to a 4xx; anything else is an internal error.
"""

from __future__ import annotations

CLI_TO_API_FIXES = {
    "Raise --budget to at least that": "Raise the request's `budget` field to at least that",
    "Raise --host-budget to at least that, or raise --budget": (
        "Raise the request's `host_budget` field to at least that, or its `budget`"
    ),
}
"""A fix as the CLI words it, and as the REST service does (the request field, not the flag): the service says
the one (api.errors.api_message), and the CLI's client of a server turns it back (service.client)."""


class MemschedError(ValueError):
    """A problem with the user's input (file, budget, options) that the user can fix."""


class TraceFormatError(MemschedError):
    """A trace, schedule or profile file that cannot be read or does not validate."""


class ScheduleMismatchError(MemschedError):
    """A schedule applied to a trace or model it was not made for."""


class InfeasibleBudgetError(MemschedError):
    """No schedule fits the budget. Carries the smallest budget that is feasible, computed, not guessed."""

    def __init__(
        self,
        budget_bytes: int,
        min_feasible_bytes: int,
        detail: str = "",
        proven: bool = True,
        unproven_why: str = "",
    ) -> None:
        self.budget_bytes = budget_bytes
        self.min_feasible_bytes = min_feasible_bytes
        self.proven = proven
        """False when `min_feasible_bytes` is a budget known to fit, but the search for a smaller one could not
        tell every budget below it (a plan restricted to keep and recompute): `unproven_why` says what stopped it."""
        self.unproven_why = unproven_why or "the search for it ran out of time"
        """What stopped the search for a smaller budget, where not proven."""
        from memsched.units import format_bytes

        smallest = (
            "the smallest feasible budget"
            if proven
            else f"the smallest budget found to fit (a smaller one may exist: {self.unproven_why})"
        )
        msg = (
            f"budget: {format_bytes(budget_bytes)} ({budget_bytes} bytes) is infeasible; {smallest} for this trace "
            f"is {format_bytes(min_feasible_bytes)} ({min_feasible_bytes} bytes). Raise --budget to at least that"
        )
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class InfeasibleHostBudgetError(MemschedError):
    """A device budget that some plan fits, but none within the host budget (SolveOptions.host_budget).
    Carries the smallest host budget that works at this device budget, computed, not guessed."""

    def __init__(
        self, host_budget_bytes: int, budget_bytes: int, min_host_bytes: int, proven: bool = True, detail: str = ""
    ) -> None:
        self.host_budget_bytes = host_budget_bytes
        self.budget_bytes = budget_bytes
        self.min_host_bytes = min_host_bytes
        self.detail = detail
        """How the smallest host budget was established (part of the message)."""
        self.proven = proven
        """False when `min_host_bytes` is a host budget known to work (a plan holds that much), but the search
        for a smaller one was cut short: the smallest lies at or below it."""
        from memsched.units import format_bytes

        smallest = "the smallest host budget that works" if proven else "a host budget that works (at most this)"
        msg = (
            f"host_budget: {format_bytes(host_budget_bytes)} ({host_budget_bytes} bytes) holds too little: no plan "
            f"fits the device budget of {format_bytes(budget_bytes)} with its offloaded copies within it; "
            f"{smallest} at this device budget is {format_bytes(min_host_bytes)} ({min_host_bytes} bytes). "
            "Raise --host-budget to at least that, or raise --budget"
        )
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class UnsettledBudgetError(MemschedError):
    """A budget below every baseline of the allowed actions that the exact DP could neither fit a plan to nor
    rule out in its time (or while its kernels compiled). Carries the smallest budget known to fit."""

    def __init__(self, message: str, fits_bytes: int) -> None:
        self.fits_bytes = fits_bytes
        """The smallest budget a plan of these actions is known to fit (the best baseline's peak)."""
        super().__init__(message)

    def __reduce__(self) -> tuple[type[UnsettledBudgetError], tuple[str, int]]:
        return (UnsettledBudgetError, (str(self), self.fits_bytes))


class UserCodeError(MemschedError):
    """The user's own code (a model factory, the model's training step) raised before memsched changed anything
    it runs: the fix is in that code, and the message says which call failed and with what."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, at most `limit` characters: what a UserCodeError quotes."""
    text = " ".join(str(e).split()) or "(no message)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SolverError(RuntimeError):
    """A solver backend failed (crashed, missing binary, bad status). Reported, never silently replaced."""
