"""/docs works on an air-gapped machine: a real `python -m memsched.api` on 127.0.0.1, opened in headless
Chromium that can resolve no other host, renders Swagger UI with the service's operations (its script and
stylesheet come from the service, not a CDN), and the screenshot is not blank. Stopping the server leaks
no semaphores (the solver pool is shut down cleanly)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from helpers.api import Server, free_port
from helpers.browser import find_chromium, try_install_chromium
from memsched.api.examples import synthetic_trace

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def chromium() -> str:
    exe = find_chromium()[0]
    if exe is None:
        done = try_install_chromium()
        exe = find_chromium()[0]
        if exe is None:
            pytest.skip(f"no headless Chromium to render /docs with: {done}")
    return exe


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    d = tmp_path_factory.mktemp("docs")
    server = Server(f"sqlite:///{d / 'docs.db'}", d / "server.log", WORKERS="1").start()
    yield server
    server.stop()


def _offline_chromium(exe: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            # No network but the service: every other host name fails to resolve, as on an air-gapped cluster.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--no-proxy-server",
            # Swagger UI renders after fetching openapi.json; virtual time lets the page finish before the dump.
            "--virtual-time-budget=15000",
            "--window-size=1280,1600",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_docs_assets_are_served_by_the_service(docs_server: Server) -> None:
    with httpx.Client(base_url=docs_server.url, timeout=10) as c:
        page = c.get("/docs")
        assert page.status_code == 200
        assert "cdn" not in page.text.lower() and "http://" not in page.text and "https://" not in page.text
        assert "/docs/assets/swagger-ui-bundle.js" in page.text and "/docs/assets/swagger-ui.css" in page.text
        js = c.get("/docs/assets/swagger-ui-bundle.js")
        assert js.status_code == 200 and len(js.content) > 500_000
        assert c.get("/docs/assets/swagger-ui.css").status_code == 200
        # No ReDoc page that would load its bundle from a CDN.
        assert c.get("/redoc").status_code == 404


def test_docs_render_offline_in_headless_chromium(docs_server: Server, chromium: str, tmp_path: Path) -> None:
    # One launch writes both the DOM and the screenshot (a second launch doubled this test's time under load).
    shot = tmp_path / "docs.png"
    r = _offline_chromium(
        chromium, tmp_path / "profile", "--dump-dom", f"--screenshot={shot}", docs_server.url + "/docs"
    )
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    html = r.stdout
    # Swagger UI drew the operations of the OpenAPI document: a block per operation, with its path.
    assert html.count('class="opblock ') >= 5, html[-3000:]
    for path in ("/v1/traces", "/v1/schedules", "/v1/compare"):
        assert f'data-path="{path}"' in html, path
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    colours = {tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::97].round(2).tolist()}
    # A blank page is one colour; Swagger UI's header, method badges and text are dozens.
    assert len(colours) > 20, f"the screenshot looks blank ({len(colours)} colours)"


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "ctrl-c"])
def test_stopping_memsched_serve_leaks_no_semaphores(tmp_path: Path, how: str) -> None:
    """`memsched serve`, after a solve and a plot (both worker pools running), stopped by SIGTERM (docker stop),
    SIGINT to the server alone, or Ctrl-C (SIGINT to the whole process group, the workers included)."""
    port = free_port()
    env = {
        **os.environ,
        "MEMSCHED_DATABASE_URL": f"sqlite:///{tmp_path / 's.db'}",
        "MEMSCHED_HOST": "127.0.0.1",
        "MEMSCHED_PORT": str(port),
        "MEMSCHED_WORKERS": "2",
    }
    exe = str(Path(sys.executable).with_name("memsched"))
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([exe, "serve"], env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=60) as c:
            tr = synthetic_trace(4)
            job = c.post(
                "/v1/schedules",
                params={"wait": 30},
                json={"trace": tr.model_dump(mode="json"), "budget": "60%", "solver": "heuristic"},
            ).json()
            assert job["status"] == "done", job
            assert c.get(f"/v1/schedules/{job['id']}/plot.png").status_code == 200
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(getattr(signal, how))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log_path.read_text(errors="replace")
    assert "leaked semaphore" not in text and "resource_tracker" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
