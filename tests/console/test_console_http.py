"""The console's files over HTTP: security headers, the redirect, no path escapes, packaging."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from flowyard.app import create_app
from flowyard.config import Settings
from flowyard.console.router import CSP, STATIC_DIR


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(data_dir=tmp_path), run_engine=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


def _assert_console_headers(r: httpx.Response) -> None:
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "set-cookie" not in r.headers


async def test_page_and_assets_carry_the_security_headers(http: httpx.AsyncClient) -> None:
    r = await http.get("/console/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    _assert_console_headers(r)
    assert r.headers["cache-control"] == "no-store"
    assert "<script>" not in r.text and "style=" not in r.text and "onclick" not in r.text.lower()
    for path in (
        "/console/static/app.js",
        "/console/static/console.css",
        "/console/static/favicon.svg",
        "/console/static/vendor/dagre-1.1.4/dagre.min.js",
        "/console/static/vendor/chartjs-4.4.7/chart.umd.js",
    ):
        r = await http.get(path)
        assert r.status_code == 200, path
        _assert_console_headers(r)


async def test_bare_console_redirects_to_the_page(http: httpx.AsyncClient) -> None:
    r = await http.get("/console")
    assert r.status_code == 308
    assert r.headers["location"] == "/console/"
    _assert_console_headers(r)


async def test_the_site_root_leads_to_the_console(http: httpx.AsyncClient) -> None:
    """A newcomer opening http://127.0.0.1:8000/ lands on the console, not on a JSON 404."""
    r = await http.get("/")
    assert r.status_code == 307
    assert r.headers["location"] == "/console/"
    page = await http.get("/", follow_redirects=True)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]


@pytest.mark.parametrize(
    "path",
    [
        "/console/static/../router.py",
        "/console/static/%2e%2e/router.py",
        "/console/static/..%2f..%2fconfig.py",
        "/console/static/nothing.js",
    ],
)
async def test_nothing_outside_the_static_folder_is_served(http: httpx.AsyncClient, path: str) -> None:
    r = await http.get(path)
    assert r.status_code == 404
    assert "Settings" not in r.text and "import" not in r.text


async def test_api_responses_are_unchanged(http: httpx.AsyncClient) -> None:
    """The console's headers are for its pages; the API keeps its own (no CSP added there)."""
    r = await http.get("/health")
    assert r.status_code == 200
    assert "content-security-policy" not in r.headers
    schema = (await http.get("/openapi.json")).json()
    assert not any(p.startswith("/console") for p in schema["paths"])


def test_the_static_files_ship_in_the_package() -> None:
    """pyproject's package-data globs cover every file under console/static."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["flowyard"]
    package_root = STATIC_DIR.parents[1]
    files = [p for p in STATIC_DIR.rglob("*") if p.is_file()]
    assert files
    for f in files:
        rel = f.relative_to(package_root)
        assert any(rel.match(g) for g in globs), f"{rel} is not in pyproject package-data"
    for vendor in (STATIC_DIR / "vendor").iterdir():
        if vendor.is_dir():
            assert any(p.name.startswith("LICENSE") for p in vendor.iterdir()), f"{vendor.name}: no LICENSE"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_api_reference_pages_load_nothing_from_another_origin(
    http: httpx.AsyncClient, page: str
) -> None:
    """/docs and /redoc work offline: every script, style and icon they name is served here."""
    r = await http.get(page)
    assert r.status_code == 200
    assert "http://" not in r.text and "https://" not in r.text
    assets = re.findall(r'(?:src|href)="(/[^"]+)"', r.text)
    assert any(a.endswith(".js") for a in assets), assets
    for asset in assets:
        got = await http.get(asset)
        assert got.status_code == 200, asset
        assert len(got.content) > 100, asset
