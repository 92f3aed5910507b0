"""Helpers of the service tests: a real uvicorn server (`python -m memsched.api` in a subprocess, on a free
loopback port), and the PostgreSQL connection used to create a throw-away database. The fixtures built on
them are in conftest_api.py."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
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

SOCKET_DIR = "/var/run/postgresql"


@dataclass(frozen=True)
class PgTarget:
    """How to reach a PostgreSQL server: TCP (trust auth) or the Debian unix socket (peer auth)."""

    host: str
    user: str

    def connect(self, dbname: str = "postgres"):  # type: ignore[no-untyped-def]
        import psycopg

        return psycopg.connect(
            host=self.host, port=PG_PORT, user=self.user, dbname=dbname, autocommit=True, connect_timeout=3
        )

    def url(self, dbname: str) -> str:
        if self.host.startswith("/"):
            return f"postgresql+psycopg://{self.user}@/{dbname}?host={self.host}&port={PG_PORT}"
        return f"postgresql+psycopg://{self.user}@{self.host}:{PG_PORT}/{dbname}"


def find_pg() -> tuple[PgTarget | None, str]:
    """A server and user that can create databases without a password, or None and why not."""
    import psycopg

    me = getpass.getuser()
    candidates = [PgTarget(PG_HOST, u) for u in dict.fromkeys(("postgres", "root", me))]
    candidates.append(PgTarget(SOCKET_DIR, me))  # a fresh Debian install: peer auth on the socket
    why = []
    for target in candidates:
        try:
            with target.connect():
                return target, ""
        except psycopg.Error as e:
            why.append(f"{target.user}@{target.host}: {str(e).strip().splitlines()[0][:120]}")
    return None, "; ".join(why)


def _run(cmd: list[str], timeout: float = 600) -> str:
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    return f"`{' '.join(cmd)}` -> {r.returncode}" + (f" ({r.stderr.strip()[-200:]})" if r.returncode else "")


def try_install_and_start_pg() -> str:
    """Start Debian's PostgreSQL if it is installed; install it first when MEMSCHED_TEST_INSTALL_PG=1 (CI) and
    we are root with apt-get; give this user a superuser role. Returns what was done, for the skip message."""
    done = []
    installed = Path("/etc/postgresql").is_dir() and shutil.which("pg_ctlcluster") is not None
    if not installed:
        if os.environ.get("MEMSCHED_TEST_INSTALL_PG") != "1":
            return "PostgreSQL is not installed (set MEMSCHED_TEST_INSTALL_PG=1 to let the tests apt-get it)"
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            return "PostgreSQL is not installed and cannot be: installing needs root and apt-get"
        done.append(_run(["apt-get", "update", "-q"]))
        done.append(_run(["apt-get", "install", "-y", "-q", "postgresql"]))
        if not Path("/etc/postgresql").is_dir():
            return "; ".join(done)
    for version in sorted(os.listdir("/etc/postgresql")):
        done.append(_run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"], 60))
    time.sleep(2)
    me = getpass.getuser()
    if me != "postgres" and shutil.which("runuser") and os.geteuid() == 0:
        # Peer auth maps OS user -> role of the same name: give ours one (fails harmlessly if it exists).
        done.append(_run(["runuser", "-u", "postgres", "--", "psql", "-qc", f'CREATE ROLE "{me}" SUPERUSER LOGIN'], 60))
    return "; ".join(done)
