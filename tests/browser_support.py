"""Headless Chromium (Debian's chromium + chromium-driver, installed by scripts/setup.sh)
driven by Selenium, for the live page's tests and screenshots."""
from __future__ import annotations

import shutil
from contextlib import contextmanager

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)


def _which(names) -> str:
    for name in names:
        path = shutil.which(name) or (shutil.which(name, path="/usr/lib/chromium") if
                                      name == "chromedriver" else None)
        if path:
            return path
    raise RuntimeError(f"none of {names} found: run scripts/setup.sh (it installs Debian's "
                       "chromium and chromium-driver)")


@contextmanager
def chromium(width: int = 1400, height: int = 1000):
    """A headless Chromium session; its console messages are kept (get_log('browser'))."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = _which(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=_which(DRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver) -> list[str]:
    """Console errors and uncaught exceptions since the last call (SEVERE entries)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
