"""A stand-in inference server for tests: a real process that speaks llama-server's HTTP on a UNIX socket.

Run as ``python runner_program.py --socket S --alias NAME [--health-delay SECONDS]
[--exit-at-start] [--starts FILE] [--events FILE] [--requests FILE] [--gate PREFIX]
[--close-after-answer] [--context WORDS]``:
--starts gets a line per process start, --events "finished" or "cancelled" per stream,
--requests each POST body as a JSON line; --gate is the default gate of every stream;
--close-after-answer reads nothing more on a connection once an answer ends, and closes it
a moment later, though the answer announced keep-alive (as llama-server does after streams);
--context refuses a request whose messages hold more words, with llama-server's 400, and
ends a stream whose words fill it with finish_reason "length", as llama-server does when
its context fills mid-answer; a stream asked for usage (stream_options.include_usage) ends
with a chunk that has it.
A request may carry ``"test": {"events": N, "interval": SECONDS, "gate": PREFIX,
"crash_after": K, "refuse": STATUS}`` in its JSON body: stream N
events, before event i wait until the file PREFIX<i> exists, exit the process after
K events; or answer STATUS with an OpenAI-shaped error.
"""

import argparse
import json
import os
import sys
import time

from twisted.internet import reactor
from twisted.web import resource, server


class Runner(resource.Resource):
    isLeaf = True

    def __init__(self, options):
        super().__init__()
        self.options = options
        self.ready_at = time.monotonic() + options.health_delay

    def record(self, event):
        if self.options.events:
            with open(self.options.events, "a") as f:
                f.write(f"{event}\n")

    def render(self, request):
        if self.options.close_after_answer:
            request.notifyFinish().addBoth(self.hang_up, request.channel.transport)
        return super().render(request)

    def hang_up(self, _, transport):
        transport.pauseProducing()
        reactor.callLater(0.02, transport.loseConnection)

    def render_GET(self, request):
        if request.path == b"/health":
            ready = time.monotonic() >= self.ready_at
            request.setResponseCode(200 if ready else 503)
            return json.dumps({"status": "ok" if ready else "loading model"}).encode()
        request.setResponseCode(404)
        return b'{"error": "not found"}'

    def render_POST(self, request):
        body = json.loads(request.content.read() or b"{}")
        if self.options.requests:
            with open(self.options.requests, "a") as f:
                f.write(json.dumps(body) + "\n")
        control = body.pop("test", {}) or {}
        request.setHeader(b"content-type", b"application/json")
        words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])
        if self.options.context and words >= self.options.context:
            request.setResponseCode(400)
            return json.dumps({"error": too_long(words, self.options.context)}).encode()
        if "refuse" in control:
            request.setResponseCode(control["refuse"])
            error = {"code": control["refuse"], "message": "told to refuse", "type": "invalid_request_error"}
            return json.dumps({"error": error}).encode()
        if body.get("stream"):
            request.setHeader(b"content-type", b"text/event-stream")
            self.stream(request, body, control, words)
            return server.NOT_DONE_YET
        answer = {
            b"/v1/chat/completions": chat,
            b"/v1/completions": completion,
            b"/v1/embeddings": embeddings,
            b"/v1/rerank": rerank,
        }.get(request.path)
        if answer is None:
            request.setResponseCode(404)
            return b'{"error": "not found"}'
        return json.dumps(answer(self.options.alias, body)).encode()

    def stream(self, request, body, control, words):
        events = control.get("events", 3)
        room = self.options.context - words if self.options.context else events
        # As llama-server: stop at max_tokens, or when the context is full.
        limit = min(room, body.get("max_tokens") or events)
        cut = limit < events
        events = min(events, limit)
        gate = control.get("gate", self.options.gate)
        crash_after = control.get("crash_after")
        interval = control.get("interval", 0.0)
        sent = 0
        finished = []
        request.notifyFinish().addCallbacks(
            lambda _: self.record("finished"), lambda _: self.record("cancelled")
        ).addBoth(finished.append)

        def step():
            nonlocal sent
            if finished:
                return
            if crash_after is not None and sent >= crash_after:
                reactor.callLater(0.1, os._exit, 3)  # after what was written is flushed
                return
            if sent == events:
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"prompt_tokens": words, "completion_tokens": sent, "total_tokens": words + sent}
                    request.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
                request.write(b"data: [DONE]\n\n")
                end_as_llama_server(request)
                return
            if gate and not os.path.exists(f"{gate}{sent}"):
                reactor.callLater(0.005, step)
                return
            chunk = {
                "object": "chat.completion.chunk",
                "model": self.options.alias,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": f"tok{sent} "},
                        "finish_reason": "length" if cut and sent == events - 1 else None,
                    }
                ],
            }
            request.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            sent += 1
            reactor.callLater(interval, step)

        step()


def end_as_llama_server(request):
    """End a chunked answer as llama-server's HTTP library does: C{0\\r\\n}, then C{\\r\\n}, two writes.

    Apart by a few milliseconds here, so that they reach mrunner in two reads, as they do from a
    loaded llama-server.
    """
    if not request.chunked:
        request.finish()
        return
    request.chunked = False  # the framing is written here
    request.write(b"0\r\n")

    def rest():
        if request.channel is not None:
            request.write(b"\r\n")
            request.finish()

    reactor.callLater(0.01, rest)


def too_long(tokens, context):
    """llama-server's refusal of a request longer than its context, word for word."""
    return {
        "code": 400,
        "message": f"request ({tokens} tokens) exceeds the available context size ({context} tokens),"
        " try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": tokens,
        "n_ctx": context,
    }


def chat(alias, body):
    """Echo the last message; with tools and tool_choice "required", call the first tool instead."""
    last = (body.get("messages") or [{}])[-1].get("content", "")
    message = {"role": "assistant", "content": f"echo: {last}"}
    if body.get("tools") and body.get("tool_choice") == "required":
        call = {"name": body["tools"][0]["function"]["name"], "arguments": '{"city": "Paris"}'}
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
        }
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": alias,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def completion(alias, body):
    return {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": int(time.time()),
        "model": alias,
        "choices": [{"index": 0, "text": f"echo: {body.get('prompt', '')}", "finish_reason": "stop"}],
    }


def embeddings(alias, body):
    inputs = body.get("input", "")
    inputs = inputs if isinstance(inputs, list) else [inputs]
    data = [
        {"object": "embedding", "index": i, "embedding": [float(len(text)), 1.0, 0.0, 0.5]}
        for i, text in enumerate(inputs)
    ]
    return {"object": "list", "data": data, "model": alias, "usage": {"prompt_tokens": 1, "total_tokens": 1}}


def rerank(alias, body):
    documents = body.get("documents", [])
    results = [{"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(len(documents))]
    return {"model": alias, "results": results}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--alias", default="test")
    parser.add_argument("--health-delay", type=float, default=0.0)
    parser.add_argument("--exit-at-start", action="store_true")
    parser.add_argument("--starts")
    parser.add_argument("--events")
    parser.add_argument("--requests")
    parser.add_argument("--gate")
    parser.add_argument("--close-after-answer", action="store_true")
    parser.add_argument("--context", type=int)
    options, _ = parser.parse_known_args()
    if options.starts:
        with open(options.starts, "a") as f:
            f.write(f"{os.getpid()}\n")
    if options.exit_at_start:
        sys.stderr.write("runner_program: told to fail at start\n")
        sys.exit(2)
    reactor.listenUNIX(options.socket, server.Site(Runner(options)))
    reactor.run()


if __name__ == "__main__":
    main()
