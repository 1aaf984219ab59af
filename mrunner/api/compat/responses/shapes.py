"""OpenAI Responses shapes to and from llama-server's chat completions (pure functions).

Input items become chat messages (function calls and their outputs included),
function tools become chat tools, and an answer's text and tool calls become
output items. Features mrunner does not serve are refused by name.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from mrunner.api.openai.tally import Tally
from mrunner.api.reading import validate
from mrunner.api.reading.bodies import typed
from mrunner.errors import BadRequest

#: Request fields that ask for what mrunner does not do.
UNSUPPORTED = {
    "background": "background responses are not supported",
    "conversation": "conversations are not supported: chain responses with previous_response_id",
    "prompt": "stored prompt templates are not supported",
}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "refusal")


def _metadata(value: object, param: str) -> None:
    """OpenAI's limits on C{metadata}: 16 pairs, keys of 64 characters, string values of 512."""
    if not isinstance(value, dict) or len(value) > 16:
        raise BadRequest(
            f"'{param}' must be an object of at most 16 pairs", code="invalid_value", param=param
        )
    for key, item in value.items():
        if len(key) > 64:
            raise BadRequest(
                f"'{param}' keys are at most 64 characters; {key[:20]!r}... has {len(key)}",
                code="invalid_value",
                param=f"{param}.{key[:64]}",
            )
        if not isinstance(item, str) or len(item) > 512:
            raise BadRequest(
                f"'{param}.{key}' must be a string of at most 512 characters",
                code="invalid_value",
                param=f"{param}.{key}",
            )


METADATA = validate.Rule(
    _metadata,
    {
        "type": "object",
        "maxProperties": 16,
        "propertyNames": {"maxLength": 64},
        "additionalProperties": {"type": "string", "maxLength": 512},
    },
)
#: The request's fields checked before it is translated (the translation checks the rest).
CREATE = validate.Shape(
    {
        **validate.COMMON,
        "metadata": METADATA,
        "temperature": validate.SAMPLING["temperature"],
        "top_p": validate.SAMPLING["top_p"],
        "max_output_tokens": validate.TOKENS,
    },
    required=("model",),
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def refuse_unsupported(payload: Mapping[str, Any]) -> None:
    for key, why in UNSUPPORTED.items():
        if payload.get(key) not in (None, False):
            raise BadRequest(f"{why} (field {key!r})")


def input_items(value: object) -> list[dict[str, Any]]:
    """The request's C{input} as a list of items, each with an id (as C{input_items} lists them)."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise BadRequest("'input' must be a string or a list of input items")
    items = []
    for item in value:
        kind = item.get("type") or ("message" if "role" in item else None)
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(
            kind or "", "item"
        )
        items.append({"id": new_id(prefix), **item, "type": kind})
    return items


def _content(content: object, where: str) -> Any:
    """A message's content: text, or chat parts when it has images."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        at = f"{where}.content[{j}]"
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": _text(part, "text", at) or _text(part, "refusal", at)})
        elif kind == "input_image" and part.get("image_url"):
            parts.append({"type": "image_url", "image_url": {"url": _text(part, "image_url", at)}})
        else:
            raise BadRequest(f"{where}: content part {kind!r} is not supported (text and image URLs are)")
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages: consecutive function calls become one assistant turn."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item["type"]
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role", ""), item.get("role"))
            if role not in ("system", "user", "assistant"):
                raise BadRequest(f"{where}.role must be user, assistant, system or developer, not {role!r}")
            messages.append({"role": role, "content": _content(item.get("content", ""), where)})
        elif kind == "function_call":
            call = {
                "id": _text(item, "call_id", where) or item["id"],
                "type": "function",
                "function": {
                    "name": _text(item, "name", where),
                    "arguments": _text(item, "arguments", where) or "{}",
                },
            }
            previous = messages[-1] if messages else None
            if previous is not None and previous["role"] == "assistant" and "tool_calls" in previous:
                previous["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _text(item, "call_id", where),
                    "content": output if isinstance(output, str) else _content(output, where),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise BadRequest(
                f"{where}: input items of type {kind!r} are not supported"
                " (message, function_call, function_call_output and reasoning are)"
            )
    return messages


def _text(item: Mapping[str, Any], key: str, where: str) -> str:
    """C{item[key]}, a string ("" when absent): llama-server answers a 500 for any other type."""
    value = item.get(key, "")
    if not isinstance(value, str):
        raise BadRequest(f"'{where}.{key}' must be a string", code="invalid_value", param=f"{where}.{key}")
    return value


def has_images(messages: list[dict[str, Any]]) -> bool:
    """Whether chat C{messages} carry image parts, which only a model with a projector reads."""
    return any(
        isinstance(message["content"], list)
        and any(part["type"] == "image_url" for part in message["content"])
        for message in messages
        if "content" in message
    )


def chat_tools(payload: Mapping[str, Any]) -> dict[str, Any]:
    """C{tools} and C{tool_choice} as chat completions' fields; built-in tools are refused by name."""
    tools = typed(payload, "tools", list, "a list of tools") or []
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise BadRequest(f"tool type {kind!r} is not supported: only function tools are")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise BadRequest(
                f"'tools[{i}].name' is required: a function tool is called by its name",
                code="missing_required_parameter",
                param=f"tools[{i}].name",
            )
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
        converted.append({"type": "function", "function": function})
    fields: dict[str, Any] = {"tools": converted} if converted else {}
    choice = typed(payload, "tool_choice", (str, dict), "a string or an object")
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise BadRequest(f"tool_choice of type {choice.get('type')!r} is not supported")
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        fields["tool_choice"] = choice
    if payload.get("parallel_tool_calls") is not None:
        fields["parallel_tool_calls"] = payload["parallel_tool_calls"]
    return fields


def sampling(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Sampling and C{text.format} as chat completions' fields."""
    fields = {key: typed(payload, key, (int, float), "a number") for key in ("temperature", "top_p")}
    fields["max_tokens"] = typed(payload, "max_output_tokens", int, "an integer")
    fields = {key: value for key, value in fields.items() if value is not None}
    text_format = typed(typed(payload, "text", dict, "an object") or {}, "format", dict, "an object")
    kind = (text_format or {"type": "text"}).get("type")
    if kind == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif kind == "json_schema" and text_format is not None:
        schema = {key: text_format[key] for key in ("name", "schema", "strict") if key in text_format}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind != "text":
        raise BadRequest(
            f"text.format of type {kind!r} is not supported (text, json_object, json_schema are)"
        )
    return fields


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text else [],
    }


def call_items(tally: Tally) -> list[dict[str, Any]]:
    return [
        {
            "type": "function_call",
            "id": new_id("fc"),
            "call_id": call["id"] or new_id("call"),
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] or "{}",
            "status": "completed",
        }
        for call in tally.tool_calls
    ]


def output_items(tally: Tally, message_id: str | None = None) -> list[dict[str, Any]]:
    """The answer's output: its text as a message (unless it only called tools), then its tool calls."""
    calls = call_items(tally)
    text = [message_item(tally.text, item_id=message_id)] if tally.text or not calls else []
    return text + calls


def reply_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items as the chat messages a follow-up's history continues with."""
    return chat_messages([{**item, "role": item.get("role", "assistant")} for item in output])


def response_object(
    response_id: str,
    created: int,
    payload: Mapping[str, Any],
    status: str,
    output: list[dict[str, Any]],
    tally: Tally | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Response object: what was asked, and what came of it (its usage as the key's meter counts it:
    C{input_tokens} includes the cached ones, which C{cached_tokens} tells apart)."""
    prompt, generated = tally.counts if tally else (0, 0)
    incomplete = status == "incomplete"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": payload.get("instructions"),
        "max_output_tokens": payload.get("max_output_tokens"),
        "model": payload.get("model"),
        "output": output,
        "parallel_tool_calls": payload.get("parallel_tool_calls", True),
        "previous_response_id": payload.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": payload.get("store", True) is not False,
        "temperature": payload.get("temperature"),
        "text": payload.get("text") or {"format": {"type": "text"}},
        "tool_choice": payload.get("tool_choice") or "auto",
        "tools": payload.get("tools") or [],
        "top_p": payload.get("top_p"),
        "truncation": payload.get("truncation") or "disabled",
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": tally.cached},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        }
        if tally
        else None,
        "metadata": payload.get("metadata") or {},
    }


def final_status(tally: Tally) -> str:
    return "incomplete" if tally.finish_reason == "length" else "completed"
