"""``python -m bench.records``: what recording a request adds to the proxy's work for it, as a ratio.

The proxy relays a streamed answer chunk by chunk into a twisted.web request;
with records on, each request also gets a record made and kept, and each chunk
is appended to it. Both are timed here in one process on the same chunks: a
20-event chat stream, as llama-server writes it. Parsing waits until a record
is read, so it is timed apart (it is never on the request's path).
"""

from __future__ import annotations

import json
import time
import timeit

from twisted.web.http_headers import Headers
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from mrunner.api.observe.records import Records, record_key

EVENTS = 20
ROUNDS = 5000
BODY = json.dumps(
    {"model": "ai/smollm2", "messages": [{"role": "user", "content": "hello " * 20}], "stream": True}
).encode()
HEADERS = Headers(
    {
        b"content-type": [b"application/json"],
        b"authorization": [b"Bearer sk-x"],
        b"user-agent": [b"OpenAI/Python 1.0"],
        b"accept": [b"*/*"],
    }
)
CHUNK = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" word"}}],"created":1,'
    b'"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"}\n\n'
)


def relay() -> None:
    """What the proxy does for one answer anyway: headers, then each chunk into the client's request."""
    request = Request(DummyChannel(), False)
    request.method = b"POST"
    request.clientproto = b"HTTP/1.1"
    request.setResponseCode(200)
    request.setHeader(b"content-type", b"text/event-stream")
    for _ in range(EVENTS):
        request.write(CHUNK)
    request.finish()


def record(records: Records) -> None:
    """What records add for one answer: a record made, every chunk appended, the record kept."""
    kept = records.start(
        record_key("ai/smollm2"), "completion", b"POST", b"/v1/chat/completions", HEADERS, BODY
    )
    kept.queued = kept.started
    kept.start(chunked=False)
    for _ in range(EVENTS):
        kept.write(CHUNK)
    records.end(kept, 200, completed=True)


def main() -> None:
    records = Records(50, 32 * 1024 * 1024, 256 * 1024, time.time)
    relayed = min(timeit.repeat(relay, number=ROUNDS, repeat=5)) / ROUNDS
    recorded = min(timeit.repeat(lambda: record(records), number=ROUNDS, repeat=5)) / ROUNDS
    (newest,) = records.recent(None, 1)
    read = min(timeit.repeat(newest.to_json, number=ROUNDS // 10, repeat=5)) / (ROUNDS // 10)
    print(f"relay of a {EVENTS}-event stream into twisted.web: {relayed * 1e6:.1f} us")
    print(
        f"recording it:                                 {recorded * 1e6:.1f} us"
        f" ({recorded / relayed:.1%} of the relay)"
    )
    print(f"reading the record (parse, reassemble):       {read * 1e6:.1f} us (when read, not per request)")


if __name__ == "__main__":
    main()
