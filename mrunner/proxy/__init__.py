"""The HTTP client that talks to runners over their UNIX sockets, and relays their answers to clients.

In the role of twisted.web's C{ReverseProxyResource}, layered from the wire up (no module imports one
above it):

- L{fastio}: the I/O that reaches into Twisted's private attributes for speed (pinned by a test);
- L{wire}: a runner's HTTP/1.1 on the wire (the answer's head, where a chunked body ends, the request);
- L{connection}: one keep-alive connection, a request at a time, its answer's body handed on as it comes;
- L{pool}: the connections, by socket path, and the sending of requests over them;
- L{answer}: a runner's answer once its head is in, read whole, as events, or relayed;
- L{relay}: the one relay of an answer's body to a client, with backpressure and the API's mid-stream error;
- L{fastrelay}, L{cmover} (C{mover.c}): the fast path, a loop in C that moves a stream's bytes;
- L{rename}: an answer that names the model as the client asked it;
- L{forwarder}: forwarding a client's request to its runner, and its answer back.

A runner's life is L{mrunner.runners}; the two never import each other.
"""
