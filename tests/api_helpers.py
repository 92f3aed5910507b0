"""Helpers of the service tests: a real uvicorn server (`python -m memsched.api` in a subprocess, on a free
loopback port), and the PostgreSQL connection used to create a throw-away database. The fixtures built on
them are in conftest_api.py."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

KEY_A = "test-key-alpha-0001"
KEY_B = "test-key-bravo-0002"

PG_HOST = os.environ.get("MEMSCHED_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("MEMSCHED_TEST_PG_PORT", "5432"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`python -m memsched.api` in a subprocess, configured by MEMSCHED_* variables."""

    def __init__(self, database_url: str, log_path: Path, argv: list[str] | None = None, **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = {
            **os.environ,
            "MEMSCHED_DATABASE_URL": database_url,
            "MEMSCHED_HOST": "127.0.0.1",
            "MEMSCHED_PORT": str(self.port),
            "MEMSCHED_WORKERS": "2",
            "MEMSCHED_LOG_LEVEL": "info",
            **{f"MEMSCHED_{k.upper()}": v for k, v in settings.items()},
        }
        self.argv = argv or [sys.executable, "-m", "memsched.api"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Server:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not become ready in {timeout} s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def client(self, key: str | None = KEY_A, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)


# ------------------------------------------------------------------------------------------------ PostgreSQL


def pg_connect(user: str, dbname: str = "test"):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(host=PG_HOST, port=PG_PORT, user=user, dbname=dbname, autocommit=True, connect_timeout=3)


def find_pg_user() -> tuple[str | None, str]:
    """A user that can connect (trust auth), or None and why not."""
    import psycopg

    why = ""
    for user in ("postgres", "root", os.environ.get("USER", "")):
        if not user:
            continue
        try:
            with pg_connect(user):
                return user, ""
        except psycopg.Error as e:
            why = f"{type(e).__name__}: {str(e).strip()[:200]}"
    return None, why


def try_start_pg() -> str:
    """Start the Debian cluster if it is installed but not running; returns what happened."""
    if not Path("/etc/postgresql").is_dir() or shutil.which("pg_ctlcluster") is None:
        return "no Debian PostgreSQL installation (/etc/postgresql, pg_ctlcluster) to start"
    out = []
    for version in sorted(os.listdir("/etc/postgresql")):
        r = subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        out.append(f"pg_ctlcluster {version} main start -> {r.returncode} {r.stderr.strip()[:200]}")
    time.sleep(2)
    return "; ".join(out)
