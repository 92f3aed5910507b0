"""Helpers of the service tests: a real uvicorn server (`python -m memsched.api` in a subprocess, on a free
loopback port), and the PostgreSQL connection used to create a throw-away database. The fixtures built on
them are in tests/conftest.py."""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from memsched.schema import Trace

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

    @contextlib.contextmanager
    def throwaway_database(self, prefix: str = "memsched_test") -> Iterator[str]:
        """A fresh database's URL, dropped afterwards (even if the test fails)."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield self.url(name)
        finally:
            with self.connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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


@contextlib.contextmanager
def installing() -> Iterator[None]:
    """One test process at a time installs or starts a system package (`make test` runs two pytest workers):
    dpkg's own lock makes a second apt-get fail at once instead of waiting, so the later test would skip. Whoever
    waits checks again, inside, whether the first one installed it."""
    with open(Path(tempfile.gettempdir()) / "memsched-test-install.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def try_install_and_start_pg() -> str:
    """Start Debian's PostgreSQL if it is installed; install it first when MEMSCHED_TEST_INSTALL_PG=1 (CI) and
    we are root with apt-get; give this user a superuser role. Returns what was done, for the skip message."""
    with installing():
        if find_pg()[0] is not None:
            return "started by another test process"
        return _install_and_start_pg()


def _install_and_start_pg() -> str:
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


# ------------------------------------------------------------------------------------------------ brokers

REDIS_URL = os.environ.get("MEMSCHED_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("MEMSCHED_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def unique_queue() -> str:
    """A queue name (and Redis key prefix) of this test run alone: parallel runs on the shared brokers do not
    see each other's jobs."""
    return f"memsched-test-{uuid.uuid4().hex[:12]}"


def purge_broker(url: str, queue: str, key_prefix: str) -> None:
    """Leave the shared broker as found: Redis keys under the run's prefix, or the run's RabbitMQ queue."""
    if url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=f"{key_prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
        return
    from kombu import Connection

    with Connection(url, connect_timeout=3) as conn:
        conn.default_channel.queue_delete(queue)


def broker_answers(url: str) -> str:
    """'' if a broker answers at url, else why not."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
        return ""
    except Exception as e:  # noqa: BLE001  # whatever the client raises, the answer is "no broker here"
        return f"{type(e).__name__}: {e}"


def try_install_redis() -> str:
    """apt-get redis-server when MEMSCHED_TEST_INSTALL_REDIS=1 (CI) and we are root; returns what was done."""
    if os.environ.get("MEMSCHED_TEST_INSTALL_REDIS") != "1":
        return "set MEMSCHED_TEST_INSTALL_REDIS=1 to let the tests apt-get it"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "installing redis-server needs root and apt-get"
    with installing():
        if shutil.which("redis-server") is not None:
            return "installed by another test process"
        return "; ".join([_run(["apt-get", "update", "-q"]), _run(["apt-get", "install", "-y", "-q", "redis-server"])])


class RedisServer:
    """Our own redis-server on a free loopback port, persisting to an append-only file so that its queue
    survives a stop and start (the broker-down test stops it; the shared Redis is never stopped)."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> RedisServer:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed"
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no"]
        log = (self.dir / "redis.log").open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): the append-only file holds every message."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)
        self.proc = None


class Worker:
    """`memsched worker` in a subprocess (its own process group, so kill() takes its pool processes too)."""

    def __init__(self, env: dict[str, str], log_path: Path, *args: str, prelude: str = "") -> None:
        """`prelude`: Python run before the worker starts, to inject a fault (a solver that ignores its time
        limit) or to report another memsched version."""
        self.env = env
        self.log_path = log_path
        code = f"{prelude}\nfrom memsched.cli import main\nmain()"
        self.argv = [sys.executable, "-c", code, "worker", *args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Worker:
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.log()}")
            if " ready." in self.log_path.read_text(errors="replace")[start:]:
                return self
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"worker did not become ready in {timeout} s:\n{self.log()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole worker (main and pool processes) at once, as a lost machine would."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # The pool processes exit with their main process; make sure none is left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


def upload_trace(server: Server, trace: Trace) -> str:
    """Store `trace` on the server (POST /v1/traces) and return its id."""
    with server.client() as c:
        r = c.post("/v1/traces", json=trace.model_dump(mode="json"))
        assert r.status_code in (200, 201), r.text
        return str(r.json()["id"])
