"""whisper-server's answer to a transcription, in the shape OpenAI's API gives it.

whisper-server writes its text as its segments joined by newlines, each with the leading space of
its first token: C{" w22239\\n"} where OpenAI sends C{"w22239"}, as plain text and as JSON's C{text}
alike. Its verbose JSON puts each segment's tokens in that segment's C{words}, where OpenAI's
clients do not look: OpenAI gives word timings, when C{timestamp_granularities[]} asks for them,
as a top-level C{words} list of C{{word, start, end}}, a word with no spaces or punctuation about it.
SRT and WebVTT pass as they are: whisper-server writes them as OpenAI does.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable
from typing import Any

#: What a word's ends lose: OpenAI's words carry no punctuation ("world", not " world.").
_AROUND_WORDS = string.whitespace + string.punctuation


def text(said: str) -> str:
    """whisper-server's text (segments on lines, each with a leading space) as OpenAI's: one line."""
    return " ".join(line.strip() for line in said.splitlines() if line.strip())


def words(segments: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The segments' tokens joined into words: a token that begins with a space begins a word, the
    others (the rest of a long word, punctuation) end the one before; each timed by its tokens, a
    word's end by its last token that is not punctuation."""
    found: list[dict[str, Any]] = []
    for segment in segments:
        begun = False
        for token in segment.get("words") or ():
            said = str(token.get("word", ""))
            start, end = token.get("start", segment.get("start")), token.get("end", segment.get("end"))
            if not begun or said[:1].isspace():
                found.append({"word": said, "start": start, "end": end})
                begun = True
                continue
            found[-1]["word"] += said
            if said.strip(_AROUND_WORDS):
                found[-1]["end"] = end
    tidied = ({**word, "word": word["word"].strip(_AROUND_WORDS)} for word in found)
    return [word for word in tidied if word["word"]]


def reshaped(response_format: str, granularities: tuple[str, ...], body: bytes) -> bytes:
    """whisper-server's 200 answer C{body} in OpenAI's shape for C{response_format}."""
    if response_format == "text":
        return text(body.decode("utf-8", errors="replace")).encode()
    if response_format not in ("json", "verbose_json"):
        return body
    answer = json.loads(body)
    answer["text"] = text(str(answer.get("text", "")))
    if response_format == "verbose_json":
        segments = answer.get("segments") or []
        if "word" in granularities:
            answer["words"] = words(segments)
        for segment in segments:
            segment.pop("words", None)
    return json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()
