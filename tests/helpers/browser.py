"""Headless Chromium from the distribution's packages, driven by selenium through the distribution's
chromedriver, for the pages the service serves. Tests skip, saying why, where neither is installed nor can be."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from helpers.api import _run, installing


def find_chromium() -> tuple[str | None, str | None]:
    """(chromium, chromedriver) paths, each None when not installed."""
    exe = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
    return exe, shutil.which("chromedriver")


def try_install_chromium() -> str:
    """apt-get chromium and its driver when MEMSCHED_TEST_INSTALL_CHROMIUM=1 (CI sets it) and we are root;
    returns what was done, for the skip message."""
    if os.environ.get("MEMSCHED_TEST_INSTALL_CHROMIUM") != "1":
        return "chromium / chromedriver are not installed (set MEMSCHED_TEST_INSTALL_CHROMIUM=1 to let the tests apt-get them)"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "chromium / chromedriver are not installed and cannot be: installing needs root and apt-get"
    with installing():
        if all(find_chromium()):
            return "installed by another test process"
        return "; ".join(
            [
                _run(["apt-get", "update", "-q"]),
                _run(["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"], 900),
            ]
        )


def offline_driver(chromium: str, chromedriver: str, profile: Path) -> Any:
    """A headless Chrome session that can reach 127.0.0.1 and nothing else, as on an air-gapped cluster."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--no-proxy-server",
        "--window-size=1280,1500",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(executable_path=chromedriver))


def colours(png: bytes) -> int:
    """How many colours a sample of the screenshot's pixels holds (a blank page has one)."""
    import io

    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")
    return len({tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::97].round(2).tolist()})
