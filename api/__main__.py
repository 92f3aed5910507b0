"""`python -m memsched.api`: run the service with settings from MEMSCHED_* variables (as `memsched serve`)."""

import sys

from pydantic import ValidationError

from memsched.api.server import serve
from memsched.api.settings import Settings
from memsched.io import describe_validation_error

if __name__ == "__main__":
    try:
        settings = Settings()
    except ValidationError as e:
        # A bad MEMSCHED_* variable: one line per problem, naming it, instead of a traceback.
        sys.stderr.write(describe_validation_error(e, "settings (MEMSCHED_*)") + "\n")
        sys.exit(2)
    serve(settings)
