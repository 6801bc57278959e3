"""Finding the browser for the console's end-to-end test: Debian's chromium + chromium-driver.

Without them the browser test is skipped with the reason, except in CI (``CI=true``), where a
missing browser fails the run. ``pytest`` says in its header which case applies.
"""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import IN_CI

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def browser_missing() -> str | None:
    if CHROMIUM is None:
        return "no chromium on PATH (apt-get install chromium chromium-driver)"
    if CHROMEDRIVER is None:
        return "no chromedriver on PATH (apt-get install chromium-driver)"
    return None


def report_header() -> str:
    """One line for pytest's header (hooked in tests/conftest.py: header hooks must live there)."""
    missing = browser_missing()
    if missing is None:
        return f"console: Chromium found ({CHROMIUM}, {CHROMEDRIVER}); the browser tests run"
    return f"console: browser tests {'FAIL (CI=true)' if IN_CI else 'skipped'}: {missing}"


@pytest.fixture
def chromium_paths() -> tuple[str, str]:
    missing = browser_missing()
    if missing is not None:
        if IN_CI:
            pytest.fail(f"CI=true and the console's browser test cannot run: {missing}")
        pytest.skip(missing)
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    return CHROMIUM, CHROMEDRIVER
