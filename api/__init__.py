"""memsched.api: the optimizer as a REST service (FastAPI). `create_app()` builds it; `memsched serve` runs it."""

from memsched.api.main import create_app
from memsched.api.settings import Settings, get_settings

__all__ = ["Settings", "create_app", "get_settings"]
