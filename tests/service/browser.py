"""Headless Chromium for the dashboard's browser tests: Debian's ``chromium`` and
``chromium-driver`` (``scripts/test.sh`` installs them as root); without them a test skips,
except under ``CI=true``, where it fails."""

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def browser_or_skip() -> None:
    if CHROMIUM and DRIVER:
        return
    message = "Debian's chromium and chromium-driver are not installed"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI=true: the dashboard must be tested in a browser)")
    pytest.skip(message)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by selenium (skips without one, see the module)."""
    browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(DRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
