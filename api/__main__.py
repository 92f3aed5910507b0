"""`python -m memsched.api`: run the service with settings from MEMSCHED_* variables (as `memsched serve`)."""

from memsched.api.server import serve

if __name__ == "__main__":
    serve()
