"""Request bodies checked before any runner sees them: after strict JSON (L{strict_json}), the route's shape.

llama-server answers some client mistakes with a 500 (``"role": 5``);
mrunner refuses them first with a 400 whose C{param} names the field. A shape
is a L{Rule} tree over the fields mrunner knows; every other field passes
through untouched (the runner gets the request's own bytes), because
llama-server has many extensions. Each rule also carries its JSON Schema, so
``/openapi.json`` documents exactly what is checked. Routes of other APIs
build their shapes from the same rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from mrunner.errors import BadRequest


@attrs.frozen
class Rule:
    """Checks a value found at C{param}, raising L{BadRequest} that names it; C{schema} says the same."""

    check: Callable[[object, str], None]
    schema: dict[str, Any]
    # As an optional field, null means absent (llama-server's sampling fields read it so);
    # where llama-server reads null as a value of the wrong type (and answers 500), it is refused.
    nullable: bool = True

    def __call__(self, value: object, param: str) -> None:
        self.check(value, param)


def not_null(rule: Rule) -> Rule:
    """C{rule}, refusing null even as an optional field."""
    return attrs.evolve(rule, nullable=False)


def _refuse(param: str, expected: str, value: object) -> BadRequest:
    shown = json.dumps(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return BadRequest(f"'{param}' must be {expected}, not {shown}", code="invalid_value", param=param)


def kind(expected: str, accepts: Callable[[object], bool], schema: dict[str, Any]) -> Rule:
    """A rule for one value, described as C{expected} in the message when it fails."""

    def check(value: object, param: str) -> None:
        if not accepts(value):
            raise _refuse(param, expected, value)

    return Rule(check, schema)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bounded(name: str, is_kind: Callable[[object], bool], low: float | None, high: float | None) -> Rule:
    words = {"integer": "an integer", "number": "a number"}[name]
    if low is not None and high is not None:
        words += f" from {low!r} to {high!r}"
    elif low is not None:
        words += f" of at least {low!r}"
    schema: dict[str, Any] = {"type": name}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return kind(
        words,
        lambda v: is_kind(v) and (low is None or v >= low) and (high is None or v <= high),  # type: ignore[operator]
        schema,
    )


def integer(low: int | None = None, high: int | None = None) -> Rule:
    return _bounded("integer", _is_int, low, high)


def number(low: float | None = None, high: float | None = None) -> Rule:
    return _bounded("number", _is_number, low, high)


string = kind("a string", lambda v: isinstance(v, str), {"type": "string"})
text = kind(
    "a non-empty string", lambda v: isinstance(v, str) and v != "", {"type": "string", "minLength": 1}
)
boolean = kind("true or false", lambda v: isinstance(v, bool), {"type": "boolean"})
anything = kind("any value", lambda v: True, {})


def enum(*values: object) -> Rule:
    return kind(
        "one of " + ", ".join(json.dumps(v) for v in values), lambda v: v in values, {"enum": list(values)}
    )


def array(item: Rule, *, non_empty: bool = False, what: str = "array") -> Rule:
    """A list (of C{what}) whose every item passes C{item}, checked as C{param[i]}."""
    expected = f"a non-empty {what}" if non_empty else f"an {what}" if what[0] in "aeiou" else f"a {what}"

    def check(value: object, param: str) -> None:
        if not isinstance(value, list) or (non_empty and not value):
            raise _refuse(param, expected, value)
        for i, element in enumerate(value):
            item(element, f"{param}[{i}]")

    schema = {"type": "array", "items": item.schema, **({"minItems": 1} if non_empty else {})}
    return Rule(check, schema)


def obj(fields: Mapping[str, Rule], required: Sequence[str] = (), *, nulls: bool = True) -> Rule:
    """An object: C{required} fields present, known fields checked, others free.

    With C{nulls} false, no field may be null unless its rule takes null as a value.
    """
    if not nulls:
        fields = {name: not_null(rule) for name, rule in fields.items()}

    def check(value: object, param: str) -> None:
        if not isinstance(value, dict):
            raise _refuse(param, "an object", value)
        fields_of(value, fields, required, f"{param}.")

    return Rule(check, _object_schema(fields, required))


def _object_schema(fields: Mapping[str, Rule], required: Sequence[str]) -> dict[str, Any]:
    """Optional nullable fields may be null: the check takes null as absent."""
    properties = {
        name: {"anyOf": [rule.schema, {"type": "null"}]}
        if rule.nullable and name not in required
        else rule.schema
        for name, rule in fields.items()
    }
    return {"type": "object", "properties": properties, **({"required": list(required)} if required else {})}


def one_of_keys(keys: Sequence[str], rule: Rule) -> Rule:
    """C{rule}, on an object that has at least one of C{keys} (null counts: it is there)."""

    def check(value: object, param: str) -> None:
        rule(value, param)
        if isinstance(value, dict) and not any(key in value for key in keys):
            raise BadRequest(
                f"'{param}' must have {' or '.join(repr(k) for k in keys)}",
                code="missing_required_parameter",
                param=f"{param}.{keys[0]}",
            )

    return Rule(check, {**rule.schema, "anyOf": [{"required": [key]} for key in keys]})


def fields_of(
    payload: Mapping[str, Any], fields: Mapping[str, Rule], required: Sequence[str], prefix: str = ""
) -> None:
    """Check C{payload}'s known C{fields}; each of C{required} must be present and not null."""
    for name, rule in fields.items():
        value = payload.get(name)
        if value is not None or (name in payload and not rule.nullable and name not in required):
            rule(value, prefix + name)
    for name in required:
        if payload.get(name) is None:
            raise BadRequest(
                f"'{prefix}{name}' is required", code="missing_required_parameter", param=prefix + name
            )


_JSON_TYPES: dict[type, dict[str, Any]] = {
    type(None): {"type": "null"},
    str: {"type": "string"},
    int: {"type": "integer"},
    dict: {"type": "object"},
    list: {"type": "array"},
}


def by_type(expected: str, rules: Mapping[type, Rule | None]) -> Rule:
    """One of several JSON types, each checked by its own rule (None: any value of that type)."""

    def check(value: object, param: str) -> None:
        for python_type, rule in rules.items():
            if isinstance(value, python_type) and not (python_type is int and isinstance(value, bool)):
                if rule is not None:
                    rule(value, param)
                return
        raise _refuse(param, expected, value)

    return Rule(check, {"anyOf": [_JSON_TYPES[t] if r is None else r.schema for t, r in rules.items()]})


def tagged(key: str, rules: Mapping[str, Rule]) -> Rule:
    """An object whose C{key} names which of C{rules} checks it."""
    expected = f"an object whose '{key}' is one of " + ", ".join(json.dumps(k) for k in rules)

    def check(value: object, param: str) -> None:
        rule = rules.get(value.get(key)) if isinstance(value, dict) else None  # type: ignore[arg-type]
        if rule is None:
            raise _refuse(f"{param}.{key}" if isinstance(value, dict) else param, expected, value)
        rule(value, param)

    return Rule(check, {"oneOf": [rule.schema for rule in rules.values()]})


@attrs.frozen
class Shape:
    """A request body's check, and its JSON Schema for the OpenAPI document."""

    fields: Mapping[str, Rule]
    required: Sequence[str] = ()

    def __call__(self, payload: Mapping[str, Any]) -> None:
        fields_of(payload, self.fields, self.required)

    @property
    def schema(self) -> dict[str, Any]:
        return _object_schema(self.fields, self.required)


# What every inference body may carry besides its own fields: the model (checked
# first, by the route) and Ollama's keep_alive.
DURATION = kind(
    "a duration like 30, '30s', '5m', '1h' or -1",
    lambda v: True,  # read, and refused with its own message, by requests.keep_alive
    {"anyOf": [{"type": "number"}, {"type": "string", "pattern": r"^\s*-?\d+(\.\d+)?\s*(ms|s|m|h)?\s*$"}]},
)
COMMON: dict[str, Rule] = {"model": text, "keep_alive": DURATION}
TOKENS = integer(0, 2**31 - 1)
# OpenAI's documented ranges; llama-server's extensions (top_k, min_p, ...) pass unchecked
# except for being finite, which the parser ensures.
SAMPLING: dict[str, Rule] = {
    **COMMON,
    "stream": boolean,
    "stream_options": obj({"include_usage": boolean}),
    "temperature": number(0, 2),
    "top_p": number(0, 1),
    "frequency_penalty": number(-2, 2),
    "presence_penalty": number(-2, 2),
    "max_tokens": TOKENS,
    "n": integer(1, 128),
    "seed": integer(-(2**63), 2**64 - 1),
    "stop": by_type("a string or an array of strings", {str: None, list: array(string)}),
    "logit_bias": kind(
        "an object of numbers",
        lambda v: isinstance(v, dict) and all(map(_is_number, v.values())),
        {"type": "object", "additionalProperties": {"type": "number"}},
    ),
    "user": string,
}
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# Text, and images for a model with a projector (the route refuses them for any other model):
# llama-server answers any other part with a 500.
PART = tagged(
    "type",
    {
        "text": obj({"type": enum("text"), "text": string}, required=("type", "text"), nulls=False),
        "image_url": obj(
            {"type": enum("image_url"), "image_url": obj({"url": string, "detail": string}, ("url",))},
            required=("type", "image_url"),
            nulls=False,
        ),
    },
)
# llama-server's chat parser answers a 500 to every shape it cannot read: what it reads is checked here.
FUNCTION = enum("function")
TOOL_CALL = obj(
    {
        "id": string,
        "type": FUNCTION,
        "function": obj({"name": string, "arguments": anything}, ("name", "arguments"), nulls=False),
    },
    required=("type", "function"),
    nulls=False,
)
TOOL = obj(
    {
        "type": FUNCTION,
        "function": obj(
            {"name": string, "description": string, "parameters": anything}, ("name",), nulls=False
        ),
    },
    required=("type", "function"),
    nulls=False,
)
MESSAGE = one_of_keys(
    ("content", "tool_calls"),
    obj(
        {
            "role": enum(*ROLES),
            "content": by_type(
                "a string, null or an array of content parts",
                {str: None, type(None): None, list: array(PART)},
            ),
            "name": string,
            "tool_calls": array(TOOL_CALL),
            "tool_call_id": string,
            "reasoning_content": string,
        },
        required=("role",),
        nulls=False,
    ),
)
TOKEN_ID = integer(0, 2**31 - 1)
TOKEN_IDS = array(TOKEN_ID, what="array of token ids")
# A prompt or an embedding input: text, texts, token ids, or lists of token ids.
INPUT = by_type(
    "a string, an array of strings or an array of token ids",
    {
        str: None,
        list: array(
            by_type(
                "a string, a token id or an array of token ids", {str: None, int: TOKEN_ID, list: TOKEN_IDS}
            ),
            non_empty=True,
        ),
    },
)
chat = Shape(
    {
        **SAMPLING,
        "messages": array(MESSAGE, non_empty=True),
        "logprobs": boolean,
        "top_logprobs": integer(0, 20),
        "max_completion_tokens": TOKENS,
        "tools": array(TOOL),
        "tool_choice": by_type("a string or an object", {str: None, dict: None}),
        "parallel_tool_calls": boolean,
        "response_format": obj({"type": string}, required=("type",)),
    },
    required=("model", "messages"),
)
completions = Shape(
    {
        **SAMPLING,
        "prompt": INPUT,
        "logprobs": integer(0, 20),
        "echo": boolean,
    },
    required=("model", "prompt"),
)
embeddings = Shape(
    {
        **COMMON,
        "input": INPUT,
        "encoding_format": not_null(enum("float", "base64")),
        "dimensions": integer(1),
    },
    required=("model", "input"),
)
_DOCUMENTS = array(string, non_empty=True, what="array of strings")
rerank = Shape(
    {**COMMON, "query": string, "documents": _DOCUMENTS, "top_n": integer(0, 2**31 - 1)},
    required=("model", "query", "documents"),
)
