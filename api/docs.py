"""The interactive API docs (/docs), served entirely by the service itself.

FastAPI's default /docs page loads Swagger UI's script and stylesheet from a public CDN: on an air-gapped
cluster, where many training machines live, that page stays blank. Here the same page loads them from the
`swagger-ui-bundle-v2` package (Swagger UI 5, Apache-2.0; 5.x is needed to render OpenAPI 3.1), mounted under
/docs/assets. ReDoc is not offered: no package ships its bundle, and one docs page is enough.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS_URL = "/docs"
ASSETS_URL = "/docs/assets"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"


def install_docs(app: FastAPI) -> None:
    """Add /docs (Swagger UI from the package's own files) to an app created with docs_url=None."""
    assert app.docs_url is None, "create the app with docs_url=None: install_docs serves /docs itself"
    assets = Path(str(swagger_ui_path))
    # check_dir: a broken install (assets missing) fails at start-up, not as a blank page later.
    app.mount(ASSETS_URL, StaticFiles(directory=assets, check_dir=True), name="docs-assets")

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        # root_path: behind a proxy that serves the service under a prefix, every URL keeps the prefix.
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + (app.openapi_url or "/openapi.json"),
            title=f"{app.title} — API docs",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon-32x32.png",
            oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
