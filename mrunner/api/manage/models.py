"""The ``/models`` routes: list, inspect, import, pull, tag, push, verify and delete models.

Shapes follow Docker Model Runner's, so ``docker model`` style clients work.
Pull and push stream NDJSON progress; an error that happens before the first
line is an ordinary JSON error response with its status, one after it is a
final ``{"type": "error"}`` line.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from klein import Klein
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.server import Request

from mrunner.api.documented import Documented, parameter
from mrunner.api.door.callers import caller
from mrunner.api.door.declared import MAX_CREATE_BODY, Reach, Route, Who
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.manage.model_operations import ModelOperations
from mrunner.api.openapi import NAME, Piece, answer, errors, json_content, operation
from mrunner.api.reading.bodies import MAX_CONTEXT_SIZE, flag, json_object, query, read_body, whole
from mrunner.errors import BadRequest, Forbidden, MrunnerError, NotFound
from mrunner.interfaces import IModelStoreAdmin, IProgress, IUpload
from mrunner.names import parse
from mrunner.store.sources.catalog import Sources
from mrunner.teams.access import check_usable, visible
from mrunner.values.model import TAR, Model

MODEL = {
    "type": "object",
    "required": ["id", "tags", "created", "config"],
    "properties": {
        "id": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "created": {"type": "integer"},
        "config": {"type": "object"},
        "corrupt": {"type": "string"},
    },
}
VERIFIED = {
    "type": "object",
    "required": ["id", "status"],
    "properties": {
        "id": {"type": "string"},
        "status": {"enum": ["ok", "corrupt"]},
        "blobs": {"type": "array"},
    },
}
# Docker's answer to a delete: [{"Untagged": name}, ..., {"Deleted": digest}]
REMOVED = {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "string"}}}
PROGRESS = {"application/x-ndjson": {"schema": {"type": "string"}}}
REGISTRY_ERRORS = errors(**{"502": "the registry is unreachable or answered with an error"})
CREATE = {"type": "object", "required": ["from"], "properties": {"from": {"type": "string"}}}
BINARY = {"schema": {"type": "string", "format": "binary"}}
VERIFIED_ALL = {"200": answer("a report per model", json_content({"type": "array", "items": VERIFIED}))}
FOUND = {
    "type": "object",
    "required": ["source", "ref", "name", "path", "size", "in_store"],
    "properties": {
        **{key: {"type": "string"} for key in ("source", "ref", "name", "path", "quantization", "problem")},
        "size": {"type": "integer"},
        "in_store": {"type": "array", "items": {"type": "string"}},
    },
}
IMPORT = {
    "type": "object",
    "required": ["from"],
    "properties": {"from": {"type": "string"}, "name": {"type": "string"}},
}
TAGGED = {"type": "object", "properties": {key: {"type": "string"} for key in ("message", "target", "id")}}


def _query(name: str, schema: dict[str, Any], description: str, required: bool = False) -> Piece:
    return parameter(name, "query", schema, description, required)


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
    routes = Documented(app)
    log = Logger()

    def __init__(
        self, store: IModelStoreAdmin, operations: ModelOperations, sources: Sources | None = None
    ) -> None:
        self._store = store
        self._operations = operations
        self._sources = sources

    def openapi(self) -> Piece:
        """The routes' piece, its paths relative to C{/models}, where they are mounted."""
        return self.routes.openapi()

    # Mounted at /models, this route sees an empty path; without strict slashes it matches.
    @routes.route(
        "/",
        "GET",
        operation(
            "Local models; with ?found=1, the models other tools keep on this machine",
            {"200": answer("models", json_content({"type": "array", "items": {"anyOf": [MODEL, FOUND]}}))},
            parameters=[_query("found", {"type": "boolean"}, "list other tools' models instead")],
        ),
        strict_slashes=False,
        door=Route(Who.MANAGE, Reach.UNDER),
    )
    async def list_models(self, request: IRequest) -> bytes:
        """The models the key may use: any key may read them (L{visible}), an admin's manages them.

        C{?found=1}: instead, the models other tools keep on this machine (an admin's view: it shows
        their folders), each with the names the store has it by.
        """
        if flag(request, "found"):
            return json_body(request, await self._sources_for(request).listing())
        models = visible(caller(request).member, self._store.list())
        return json_body(request, [model_json(model) for model in models])

    @routes.route(
        "/import",
        "POST",
        operation(
            "Bring a model another tool keeps (Ollama, the Hugging Face cache, LM Studio, llama.cpp, a"
            " .gguf path) into the store as hard links: no second copy",
            {
                "201": answer("the imported model, and how", json_content(MODEL)),
                **errors(
                    **{
                        "422": "the source's layout was refused: a file outside its folder, a digest that"
                        " does not match, a file that cannot be read",
                        "507": "the store's disk is full (a copy, where no link could be made)",
                    }
                ),
            },
            body=json_content(IMPORT),
        ),
    )
    async def import_found(self, request: IRequest) -> bytes:
        """Import ``{"from": "ollama:llama3.2:1b", "name"?: ...}``; the answer says linked or copied."""
        body = json_object(read_body(request, MAX_CREATE_BODY))
        source, name = body.get("from"), body.get("name")
        if not isinstance(source, str) or not source or not isinstance(name, str | None):
            raise BadRequest('give {"from": SOURCE} and optionally a "name": strings', param="from")
        model, report = await self._sources_for(request).import_(source, name)
        return json_body(request, {**model_json(model), "import": report}, 201)

    def _sources_for(self, request: IRequest) -> Sources:
        if not caller(request).admin:
            raise Forbidden("only an admin key sees and imports other tools' models", code="admin_only")
        if self._sources is None:
            raise NotFound("this daemon looks in no other tool's folders")
        return self._sources

    @routes.route(
        "/create",
        "POST",
        operation(
            "Pull a model from its registry, with NDJSON progress",
            {"200": answer("progress lines, then success or error", PROGRESS), **REGISTRY_ERRORS},
            body=json_content(CREATE),
        ),
        door=Route(Who.MANAGE, limit=lambda http: MAX_CREATE_BODY),
    )
    async def create(self, request: Request) -> bytes:
        """Pull ``{"from": ref}`` from its registry (Hugging Face for ``hf.co/...``), streaming progress."""
        ref = parse(json_object(read_body(request, MAX_CREATE_BODY)).get("from"), "'from'")
        return await self._stream(
            request, "pull", f"Model pulled successfully: {ref}", partial(self._operations.pull, ref)
        )

    @routes.route(
        "/load",
        "POST",
        operation(
            "Import a GGUF file, or a package as mrunner package sends it (application/x-tar)",
            {"201": answer("the imported model", json_content(MODEL))},
            body={"application/octet-stream": BINARY, "application/x-tar": BINARY},
            parameters=[
                _query("name", {"type": "string"}, "the new model's name", required=True),
                _query(
                    "context_size",
                    {"type": "integer", "minimum": 1, "maximum": MAX_CONTEXT_SIZE},
                    "its default context size",
                ),
            ],
        ),
        door=Route(Who.MANAGE, limit=lambda http: http.max_load_bytes, sink="upload"),
    )
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
        body = request.content
        if IUpload.providedBy(body):  # came through the front door: staged as it arrived
            model = await self._store.import_upload(name, body, context_size)
        elif _packaged(request):  # a request that did not (a test's): staged from its file
            body.seek(0)
            model = await self._store.import_package(name, body, context_size)
        else:
            body.seek(0)
            model = await self._store.import_gguf(name, body, (), context_size)
        return json_body(request, model_json(model), 201)

    def upload(self, request: IRequest) -> IUpload:
        """Where the front door writes the body of ``POST /models/load`` as it arrives: its sink."""
        return self._store.upload(_packaged(request))

    @routes.route(
        "/verify",
        "POST",
        operation("Re-hash every model's blobs; corrupt ones are quarantined", VERIFIED_ALL),
    )
    async def verify_all(self, request: IRequest) -> bytes:
        """Re-hash every model's blobs; corrupt ones are quarantined. 200 with a report per model."""
        return json_body(request, await self._store.verify())

    @routes.route(
        "/<path:name>/verify", "POST", operation("Re-hash one model's blobs", VERIFIED_ALL, parameters=[NAME])
    )
    async def verify(self, request: IRequest, name: str) -> bytes:
        """Re-hash the blobs of the model C{name}: a one-element list of L{verify_all}'s reports."""
        return json_body(request, await self._store.verify(name))

    @routes.route(
        "/<path:name>",
        "GET",
        operation("One local model", {"200": answer("the model", json_content(MODEL))}, parameters=[NAME]),
    )
    def inspect(self, request: IRequest, name: str) -> bytes:
        check_usable(caller(request).member, self._store, name)
        return json_body(request, model_json(self._store.resolve(name)))

    @routes.route(
        "/<path:name>",
        "DELETE",
        operation(
            "Remove a name: only that tag while another names the model, else the model,"
            " stopping its runners",
            {
                "200": answer("what was removed", json_content(REMOVED)),
                **errors(
                    **{
                        "409": "an id of a model with several tags, or a model a runner is serving:"
                        " give force=true"
                    }
                ),
            },
            parameters=[
                NAME,
                _query(
                    "force",
                    {"type": "boolean"},
                    "remove it while a runner serves it (once its answers end), or by id under every tag",
                ),
            ],
        ),
    )
    async def delete(self, request: IRequest, name: str) -> bytes:
        return json_body(request, await self._operations.delete(name, flag(request, "force")))

    @routes.route(
        "/<path:name>/tag",
        "POST",
        operation(
            "Give a model another name",
            {"201": answer("the new name", json_content(TAGGED))},
            parameters=[
                NAME,
                _query("repo", {"type": "string"}, "the new repository", required=True),
                _query("tag", {"type": "string"}, "the new tag", required=True),
            ],
        ),
    )
    def tag(self, request: IRequest, name: str) -> bytes:
        repo, tag = query(request, "repo"), query(request, "tag")
        if not repo or not tag:
            raise BadRequest("give the new name as ?repo=REPOSITORY&tag=TAG")
        target = f"{repo}:{tag}"
        model = self._store.tag(name, target)
        message = f"Model tagged successfully with {target!r}"
        return json_body(request, {"message": message, "target": target, "id": model.id}, 201)

    @routes.route(
        "/<path:name>/push",
        "POST",
        operation(
            "Push a model to the registry its name points at, with NDJSON progress",
            {"200": answer("progress lines, then success or error", PROGRESS), **REGISTRY_ERRORS},
            parameters=[NAME],
        ),
    )
    async def push(self, request: Request, name: str) -> bytes:
        """Push the model C{name} to the registry its name points at, streaming progress."""
        ref = self._operations.pushable(name)
        return await self._stream(
            request, "push", f"Model pushed successfully: {ref}", partial(self._operations.push, ref)
        )

    async def _stream(
        self,
        request: Request,
        mode: str,
        done: str,
        work: Callable[[IProgress], Awaitable[None]],
    ) -> bytes:
        stream = NDJSONStream(request)
        progress = self._operations.progress(stream.emit, mode)
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


def _packaged(request: IRequest) -> bool:
    """Whether the body is a package tar as ``mrunner package`` sends it, rather than a GGUF file."""
    return (request.getHeader(b"content-type") or b"").split(b";")[0].strip() == TAR


def _positive(value: str | None, key: str) -> int | None:
    """A positive C{int} a runner's flag can hold."""
    if value is None:
        return None
    number = whole(value, MAX_CONTEXT_SIZE)
    if number is None:
        raise BadRequest(
            f"?{key}= must be an integer from 1 to {MAX_CONTEXT_SIZE}, not {value!r:.40}", param=key
        )
    return number
