"""The sweep page in a real browser: headless Chromium (the distribution's, driven through its chromedriver)
that can reach 127.0.0.1 and nothing else loads /ui/traces/{id} from a real `python -m memsched.api`; the curve
and a timeline render (the DOM, and a screenshot that is not blank); a click on a point loads that point's
schedule; a what-if change re-solves through the API. `memsched sweep --html` renders the same way from a file."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.api import Server
from helpers.browser import colours, find_chromium, offline_driver, try_install_chromium
from memsched.api.examples import synthetic_trace
from memsched.io import save_model

pytestmark = pytest.mark.timeout(600)

TRACE = synthetic_trace(8, model="synthetic/page")


@pytest.fixture(scope="module")
def browser_bins() -> tuple[str, str]:
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[dev]')")
    exe, driver = find_chromium()
    if exe is None or driver is None:
        done = try_install_chromium()
        exe, driver = find_chromium()
        if exe is None or driver is None:
            pytest.skip(f"no headless Chromium and chromedriver to load the page with: {done}")
    return exe, driver


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("page")
    server = Server(f"sqlite:///{d / 'page.db'}", d / "server.log", WORKERS="2").start()
    yield server
    server.stop()


@pytest.fixture
def driver(browser_bins: tuple[str, str], tmp_path: Path) -> Iterator[Any]:
    drv = offline_driver(*browser_bins, tmp_path / "profile")
    try:
        yield drv
    finally:
        drv.quit()


def wait_for(drv: Any, what: Callable[[], bool], why: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        status = drv.execute_script("return document.getElementById('status').textContent")
        assert time.monotonic() < deadline, f"timed out waiting for {why}; the page says: {status!r}"
        time.sleep(0.2)


def body(drv: Any, key: str) -> str:
    return str(drv.execute_script(f"return document.body.dataset.{key}"))


def count(drv: Any, css: str) -> int:
    return int(drv.execute_script(f"return document.querySelectorAll({css!r}).length"))


def test_page_renders_clicks_and_resolves(page_server: Server, driver: Any) -> None:
    with page_server.client(key=None) as c:
        tid = c.post("/v1/traces", json=TRACE.model_dump(mode="json")).json()["id"]
    driver.get(f"{page_server.url}/ui/traces/{tid}")
    wait_for(driver, lambda: body(driver, "curve") == "ready" and body(driver, "point") != "none", "the curve")
    # The curve: the bound, the best schedules (one marker per point) and the knees, drawn as SVG by Plotly.
    n_points = int(driver.execute_script("return Number(document.getElementById('points').value)"))
    assert count(driver, "#curve .scatterlayer .trace") == 3
    assert count(driver, "#curve .scatterlayer .trace:nth-child(2) .points path") == n_points
    # The timeline of the point selected on load: the memory line and bars on the three streams.
    assert count(driver, "#memory .scatterlayer .trace") >= 1
    assert count(driver, "#streams .barlayer .point") > 2 * TRACE.n
    assert "budget" in driver.find_element("id", "point-info").text
    assert colours(driver.get_screenshot_as_png()) > 20, "the screenshot looks blank"

    # A click on the first point loads its schedule (through POST /v1/sweeps/timeline).
    from selenium.webdriver.common.action_chains import ActionChains

    first = driver.find_elements("css selector", "#curve .scatterlayer .trace:nth-child(2) .points path")[0]
    ActionChains(driver).move_to_element(first).pause(0.3).click().perform()
    wait_for(driver, lambda: body(driver, "point") == "0", "the clicked point's schedule")
    lo = driver.execute_script("return sweep.points[0]")
    info = driver.find_element("id", "point-info").text
    counts = lo["actions"]
    assert f"keep {counts['keep']}, offload {counts['offload']}, recompute {counts['recompute']}" in info, info
    assert f"{lo['budget_bytes'] / 2**20:.1f} MiB" in info or f"{lo['budget_bytes'] / 2**30:.2f} GiB" in info

    # A what-if change re-solves through the API: 4 GPUs sharing a PCIe 3 link.
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", "link")).select_by_value("pcie3")
    ranks = driver.find_element("id", "ranks")
    ranks.clear()
    ranks.send_keys("4")
    driver.find_element("id", "resolve").click()
    wait_for(driver, lambda: body(driver, "resolves") == "2", "the re-solve")
    assert "link pcie3, 4 ranks per link" in driver.find_element("id", "summary").text
    planned = driver.execute_script("return sweep.points.map((p) => p.schedule.planned_for)")
    assert all(p["link"] == "pcie3" and p["ranks_per_link"] == 4 for p in planned)
    wait_for(driver, lambda: "link pcie3" in driver.find_element("id", "point-info").text, "the new timeline")

    # A host budget of 0 re-solves with no offload: every point's host peak is 0, and the page says so.
    driver.find_element("id", "host").send_keys("0")
    driver.find_element("id", "resolve").click()
    wait_for(driver, lambda: body(driver, "resolves") == "3", "the host-budget re-solve")
    assert "host budget 0.0 MiB" in driver.find_element("id", "summary").text
    hosts = driver.execute_script("return sweep.points.map((p) => p.schedule.prediction.host_peak_bytes)")
    assert hosts and all(h == 0 for h in hosts)
    wait_for(driver, lambda: "(host budget 0.0 MiB)" in driver.find_element("id", "point-info").text, "its timeline")
    driver.find_element("id", "host").clear()

    # A bad what-if is said on the page, from the API's 422, and the curve stays.
    Select(driver.find_element("id", "link")).select_by_value("custom")
    driver.find_element("id", "rate").send_keys("0")
    driver.find_element("id", "resolve").click()
    wait_for(driver, lambda: "> 0 bytes/s" in driver.find_element("id", "status").text, "the error")
    assert body(driver, "resolves") == "3" and body(driver, "curve") == "ready"


def test_standalone_file_renders_offline(driver: Any, tmp_path: Path) -> None:
    from memsched.cli import main

    trace, page = tmp_path / "t.json", tmp_path / "sweep.html"
    save_model(TRACE, trace)
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(trace), "-n", "5", "--time-limit", "1", "--workers", "1", "--html", str(page)])
    assert e.value.code == 0
    html = page.read_text()
    assert "https://" not in html.split("<script>", 2)[-1][-60_000:]  # the page's own part names no host
    driver.get(page.as_uri())
    wait_for(driver, lambda: body(driver, "curve") == "ready" and body(driver, "point") != "none", "the file's curve")
    assert count(driver, "#curve .scatterlayer .trace:nth-child(2) .points path") == 5
    assert count(driver, "#streams .barlayer .point") > 2 * TRACE.n
    assert driver.find_element("id", "resolve").get_attribute("disabled") is not None
    assert colours(driver.get_screenshot_as_png()) > 20
