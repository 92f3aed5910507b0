"""memsched.api: the optimizer as a REST service (FastAPI). `create_app()` builds it; `memsched serve` runs it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memsched.api.main import create_app
    from memsched.api.settings import Settings, get_settings

__all__ = ["Settings", "create_app", "get_settings"]


def __getattr__(name: str) -> Any:
    # Lazy: the solver worker processes import memsched.api.runners.solve_process, and should not pay for FastAPI.
    if name == "create_app":
        from memsched.api.main import create_app

        return create_app
    if name in ("Settings", "get_settings"):
        from memsched.api import settings

        return getattr(settings, name)
    raise AttributeError(f"module 'memsched.api' has no attribute {name!r}")
