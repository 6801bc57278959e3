"""Serves the console: ``/console/`` (the single page) and ``/console/static/...`` (its files).

HTTP only; the pages are static and call the public API with a bearer token kept in
``sessionStorage``. Every console response carries a strict Content-Security-Policy and the
framing/sniffing/referrer headers (``CONSOLE_HEADERS``), decided here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).with_name("static")

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
CONSOLE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}

router = APIRouter(include_in_schema=False)


class _ConsoleFiles(StaticFiles):
    """Static files with the console's security headers; revalidated on every load."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(CONSOLE_HEADERS)
        response.headers["Cache-Control"] = "no-cache"
        return response


@router.get("/")
async def site_root() -> RedirectResponse:
    """A browser opening the service's address lands on the console (not a JSON 404)."""
    return RedirectResponse("/console/", status_code=307)


@router.get("/console")
async def console_root() -> RedirectResponse:
    return RedirectResponse("/console/", status_code=308, headers=CONSOLE_HEADERS)


@router.get("/console/")
async def console_page() -> FileResponse:
    return FileResponse(
        STATIC_DIR / "index.html",
        media_type="text/html; charset=utf-8",
        headers={**CONSOLE_HEADERS, "Cache-Control": "no-store"},
    )


static_files = _ConsoleFiles(directory=STATIC_DIR)
