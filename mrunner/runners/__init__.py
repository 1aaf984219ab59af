"""A runner: its process, its one machine, its record, its HTTP client and its metrics, one module a job.

- L{process}: its child process (started by the scheduler with the backend's command line), its log;
- L{lifecycle}: its machine, every stage, input, output and timer in one table;
- L{runner}: the machine's core, L{runner.Runner}: the outputs, and the views the loader reads;
- L{request}: what a runner is started for (L{request.LoadRequest});
- L{metrics}: its own Prometheus metrics, read when the daemon's are.

And everything that talks to a runner over its UNIX socket:

- L{wire}: a runner's HTTP/1.1 on the wire (the answer's head, where a chunked body ends, the request);
- L{fastio}: the I/O that reaches into Twisted's private attributes for speed (pinned by a test);
- L{connection}: one keep-alive connection, a request at a time, its answer's body handed on as it comes;
- L{pool}: the connections, by socket path, and the sending of requests over them;
- L{answer}: a runner's answer once its head is in, read whole, as events, or relayed;
- L{relay}: the one relay of an answer's body to a client, with backpressure and the API's mid-stream error;
- L{forwarder}: forwarding a client's request as it came (twisted.web's C{ReverseProxyResource}'s role);
- L{checks}: mrunner's own GETs (C{/health} while a runner loads, C{/metrics} scrapes).

Nothing here knows the API layer (an API's error shape comes in as a parameter) or scheduling (the
loader drives a runner by its machine's inputs).
"""
