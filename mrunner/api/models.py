"""The ``/models`` routes: list, inspect, import, pull, tag, push, verify and delete models.

Shapes follow Docker Model Runner's, so ``docker model`` style clients work.
Pull and push stream NDJSON progress; an error that happens before the first
line is an ordinary JSON error response with its status, one after it is a
final ``{"type": "error"}`` line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.requests import flag, json_object, query, read_body
from mrunner.errors import BadRequest, MrunnerError
from mrunner.interfaces import IScheduler
from mrunner.store.model import Model
from mrunner.store.names import parse
from mrunner.store.package import TAR
from mrunner.store.progress import Progress
from mrunner.store.pull import Puller
from mrunner.store.push import Pusher
from mrunner.store.store import ModelStore

MAX_CREATE_BODY = 64 * 1024


def model_json(model: Model) -> dict[str, Any]:
    """Docker Model Runner's model object; C{"corrupt"} says why a broken model cannot be loaded."""
    value = {
        "id": model.id,
        "tags": list(model.tags),
        "created": model.created,
        "config": model.config,
    }
    if model.problem:
        value["corrupt"] = model.problem
    return value


class NDJSONStream:
    """Writes one JSON object per line; headers go out with the first line."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self.started = False
        self._gone = False
        request.notifyFinish().addBoth(self._finished)

    def _finished(self, _: object) -> None:
        self._gone = True

    def emit(self, message: dict[str, Any]) -> None:
        if self._gone:
            return
        if not self.started:
            self.started = True
            self._request.setHeader(b"content-type", b"application/x-ndjson")
        self._request.write(json.dumps(message).encode() + b"\n")


class ModelsAPI:
    """Routes relative to ``/models``; mount C{app.resource()} there."""

    app = Klein()
    handle_json_errors(app)
    log = Logger()

    def __init__(
        self,
        store: ModelStore,
        scheduler: IScheduler,
        puller: Puller,
        pusher: Pusher,
        clock: IReactorTime,
    ) -> None:
        self._store = store
        self._scheduler = scheduler
        self._puller = puller
        self._pusher = pusher
        self._clock = clock

    # Mounted at /models, this route sees an empty path; without strict slashes it matches.
    @app.route("/", methods=["GET"], strict_slashes=False)
    def list_models(self, request: IRequest) -> bytes:
        return json_body(request, [model_json(model) for model in self._store.list()])

    @app.route("/create", methods=["POST"])
    async def create(self, request: Request) -> bytes:
        """Pull ``{"from": ref}`` from its registry (Hugging Face for ``hf.co/...``), streaming progress."""
        ref = parse(json_object(read_body(request, MAX_CREATE_BODY)).get("from"), "'from'")
        return await self._stream(
            request, "pull", f"Model pulled successfully: {ref}", partial(self._puller.pull, ref)
        )

    @app.route("/load", methods=["POST"])
    async def load(self, request: IRequest) -> bytes:
        """Import the request body as ``?name=`` (``&context_size=N`` sets its default context).

        The body is a GGUF file, or (``Content-Type: application/x-tar``) a package
        as ``mrunner package`` sends it: the weights (one ``*.gguf`` or its shards),
        ``licenses/``, ``mmproj/`` and ``chat-template/`` (see L{mrunner.store.package}).
        """
        name = query(request, "name")
        if name is None:
            raise BadRequest("give the model a name: POST /models/load?name=NAME")
        context_size = _positive(query(request, "context_size"), "context_size")
        request.content.seek(0)
        if (request.getHeader(b"content-type") or b"").split(b";")[0].strip() == TAR:
            model = await self._store.import_package(name, request.content, context_size)
        else:
            model = await self._store.import_gguf(name, request.content, (), context_size)
        return json_body(request, model_json(model), 201)

    @app.route("/verify", methods=["POST"])
    async def verify_all(self, request: IRequest) -> bytes:
        """Re-hash every model's blobs; corrupt ones are quarantined. 200 with a report per model."""
        return json_body(request, await self._store.verify())

    @app.route("/<path:name>/verify", methods=["POST"])
    async def verify(self, request: IRequest, name: str) -> bytes:
        """Re-hash the blobs of the model C{name}: a one-element list of L{verify_all}'s reports."""
        return json_body(request, await self._store.verify(name))

    @app.route("/<path:name>", methods=["GET"])
    def inspect(self, request: IRequest, name: str) -> bytes:
        return json_body(request, model_json(self._store.resolve(name)))

    @app.route("/<path:name>", methods=["DELETE"])
    async def delete(self, request: IRequest, name: str) -> bytes:
        """Stop the model's runners, then remove it; 409 for several tags without force."""
        force = flag(request, "force")
        digest = self._store.deletable(name, force)
        await self._scheduler.unload(backend=None, models=[digest], all=False)
        return json_body(request, self._store.delete(name, force))

    @app.route("/<path:name>/tag", methods=["POST"])
    def tag(self, request: IRequest, name: str) -> bytes:
        repo, tag = query(request, "repo"), query(request, "tag")
        if not repo or not tag:
            raise BadRequest("give the new name as ?repo=REPOSITORY&tag=TAG")
        target = f"{repo}:{tag}"
        model = self._store.tag(name, target)
        message = f"Model tagged successfully with {target!r}"
        return json_body(request, {"message": message, "target": target, "id": model.id}, 201)

    @app.route("/<path:name>/push", methods=["POST"])
    async def push(self, request: Request, name: str) -> bytes:
        """Push the model C{name} to the registry its name points at, streaming progress."""
        ref = parse(name)
        self._store.resolve(name)
        return await self._stream(
            request, "push", f"Model pushed successfully: {ref}", partial(self._pusher.push, ref)
        )

    async def _stream(
        self,
        request: Request,
        mode: str,
        done: str,
        work: Callable[[Progress], Deferred[Any]],
    ) -> bytes:
        stream = NDJSONStream(request)
        progress = Progress(stream.emit, self._clock, mode)
        try:
            await work(progress)
        except MrunnerError as e:
            if not stream.started:
                raise
            self.log.warn("{mode} failed: {message}", mode=mode, message=e.message)
            progress.error(e.message)
        else:
            progress.success(done)
        return b""


def _positive(value: str | None, key: str) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or int(value) == 0:
        raise BadRequest(f"?{key}= must be a positive integer, not {value!r}")
    return int(value)
