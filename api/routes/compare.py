"""POST /v1/compare: the baseline table (the CLI's `compare`), via the shared service function."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from memsched.api.deps import DatabaseDep, OwnerDep, SettingsDep
from memsched.api.errors import ApiError
from memsched.api.routes.common import request_budget, resolve_trace
from memsched.api.schemas import CompareOut, CompareRequest, CompareRow, error_responses
from memsched.errors import MemschedError
from memsched.service import IncomputableTraceError, compare_policies

router = APIRouter(prefix="/v1", tags=["compare"])


@router.post(
    "/compare",
    response_model=CompareOut,
    summary="Compare the baseline policies under a budget",
    description="Every baseline (keep-all, checkpoint-all, sqrt(n) segments, offload-all) judged by the "
    "simulator under the budget. Infeasible budgets are not an error here: the table shows which fit.",
    responses=error_responses(400, 401, 404, 413, 422),
)
async def compare(req: CompareRequest, db: DatabaseDep, owner: OwnerDep, settings: SettingsDep) -> CompareOut:
    def run() -> CompareOut:
        with db.session() as s:
            row, trace = resolve_trace(s, owner, settings, req.trace_id, req.trace)
        budget = request_budget(req.budget, trace, check_feasible=False)
        try:
            c = compare_policies(trace, budget, req.link, req.ranks_per_link, req.host_budget)
        except IncomputableTraceError as e:
            raise ApiError(422, str(e), "link" if req.link is not None and e.where == "device" else "trace") from None
        except MemschedError as e:
            raise ApiError(422, str(e), "budget") from None
        except ArithmeticError as e:
            raise ApiError(422, f"cannot compute with this trace ({e}); check the trace's numbers", "trace") from None
        return CompareOut(
            trace_id=row.id,
            budget_bytes=c.budget_bytes,
            static_bytes=c.static_bytes,
            keepall_activation_bytes=c.keepall_activation_bytes,
            rows=[CompareRow.model_validate(r.to_json()) for r in c.rows],
        )

    # A few simulations of the whole trace: CPU work in a thread, so the event loop keeps serving.
    return await run_in_threadpool(run)
