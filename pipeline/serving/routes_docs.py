"""``/docs`` (Swagger UI) and ``/redoc`` with every asset served by the service itself.

FastAPI's default pages load their scripts and styles from a public CDN, so on a payment network
with no internet they are blank. Here the pages are FastAPI's own (``get_swagger_ui_html``,
``get_redoc_html``, the way FastAPI documents self-hosting the docs assets) pointed at
:data:`ASSETS_URL`, where the files of the installed ``fastapi-offline`` package (Swagger UI 5,
ReDoc 2, a favicon) are mounted. The app must be created with ``docs_url=None, redoc_url=None``
so that FastAPI does not add its CDN pages too. The pages reference nothing outside the service
(``tests/serving/test_docs_offline.py`` renders them in a browser with every other host blocked).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
ASSETS_URL = "/docs-assets"
# The package's data folder: swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js, favicon.png.
ASSETS_DIR = Path(str(importlib.resources.files("fastapi_offline") / "static"))

# validatorUrl None: Swagger UI would otherwise show a badge fetched from validator.swagger.io,
# sending the spec's address off the network on every page view.
SWAGGER_UI_PARAMETERS = {"validatorUrl": None}
# ReDoc's script draws its "API docs by Redocly" logo from cdn.redoc.ly, with no option to turn it
# off: the browser is told not to fetch images from anywhere but here (the logo is then left out).
REDOC_IMAGES_FROM_HERE_ONLY = "img-src 'self' data:"


def install_docs(app: FastAPI) -> None:
    """Mount the assets and add the ``/docs``, its OAuth2 redirect and ``/redoc`` pages to ``app``
    (left out of the OpenAPI schema). Raises RuntimeError when ``app`` still has FastAPI's own pages."""
    if app.docs_url or app.redoc_url:
        raise RuntimeError("create the app with docs_url=None and redoc_url=None: install_docs serves both pages")
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    def assets(request: Request) -> str:
        return request.scope.get("root_path", "") + ASSETS_URL  # behind a proxy's prefix too

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=root + app.openapi_url, title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
            swagger_js_url=f"{assets(request)}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets(request)}/swagger-ui.css",
            swagger_favicon_url=f"{assets(request)}/favicon.png",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS)

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=request.scope.get("root_path", "") + app.openapi_url, title=f"{app.title} - ReDoc",
            redoc_js_url=f"{assets(request)}/redoc.standalone.js",
            redoc_favicon_url=f"{assets(request)}/favicon.png",
            with_google_fonts=False)  # fonts.googleapis.com is out of reach too
        page.headers["Content-Security-Policy"] = REDOC_IMAGES_FROM_HERE_ONLY
        return page
