"""``mrunner run``: one streamed answer, or a conversation that keeps every turn.

Answers stream from the OpenAI chat route as server-sent events and are
written as they come. Ctrl-C while an answer streams closes the connection,
which makes the daemon stop the generation; Ctrl-D at the prompt leaves.
A conversation that outgrows the model's context is told so, with C{/new}
to start another.
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
CONTEXT_EXCEEDED = "context_length_exceeded"


class Chat:
    """The messages of one conversation with C{model}; each answer has at most C{max_tokens} (0: no limit).

    C{cut} says whether the last answer stopped at that limit.
    """

    def __init__(self, daemon: Daemon, console: Console, model: str, max_tokens: int = 0) -> None:
        self._daemon = daemon
        self._console = console
        self.model = model
        self.max_tokens = max_tokens
        self.messages: list[dict[str, str]] = []
        self.cut = False

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
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, "stream": True}
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        self.cut = False
        with self._open(body) as response:
            for line in lines(response):
                if not line.startswith(b"data:"):  # a blank line, a comment, an event name
                    continue
                data = line.removeprefix(b"data:").strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                self.cut = self.cut or any(
                    c.get("finish_reason") == "length" for c in event.get("choices") or []
                )
                yield from _texts(event)

    def end_answer(self, out: IO[str]) -> None:
        """End the answer's line; after one cut at C{max_tokens}, say so on the error console."""
        out.write("\n")
        out.flush()
        if self.cut:
            self._console.print(
                f"[stopped at {self.max_tokens} tokens: --max-tokens N allows more, 0 no limit]",
                markup=False,
                highlight=False,
            )

    def _open(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        """Send C{body}; while the backend installs, show its progress and send again once it is done."""
        while True:
            try:
                return self._daemon.open("POST", CHAT_PATH, body, headers=headers)
            except DaemonError as e:
                if e.code != "backend_installing":
                    raise
                wait_for_install(self._daemon, self._console)


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
    """Read questions at a C{>} prompt until Ctrl-D or C{/bye}; stream each answer."""
    import readline  # noqa: F401  # gives input() line editing and history

    chat.preload()
    console.print(
        f"Chatting with {chat.model}. Ctrl-C stops an answer; {NEW} starts anew; {LEAVE_HINT}.", markup=False
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
        chat.end_answer(out)
