"""The daemon's own routes: C{/}, C{/health}, C{/ready}, C{/version}, C{/metrics}; C{/models} mounted."""

from __future__ import annotations

from typing import Any

from klein import Klein
from prometheus_client import CollectorRegistry, generate_latest
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource

import mrunner
from mrunner.api.documented import Documented
from mrunner.api.door.callers import caller
from mrunner.api.door.declared import Route, Who
from mrunner.api.door.route_group import RouteGroup
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.manage.scheduler_json import failed_preloads, install_ready, preload_json
from mrunner.api.observe.page import wants_html
from mrunner.api.openapi import TEXT, Piece, answer, json_content, operation
from mrunner.daemon.router_signals import load_signals
from mrunner.interfaces import IScheduler
from mrunner.runners.metrics import RunnerScraper

READY = {
    "type": "object",
    "required": ["ready", "draining", "preloads", "failed"],
    "properties": {
        "ready": {"type": "boolean"},
        "draining": {"type": "boolean"},
        "preloads": {"type": "array", "items": {"type": "object"}},
        "failed": {"type": "array", "items": {"type": "string"}},
    },
}


VERSION = {
    "type": "object",
    "required": ["version", "docker_config"],
    "properties": {"version": {"type": "string"}, "docker_config": {"type": ["string", "null"]}},
}


def _one_answer(summary: str, content: dict[str, Any]) -> Piece:
    """A GET whose one answer is C{summary}."""
    return operation(summary, {"200": answer(summary, content)})


def _strings(*keys: str) -> dict[str, Any]:
    properties = {key: {"type": "string"} for key in keys}
    return json_content({"type": "object", "required": list(keys), "properties": properties})


class StatusAPI:
    """C{/}, C{/health}, C{/ready}, C{/version}, C{/metrics}, and the C{/models} routes.

    C{docker_config} is the Docker config file the daemon reads registry credentials from (None: only
    C{[registry.auth]}); C{/version} names it, since C{mrunner login} writes the config of whoever runs
    it, which is not the daemon's when it runs as another user, in a pod, or with another
    C{DOCKER_CONFIG}.
    """

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)

    def __init__(
        self,
        models: RouteGroup,
        metrics: CollectorRegistry,
        scheduler: IScheduler,
        scraper: RunnerScraper,
        docker_config: str | None = None,
    ):
        self._models = models
        self._metrics = metrics
        self._scheduler = scheduler
        self._scraper = scraper
        self._docker_config = docker_config
        self.mounts: dict[str, RouteGroup] = {"/models": models}

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route("/", "GET", _one_answer("mrunner is running", TEXT), door=Route(Who.OPEN))
    def root(self, request: IRequest) -> bytes:
        """API clients are told the daemon runs; a browser is sent to the page."""
        if wants_html(request):
            request.redirect(b"/ui")
            return b""
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return b"mrunner is running"

    @routes.route(
        "/health",
        "GET",
        _one_answer("The daemon answers", _strings("status")),
        door=Route(Who.OPEN, past_cap=True),
    )
    def health(self, request: IRequest) -> bytes:
        return json_body(request, {"status": "ok"})

    @routes.route(
        "/ready",
        "GET",
        operation(
            "Whether the default backend is installed, every preload has loaded or failed,"
            " and the node is not draining",
            {"200": answer("ready", json_content(READY)), "503": answer("not yet", json_content(READY))},
        ),
        door=Route(Who.OPEN),
    )
    def ready(self, request: IRequest) -> bytes:
        """200 once the default backend is installed and every preload has loaded or failed, until a
        drain; else 503.

        C{/health} answers 200 all along: the daemon is up. This is for
        orchestrators and routers that should send work only once the models are in,
        and no more once the node drains. A preload that failed does not hold the
        node back for ever, but C{failed} names it.
        """
        backend = self._scheduler.backend_statuses()[self._scheduler.backend_name(None)]
        preloads = self._scheduler.preloads()
        draining = self._scheduler.draining()
        ready = install_ready(backend) and all(preload.done for preload in preloads) and not draining
        body = {
            "ready": ready,
            "draining": draining,
            "preloads": [preload_json(preload) for preload in preloads],
            "failed": [preload.model for preload in failed_preloads(preloads)],
        }
        return json_body(request, body, 200 if ready else 503)

    @routes.route(
        "/version",
        "GET",
        _one_answer(
            "mrunner's version, and the Docker config it reads registry credentials from",
            json_content(VERSION),
        ),
    )
    def version(self, request: IRequest) -> bytes:
        return json_body(request, {"version": mrunner.__version__, "docker_config": self._docker_config})

    @routes.route("/metrics", "GET", _one_answer("Prometheus metrics", TEXT), door=Route(Who.SCRAPE))
    async def metrics(self, request: IRequest) -> bytes:
        """The daemon's metrics, then those of every ready runner that answers in time, for an admin.

        A normal key sees the load signals and its own per-key series, as C{/usage}
        shows it only its own; a scrape without a key that C{[cluster] open_metrics}
        let in, the load signals alone.
        """
        runners = await self._scraper.scrape(self._scheduler.snapshot())
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        who = caller(request)
        if who.load_signals_only:
            return generate_latest(load_signals(self._metrics, runners))
        if not who.admin:
            return generate_latest(load_signals(self._metrics, runners, key=who.name))
        return generate_latest(self._metrics) + generate_latest(runners)

    @app.route("/models", branch=True)  # a mount: the models' group has the routes, and declares them
    def models(self, request: IRequest) -> IResource:
        return self._models.app.resource()
