"""Reading and checking request bodies, in the order the contract gives."""

from __future__ import annotations

from collections.abc import Mapping
from io import BytesIO
from typing import Any

from twisted.web.iweb import IRequest

from mrunner.api.reading.strict_json import parse_json
from mrunner.config import ConfigError, parse_keep_alive
from mrunner.errors import BadRequest, PayloadTooLarge
from mrunner.values.model import Model


def read_body(request: IRequest, limit: int) -> bytes:
    """The request body; L{PayloadTooLarge} past C{limit} bytes."""
    declared = request.getHeader(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is {int(declared)} bytes; the limit is {limit}")
    content = request.content
    # A small body is in memory: getvalue shares its buffer, where read would keep a second copy.
    if isinstance(content, BytesIO):
        body = content.getvalue()
    else:
        content.seek(0)
        body = content.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
    return body


def json_object(body: bytes) -> dict[str, Any]:
    """C{body} decoded as a JSON object, strictly (L{parse_json}), else L{BadRequest} saying what is wrong.

    Every route that reads a JSON body reads it here.
    """
    value = parse_json(body)
    if not isinstance(value, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return value


def model_name(payload: dict[str, Any]) -> str:
    """The C{model} field, which every inference request must name."""
    name = payload.get("model")
    if not isinstance(name, str) or not name.strip():
        raise BadRequest("the request must name a model in its 'model' field", code="model_required")
    return name.strip()


IMAGE_PARTS = frozenset(("image_url", "input_image", "image"))


def has_image_parts(payload: Mapping[str, Any]) -> bool:
    """Whether a chat's messages carry image parts, which only a model with a projector can read."""
    messages = payload.get("messages")
    return isinstance(messages, list) and any(
        isinstance(part, dict) and part.get("type") in IMAGE_PARTS
        for message in messages
        if isinstance(message, dict) and isinstance(message.get("content"), list)
        for part in message["content"]
    )


def prompt_texts(payload: Mapping[str, Any]) -> tuple[str, ...]:
    """The texts a request gives the model to read, each message's apart, on every API: chat
    messages' (OpenAI's, Anthropic's, Ollama's), a system prompt, a completion's prompt, a
    response's input and instructions. The scheduler counts them against the context before a
    runner starts; what this misses (tools, a list of prompts) only makes that count lower."""
    texts = []
    for key in ("system", "instructions", "prompt", "input", "messages"):
        value = payload.get(key)
        for item in value if isinstance(value, list) else [value]:
            texts.extend(_texts(item.get("content") if isinstance(item, dict) and key != "system" else item))
    return tuple(texts)


def _texts(content: object) -> list[str]:
    """A message's content as text: itself, or its parts' C{text}."""
    if isinstance(content, str):
        return [content]
    if isinstance(text := _part_text(content), str):
        return [text]
    if isinstance(content, list):
        return [text for part in content if isinstance(text := _part_text(part), str)]
    return []


def _part_text(part: object) -> object:
    return part.get("text") if isinstance(part, dict) else None


def check_vision(model: Model) -> None:
    """A request with images needs a projector: say so before any runner loads."""
    if "mmproj" not in model.files:
        raise BadRequest(
            f"model {model.name} cannot read images: it has no multimodal projector (mmproj) layer;"
            " use a vision model, e.g. one pulled from a Hugging Face repository with an mmproj-*.gguf,"
            " or add a projector with `mrunner package --mmproj FILE`",
            code="model_has_no_vision",
            param="model",
        )


def keep_alive(value: object) -> float | None:
    """Ollama's C{keep_alive} (``"5m"``, seconds, ``0``) in seconds; -1 (for ever) if < 0 or past a year."""
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except ConfigError as e:
        raise BadRequest(str(e), code="invalid_keep_alive", param="keep_alive") from None


def query(request: IRequest, key: str) -> str | None:
    """The first C{?key=} value, decoded."""
    values = request.args.get(key.encode())
    return values[0].decode("utf-8", errors="replace") if values else None


def whole(text: str, high: int) -> int | None:
    """C{text} as a whole number from 1 to C{high}; None when it is not one.

    C{str.isdigit} alone passes C{"²"}, and C{int} refuses more than 4,300 digits:
    only ASCII digits no longer than C{high}'s are read.
    """
    if text.isascii() and text.isdigit() and len(text) <= len(str(high)) and 1 <= int(text) <= high:
        return int(text)
    return None


def count(request: IRequest, key: str, default: int, high: int) -> int:
    """A C{?key=} whole number from 1 to C{high}, C{default} when absent."""
    value = query(request, key)
    if value is None:
        return default
    number = whole(value, high)
    if number is None:
        raise BadRequest(f"?{key}= must be a whole number from 1 to {high}, not {value[:40]!r}", param=key)
    return number


def flag(request: IRequest, key: str) -> bool:
    """A C{?key=true|false} switch, false when absent."""
    value = (query(request, key) or "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise BadRequest(f"?{key}= must be true or false, not {value!r}")
    return value in ("true", "1")


# The most a runner's context may hold: past any model's training context, inside llama-server's int.
MAX_CONTEXT_SIZE = 2**24


def typed(payload: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """C{payload[key]} if of C{kind}, None when absent, else L{BadRequest} saying what it must be."""
    value = payload.get(key)
    if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
        raise BadRequest(f"'{key}' must be {what}, not {type(value).__name__}")
    return value
