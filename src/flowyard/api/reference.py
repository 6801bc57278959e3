"""The API reference pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served from files
shipped with the console (``console/static/vendor``), so they work offline and load nothing from
a third-party origin (FastAPI's defaults load them from a CDN, and ReDoc's fonts from Google)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse

VENDOR = "/console/static/vendor"
SWAGGER_UI = f"{VENDOR}/swagger-ui-5.35.0"
REDOC = f"{VENDOR}/redoc-2.5.2"
FAVICON = "/console/static/favicon.svg"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="flowyard - API",
        swagger_js_url=f"{SWAGGER_UI}/swagger-ui-bundle.js",
        swagger_css_url=f"{SWAGGER_UI}/swagger-ui.css",
        swagger_favicon_url=FAVICON,
        oauth2_redirect_url=OAUTH2_REDIRECT,
    )


@router.get(OAUTH2_REDIRECT)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="flowyard - API",
        redoc_js_url=f"{REDOC}/redoc.standalone.js",
        redoc_favicon_url=FAVICON,
        with_google_fonts=False,
    )
