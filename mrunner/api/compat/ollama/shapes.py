"""Ollama's request and answer shapes, to and from llama-server's chat completions (pure functions).

What Ollama asks for and llama-server cannot do is refused by name with a
L{BadRequest}, never silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from mrunner.api.reading import validate
from mrunner.api.reading.bodies import MAX_CONTEXT_SIZE, model_name, typed
from mrunner.errors import BadRequest

#: Ollama's sampling options and llama-server's names for them.
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "num_predict": "max_tokens",
    "stop": "stop",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
}
#: Handled apart: C{num_ctx} sets the runner's context size as C{_configure} does.
NUM_CTX = "num_ctx"
#: Request fields mrunner does not serve, and why.
UNSUPPORTED = {
    "suffix": "fill-in-the-middle (suffix) is not supported",
    "template": "template overrides are not supported: the model's own chat template is used",
    "context": "the deprecated 'context' token list is not supported: send messages to /api/chat",
    "logprobs": "logprobs are not supported",
    "top_logprobs": "logprobs are not supported",
    "width": "image generation (width, height, steps) is not supported",
    "height": "image generation (width, height, steps) is not supported",
    "steps": "image generation (width, height, steps) is not supported",
}


def named_model(payload: Mapping[str, Any]) -> str:
    """Ollama's model field is C{model}, and C{name} in older clients."""
    return model_name({"model": payload.get("model") or payload.get("name")})


def refuse_unsupported(payload: Mapping[str, Any]) -> None:
    for key, why in UNSUPPORTED.items():
        if payload.get(key) not in (None, False, [], ""):
            raise BadRequest(f"{why} (field {key!r})")


def options(payload: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """llama-server's sampling fields from C{options}, and C{num_ctx} when given."""
    given = typed(payload, "options", dict, "an object") or {}
    unknown = sorted(set(given) - set(OPTIONS) - {NUM_CTX})
    if unknown:
        raise BadRequest(
            f"option(s) {', '.join(unknown)} not supported by mrunner;"
            f" supported: {', '.join([*OPTIONS, NUM_CTX])}"
        )
    _OPTION_RULES(given, "options")
    return {OPTIONS[key]: value for key, value in given.items() if key in OPTIONS}, given.get(NUM_CTX)


# The bounds of Ollama's numeric options, as llama-server's fields hold them: past them llama-server
# answers a 500 or overflows. Ollama's -1 (no limit) and -2 (fill the context) are kept.
_OPTION_RULES = validate.obj(
    {
        "temperature": validate.number(0, 100),
        "top_p": validate.number(0, 1),
        "top_k": validate.integer(0, 2**31 - 1),
        "min_p": validate.number(0, 1),
        "typical_p": validate.number(0, 1),
        "seed": validate.SAMPLING["seed"],
        "num_predict": validate.integer(-2, 2**31 - 1),
        "stop": validate.SAMPLING["stop"],
        "repeat_penalty": validate.number(0, 100),
        "repeat_last_n": validate.integer(-1, 2**31 - 1),
        "presence_penalty": validate.number(-100, 100),
        "frequency_penalty": validate.number(-100, 100),
        "mirostat": validate.integer(0, 2),
        "mirostat_tau": validate.number(0, 100),
        "mirostat_eta": validate.number(0, 100),
        NUM_CTX: validate.integer(1, MAX_CONTEXT_SIZE),
    }
)


def response_format(value: object) -> dict[str, Any]:
    """C{format}: C{"json"} or a JSON schema, as llama-server's C{response_format}."""
    if value in (None, ""):
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        return {
            "response_format": {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}
        }
    raise BadRequest(f"'format' must be \"json\" or a JSON schema object, not {value!r}")


def thinking(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, bool):
        raise BadRequest(f"'think' levels such as {value!r} are not supported; use true or false")
    return {"chat_template_kwargs": {"enable_thinking": value}}


def image_parts(text: str, images: object, projector: bool, model: str) -> Any:
    """A message's content, with its base64 C{images} as image parts."""
    if not images:
        return text
    if not isinstance(images, list) or not all(isinstance(image, str) for image in images):
        raise BadRequest("'images' must be a list of base64 strings")
    if not projector:
        raise BadRequest(
            f"model {model} has no multimodal projector (mmproj), so it cannot read images;"
            " use a vision model packaged with its projector"
        )
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    for image in images:
        parts.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}})
    return parts


def chat_messages(messages: object, projector: bool, model: str) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI's: images as parts, tool calls with ids, tool results linked to them."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest("'messages' must be a list of objects")
    converted: list[dict[str, Any]] = []
    calls: list[str] = []  # ids of tool calls not answered yet, oldest first
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{i}].role must be system, user, assistant or tool, not {role!r}")
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string")
        out: dict[str, Any] = {
            "role": role,
            "content": image_parts(content, message.get("images"), projector, model),
        }
        if message.get("thinking") and role == "assistant":
            out["reasoning_content"] = message["thinking"]
        if message.get("tool_calls"):
            out["tool_calls"] = []
            for call in typed(message, "tool_calls", list, "a list of tool calls"):
                function = typed(call, "function", dict, "an object") if isinstance(call, dict) else None
                if not function:
                    raise BadRequest(
                        f"messages[{i}].tool_calls: each is {{'function': {{'name', 'arguments'}}}}"
                    )
                calls.append(f"call_{i}_{len(out['tool_calls'])}")
                arguments = function.get("arguments", {})
                out["tool_calls"].append(
                    {
                        "id": calls[-1],
                        "type": "function",
                        "function": {
                            "name": function.get("name", ""),
                            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        },
                    }
                )
        if role == "tool":
            out["tool_call_id"] = calls.pop(0) if calls else f"call_{i}"
        converted.append(out)
    return converted


def tool_calls(calls: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """OpenAI's tool calls as Ollama's: arguments as an object, not a string."""
    converted = []
    for call in calls or ():
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = {"arguments": arguments}
        converted.append({"function": {"name": function.get("name", ""), "arguments": parsed}})
    return converted


def timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def durations(timings: Mapping[str, Any], started: float, loaded: float, now: float) -> dict[str, int]:
    """Ollama's final durations (ns) from llama-server's C{timings} and mrunner's clock."""

    def ns(seconds: float) -> int:
        return max(0, round(seconds * 1e9))

    return {
        "total_duration": ns(now - started),
        "load_duration": ns(loaded - started),
        "prompt_eval_duration": ns(timings.get("prompt_ms", 0) / 1000),
        "eval_duration": ns(timings.get("predicted_ms", 0) / 1000),
    }


def counts(prompt: int, completion: int) -> dict[str, int]:
    """Ollama's final counts: the prompt's tokens (those the runner had cached included, as the key's
    meter counts them) and the answer's."""
    return {"prompt_eval_count": prompt, "eval_count": completion}


def done_reason(finish_reason: str | None) -> str:
    """Ollama says C{length} for a cut-off answer and C{stop} otherwise (tool calls included)."""
    return "length" if finish_reason == "length" else "stop"


def model_details(config: Mapping[str, Any]) -> dict[str, Any]:
    """Ollama's C{details} from a stored model's config."""
    family = config.get("architecture") or ""
    return {
        "parent_model": "",
        "format": config.get("format") or "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": config.get("parameters") or "",
        "quantization_level": config.get("quantization") or "",
    }
