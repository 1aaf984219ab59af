"""Anthropic's Messages API, served by llama-server's own C{/v1/messages} and C{count_tokens}.

Requests are checked (the fields llama-server answers a 500 for) and forwarded
as they came, and a successful answer (JSON or events) is relayed byte for
byte; what mrunner changes is the errors: its own and the
runner's (which llama-server writes in OpenAI's shape) reach the client in
Anthropic's, with Anthropic's status codes, before or during a stream.
C{x-api-key} and C{anthropic-version} are accepted and not needed.
"""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.web.server import Request

from mrunner.api.compat.openapi import ANTHROPIC_ERROR, ANY_METHOD, compat_operation
from mrunner.api.documented import Documented
from mrunner.api.door.declared import Reach, Route
from mrunner.api.errors import MethodNotAllowed, anthropic_shape, anthropic_stream_error, handle_json_errors
from mrunner.api.openai.gateway import Gateway
from mrunner.api.openapi import Piece
from mrunner.api.reading import validate
from mrunner.errors import NotFound
from mrunner.proxy.forwarder import Forwarder, relayed
from mrunner.teams.lengths import ANTHROPIC, NONE, Length
from mrunner.values.backend import COMPLETION

# Docker Model Runner's base URL (.../anthropic), and the daemon's own as Claude Code may be given it.
SERVED = ("/v1/messages", "/v1/messages/count_tokens")
PREFIXES = ("/anthropic", "", "/engines", "/engines/<backend>")


# What llama-server reads of a request and answers a 500 for when it is of another type
# (a text block's text a number, say); it checks the rest.
_BLOCK = validate.obj({"type": validate.text, "text": validate.string}, required=("type",), nulls=False)
_CONTENT = validate.by_type(
    "a string or an array of content blocks", {str: None, list: validate.array(_BLOCK)}
)
MESSAGES = validate.Shape(
    {
        **validate.COMMON,
        "messages": validate.array(
            validate.obj(
                {"role": validate.enum("user", "assistant"), "content": _CONTENT},
                required=("role", "content"),
                nulls=False,
            )
        ),
        "system": _CONTENT,
        "max_tokens": validate.TOKENS,
        "temperature": validate.SAMPLING["temperature"],
        "top_p": validate.SAMPLING["top_p"],
        "top_k": validate.integer(0, 2**31 - 1),
        "stream": validate.boolean,
        "stop_sequences": validate.array(validate.string),
    },
    required=("model",),
)


def _paths(path: str) -> list[str]:
    return [prefix + path for prefix in PREFIXES]


class AnthropicAPI:
    """C{/v1/messages} and C{/v1/messages/count_tokens}, under C{/anthropic} and C{/engines[/{backend}]}."""

    app = Klein()
    handle_json_errors(app, anthropic_shape)
    routes = Documented(app)
    #: Anthropic's Messages, under /anthropic and wherever its two routes are served.
    door = (
        Route(reach=Reach.BELOW, shape="anthropic", path="/anthropic"),
        *(Route(reach=Reach.ENDING, shape="anthropic", path=path) for path in SERVED),
    )

    def __init__(self, gateway: Gateway, forwarder: Forwarder):
        self._gateway = gateway
        self._forwarder = forwarder

    async def _forward(self, request: Request, backend: str | None, path: bytes, length: Length) -> bytes:
        asked = self._gateway.begin(request, COMPLETION, backend, MESSAGES, length=length, events=True)
        body = asked.forwarded()
        async with self._gateway.lease(request, asked) as lease:
            relay = relayed(request, anthropic_stream_error, asked.renaming(lease))
            talk = asked.resolved.conversation
            await self._forwarder.forward(
                request, lease.socket, path, body, asked.meter, transform=relay, conversation=talk
            )
        return b""

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/anthropic/<path:rest>",
        ANY_METHOD,
        compat_operation("Other Anthropic routes: a 404 naming them", ANTHROPIC_ERROR),
    )
    def unserved(self, request: Request, rest: str) -> bytes:
        if f"/{rest}" in SERVED:
            raise MethodNotAllowed(f"{request.method.decode()} /anthropic/{rest}: method not allowed")
        raise NotFound(f"Anthropic's /{rest} is not served by mrunner; served: {', '.join(SERVED)}")

    @routes.route(
        _paths(SERVED[0]),
        "POST",
        compat_operation(
            "Anthropic Messages (llama-server's own), streamed with stream: true", ANTHROPIC_ERROR
        ),
    )
    def messages(self, request: Request, backend: str | None = None) -> Any:
        return self._forward(request, backend, b"/v1/messages", ANTHROPIC)

    @routes.route(
        _paths(SERVED[1]), "POST", compat_operation("Count a message's input tokens", ANTHROPIC_ERROR)
    )
    def count_tokens(self, request: Request, backend: str | None = None) -> Any:
        return self._forward(request, backend, b"/v1/messages/count_tokens", NONE)
