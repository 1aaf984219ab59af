"""``mrunner run``: one streamed answer, or a conversation that keeps every turn.

Answers stream from the OpenAI chat route as server-sent events and are
written as they come. Ctrl-C while an answer streams closes the connection,
which makes the daemon stop the generation; Ctrl-D at the prompt leaves.
A conversation that outgrows the model's context is told so, with C{/new}
to start another, as soon as it does: when the context fills in the middle
of an answer (llama-server then ends it as it ends one at C{max_tokens}:
C{finish_reason} C{length}; the usage it reports tells the two apart), and
when the next question no longer fits.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from typing import IO, Any

from rich.console import Console

from mrunner.cli.client import Daemon, lines
from mrunner.cli.errors import CommandError, DaemonError, explain
from mrunner.cli.progress import wait_for_install

CHAT_PATH = "/engines/v1/chat/completions"
LEAVE_HINT = "Ctrl-D or /bye leaves"
#: Enough for a long answer; small models that loop stop within seconds rather than minutes.
DEFAULT_MAX_TOKENS = 1024
NEW = "/new"
HELP = "/help"
CONTEXT_EXCEEDED = "context_length_exceeded"
#: What a person may type at the chat's prompt besides a question.
COMMANDS = (
    (NEW, "start a new conversation (the model forgets this one)"),
    ("/bye", "leave (as Ctrl-D does)"),
    (f"{HELP}, /?", "show these commands"),
    ("Ctrl-C", "stop the answer being written"),
)
#: Why an answer stopped early: at C{--max-tokens}, or because the model's context was full.
MAX_TOKENS, CONTEXT_FULL = "max_tokens", "context"


class Chat:
    """The messages of one conversation with C{model}; each answer has at most C{max_tokens} (0: no limit).

    C{cut} says why the last answer stopped early (L{MAX_TOKENS}, L{CONTEXT_FULL}), else None;
    C{tokens} how many tokens the conversation held at its end, when the runner said.
    """

    def __init__(self, daemon: Daemon, console: Console, model: str, max_tokens: int = 0) -> None:
        self._daemon = daemon
        self._console = console
        self.model = model
        self.max_tokens = max_tokens
        self.messages: list[dict[str, str]] = []
        self.cut: str | None = None
        self.tokens: int | None = None

    def preload(self) -> None:
        """Load the model now, so a missing model or a failed load shows before the first question."""
        self._open({"model": self.model, "messages": []}, {"X-Preload-Only": "true"}).close()

    def ask(self, prompt: str, write: Callable[[str], None]) -> None:
        """Send C{prompt} after the conversation so far and C{write} the answer as it streams.

        The answer joins the conversation even when Ctrl-C cut it short; a
        question that got no answer at all leaves it again.
        """
        self.messages.append({"role": "user", "content": prompt})
        answer: list[str] = []
        try:
            with closing(self._answer()) as texts:  # closing: Ctrl-C in write() hangs up too
                for text in texts:
                    write(text)
                    answer.append(text)
        finally:
            if answer:
                self.messages.append({"role": "assistant", "content": "".join(answer)})
            else:
                self.messages.pop()

    def _answer(self) -> Generator[str, None, None]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        self.cut, self.tokens = None, None
        cut, usage = False, None
        with self._open(body) as response:
            for line in lines(response):
                if not line.startswith(b"data:"):  # a blank line, a comment, an event name
                    continue
                data = line.removeprefix(b"data:").strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                cut = cut or any(c.get("finish_reason") == "length" for c in event.get("choices") or [])
                usage = event.get("usage") or usage
                yield from _texts(event)
        if usage:
            self.tokens = usage.get("total_tokens")
        if cut:
            self.cut = why_cut(self.max_tokens, (usage or {}).get("completion_tokens"))

    def end_answer(self, out: IO[str], chatting: bool = False) -> None:
        """End the answer's line; after one cut short, say why on the error console, and what to do:
        C{/new} in a chat (C{chatting}), a smaller prompt or a larger context for one question."""
        out.write("\n")
        out.flush()
        if self.cut is None:
            return
        if self.cut == MAX_TOKENS:
            text = f"[stopped at {self.max_tokens} tokens: --max-tokens N allows more, 0 no limit]"
        else:
            size = f" ({self.tokens} tokens)" if self.tokens else ""
            larger = f"`mrunner configure {self.model} --context-size N`"
            then = f"type {NEW} to start a new conversation" if chatting else f"{larger} leaves more room"
            text = f"[stopped: the model's context is full{size}; {then}]"
        self._console.print(text, markup=False, highlight=False)

    def _open(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        """Send C{body}; while the backend installs, show its progress and send again once it is done."""
        while True:
            try:
                return self._daemon.open("POST", CHAT_PATH, body, headers=headers)
            except DaemonError as e:
                if e.code != "backend_installing":
                    raise
                wait_for_install(self._daemon, self._console)


def why_cut(max_tokens: int, completion_tokens: int | None) -> str:
    """Why an answer that ended with C{finish_reason} C{length} stopped: at C{max_tokens} (0: none), or
    because the context filled first (fewer tokens than that, by the runner's count)."""
    if not max_tokens:
        return CONTEXT_FULL
    if completion_tokens is not None and completion_tokens < max_tokens:
        return CONTEXT_FULL
    return MAX_TOKENS


def _texts(event: dict[str, Any]) -> Iterator[str]:
    """The content of one streamed chunk; a mid-stream error event becomes a L{DaemonError}."""
    error = event.get("error")
    if isinstance(error, dict):
        raise DaemonError(502, str(error.get("message")), error.get("code"))
    for choice in event.get("choices") or []:
        text = (choice.get("delta") or {}).get("content")
        if text:
            yield text


def flushing(out: IO[str]) -> Callable[[str], None]:
    """Writes each piece of an answer to C{out} at once, as the tokens come."""

    def write(text: str) -> None:
        out.write(text)
        out.flush()

    return write


def converse(chat: Chat, console: Console, errors: Console) -> None:
    """Read questions at a C{>} prompt until Ctrl-D or C{/bye}; stream each answer.

    The model is loaded already (L{mrunner.cli.engines.run}).
    """
    import readline  # noqa: F401  # gives input() line editing and history

    console.print(
        f"Chatting with {chat.model}. Ctrl-C stops an answer; {NEW} starts anew; {HELP} lists the"
        f" commands; {LEAVE_HINT}.",
        markup=False,
    )
    out = console.file
    while True:
        try:
            prompt = input("> ")
        except EOFError:
            out.write("\n")
            return
        except KeyboardInterrupt:
            out.write(f"\n({LEAVE_HINT})\n")
            continue
        if prompt.strip() == "/bye":
            return
        if prompt.strip() == NEW:
            chat.messages.clear()
            console.print("(a new conversation)", markup=False)
            continue
        if prompt.strip() in (HELP, "/?"):
            for command, meaning in COMMANDS:
                console.print(f"  {command:<13} {meaning}", markup=False, highlight=False)
            continue
        if not prompt.strip():
            continue
        try:
            chat.ask(prompt, flushing(out))
        except KeyboardInterrupt:
            out.write(" [stopped]")
        except CommandError as e:
            errors.print(f"mrunner: {explain(e, 'run', chat.model)}", markup=False, highlight=False)
            if isinstance(e, DaemonError) and e.code == CONTEXT_EXCEEDED:
                console.print(f"Type {NEW} to start a new conversation.", markup=False)
            continue
        chat.end_answer(out, chatting=True)
