"""An Anthropic Messages request as the pinned llama-server reads it: the OpenAI chat it converts it to.

llama-server's C{/v1/messages} converts the request
(C{server_chat_convert_anthropic_to_oai}, C{tools/server/server-chat.cpp}) before it applies
the chat template, and has no route that returns the conversion. The prompt cache needs the
prompt's tokens to find a saved state that begins them, so this is the same conversion, for
what the template reads (the messages, tools, tool choice, template arguments). Should it
differ from llama-server's in a corner, the tokens differ, no state is an exact prefix of them,
and the turn is read in full: a miss, never a wrong answer.
"""

from __future__ import annotations

import json
from typing import Any

MESSAGES = b"/v1/messages"
BILLING = "x-anthropic-billing-header:"


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI chat body llama-server makes of the Anthropic C{body}, as far as its template reads it."""
    messages: list[Any] = []
    system = body.get("system")
    if isinstance(system, str):
        messages.append({"role": "system", "content": _billing(system)})
    elif isinstance(system, list):
        text = "".join(_billing(b.get("text", "")) for b in system if _type(b) == "text")
        messages.append({"role": "system", "content": text})
    for message in body.get("messages", []):
        messages += _message(message)
    chat: dict[str, Any] = {"messages": messages}
    if isinstance(body.get("tools"), list):
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.get("name", ""),
                    "description": tool.get("description", ""),
                    "parameters": tool.get("input_schema", {}),
                },
            }
            for tool in body["tools"]
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and _type(choice) in ("auto", "any", "tool"):
        chat["tool_choice"] = "auto" if _type(choice) == "auto" else "required"
    if "chat_template_kwargs" in body:
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    return chat


def _message(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(message, dict) or "content" not in message:
        return [] if isinstance(message, dict) and message.get("role") == "assistant" else [message]
    if not isinstance(content, list):
        return [message]
    parts: list[Any] = []
    calls: list[Any] = []
    results: list[Any] = []
    reasoning = ""
    for block in content:
        kind = _type(block)
        if kind == "text":
            parts.append(block)
        elif kind == "thinking":
            reasoning += block.get("thinking", "")
        elif kind == "image":
            url = _image_url(block.get("source", {}))
            if url is not None:
                parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "tool_use":
            function = {"name": block.get("name", ""), "arguments": _dump(block.get("input", {}))}
            calls.append({"id": block.get("id", ""), "type": "function", "function": function})
        elif kind == "tool_result":
            call = block.get("tool_use_id", "")
            results.append({"role": "tool", "tool_call_id": call, "content": _result(block)})
    converted: list[Any] = []
    if parts or calls or reasoning:
        new: dict[str, Any] = {"role": message.get("role", "")}
        new["content"] = parts if parts else ""
        if calls:
            new["tool_calls"] = calls
        if reasoning:
            new["reasoning_content"] = reasoning
        converted.append(new)
    return converted + results


def _result(block: dict[str, Any]) -> Any:
    """A tool result's content: text as one string, with images as parts, else empty."""
    content = block.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[Any] = []
    for c in content:
        if _type(c) == "text":
            parts.append({"type": "text", "text": c.get("text", "")})
        elif _type(c) == "image":
            url = _image_url(c.get("source", {}))
            if url is not None:
                parts.append({"type": "image_url", "image_url": {"url": url}})
    if any(_type(c) == "image" for c in content):
        return parts
    return "".join(p["text"] for p in parts)


def _image_url(source: Any) -> str | None:
    if _type(source) == "base64":
        return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"
    if _type(source) == "url":
        return str(source.get("url", ""))
    return None


def _billing(text: str) -> str:
    """Claude Code's billing header with its per-request stamp made constant, as llama-server does."""
    if not text.startswith(BILLING):
        return text
    at = text.find("cch=", len(BILLING))
    if at < 0 or at + 9 >= len(text) or text[at + 9] != ";":
        return text
    return text[: at + 4] + "fffff" + text[at + 9 :]


def _dump(value: Any) -> str:
    """JSON as nlohmann's C{dump()} writes it: keys sorted, no spaces, text unescaped."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _type(block: Any) -> Any:
    return block.get("type") if isinstance(block, dict) else None
