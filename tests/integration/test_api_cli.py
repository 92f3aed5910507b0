"""`memsched serve`: options override the MEMSCHED_* environment, and bad settings are one-line errors."""

from __future__ import annotations

import subprocess
import sys

from helpers.api import Server, free_port

CLI = [sys.executable, "-c", "from memsched.cli import main; main()"]


def test_memsched_serve_options_override_the_environment(tmp_path) -> None:
    port = free_port()
    db = tmp_path / "cli.db"
    argv = [*CLI, "serve", "--port", str(port), "--database-url", f"sqlite:///{db}", "--workers", "1"]
    # The environment names another port and database: the options must win.
    srv = Server(f"sqlite:///{tmp_path / 'env.db'}", tmp_path / "serve.log", argv=argv)
    srv.port, srv.url = port, f"http://127.0.0.1:{port}"
    srv.start()
    try:
        with srv.client(key=None) as c:
            ready = c.get("/readyz").json()
        assert ready == {"status": "ok", "version": ready["version"], "database": "sqlite", "workers": 1}
        assert db.exists() and not (tmp_path / "env.db").exists()
    finally:
        srv.stop()


def test_memsched_serve_rejects_bad_settings(tmp_path) -> None:
    r = subprocess.run(
        [*CLI, "serve", "--workers", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "MEMSCHED_API_KEYS": "short"},
    )
    assert r.returncode == 2, r.stderr
    assert "workers" in r.stderr and "api_keys" in r.stderr and "Traceback" not in r.stderr
