"""The operator's routes: status (``/health``, ``/ready``, ``/metrics``, open to anyone who reaches
the port) and the admin actions (``/admin/reload``, ``/admin/pin``, ``/admin/rules/refresh``), which
need ``Authorization: Bearer <token>`` and are off (403) while no token is configured.

The admin actions are plain ``def`` routes: FastAPI runs them in its thread pool, so a model load
or a rules read never blocks the event loop.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable

from fastapi import APIRouter, Request, Response
from prometheus_client.metrics_core import Metric

from pipeline.serving.config import AdminConfig
from pipeline.serving.errors import ServingError
from pipeline.serving.http_bodies import RequestRefused, json_response
from pipeline.serving.prometheus import CONTENT_TYPE, render, service_registry
from pipeline.serving.service import ScoringService

TOKEN_REFUSALS = {401: {}, 403: {}}


def require_admin(request: Request, admin: AdminConfig) -> None:
    """Raise RequestRefused (403 with no token configured, 401 for a wrong or missing one) unless
    ``request`` carries the admin token; compared in constant time."""
    if not admin.token:
        raise RequestRefused(403, "admin_disabled", "admin endpoints are off: set $FRAUD_SERVING_ADMIN_TOKEN")
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {admin.token}".encode()):
        raise RequestRefused(401, "unauthorized", "admin endpoints need 'Authorization: Bearer <token>'")


def admin_router(service: ScoringService, admin: AdminConfig, families: Callable[[], Iterable[Metric]]) -> APIRouter:
    """Status and admin routes for ``service``; ``families`` gives /metrics its metric families at scrape time."""
    router = APIRouter()
    add_status_routes(router, service, families)
    add_admin_routes(router, service, admin)
    return router


def add_status_routes(router: APIRouter, service: ScoringService, families: Callable[[], Iterable[Metric]]) -> None:
    @router.get("/health")
    async def health() -> Response:
        """Status (ok; degraded: the review rate left its band or the event feed is stuck or out of its
        topic's range; not_ready) and why; model version, thresholds, last reload error; realised rates,
        rules, features, stream and publisher state."""
        return json_response(service.health())

    @router.get("/ready", responses={503: {"description": "not ready, with the reasons"}})
    async def ready() -> Response:
        problems = service.readiness()
        return json_response({"ready": not problems, "not_ready": problems}, 503 if problems else 200)

    registry = service_registry(families)  # this service's own, never the process-global one

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE)


def add_admin_routes(router: APIRouter, service: ScoringService, admin: AdminConfig) -> None:
    @router.post("/admin/reload", responses=TOKEN_REFUSALS)
    def admin_reload(request: Request) -> Response:
        """Re-read the alias (or pin) and reload, even the version already live."""
        require_admin(request, admin)
        swapped = service.parts.champion.sync(force=True)
        status = service.parts.champion.status()
        return json_response({"reloaded": swapped, "model": status}, 200 if swapped else 409)

    @router.post("/admin/pin", responses={**TOKEN_REFUSALS, 409: {"description": "the version cannot serve"}})
    def admin_pin(request: Request, version: int | None = None) -> Response:
        """Serve ``version`` whatever the alias says; without ``version``, follow the alias again."""
        require_admin(request, admin)
        try:
            service.parts.champion.pin(version)
        except ServingError as exc:
            return json_response({"error": "pin_failed", "field": "version", "detail": str(exc)}, 409)
        return json_response({"model": service.parts.champion.status()})

    @router.post("/admin/rules/refresh", responses={**TOKEN_REFUSALS, 409: {"description": "rules file refused"}})
    def admin_rules_refresh(request: Request) -> Response:
        """Re-read the rules file now (it is also re-read every rules.refresh_interval_s)."""
        require_admin(request, admin)
        ok = service.parts.rules.refresh()
        return json_response({"refreshed": ok, "rules": vars(service.parts.rules.status())}, 200 if ok else 409)
