/* A stand-in llama-server for the "fast runner" scenario (bench/fastrunner.py): no Python per event.
 *
 * runner SOCKET EVENTS INTERVAL_S: listens on the UNIX socket SOCKET, answers GET /health with 200
 * and any POST with a chunked server-sent event stream of EVENTS OpenAI-shaped chunks (the body's
 * "max_tokens" overrides it), one each INTERVAL_S, one chunk each as llama-server writes them, then
 * a usage chunk, "[DONE]" and the chunked body's end. Each chunk is one send, and the end two,
 * "0\r\n" then "\r\n", as the pinned llama-server (cpp-httplib) sends them (strace of a stream:
 * sendto "e\r\ndata: [DONE]\n\n\r\n", sendto "0\r\n", sendto "\r\n"): a relay that passed the end on
 * as it came kept clients waiting for it (issue 48), so the stand-in must cut it where the runner
 * does. Keep-alive; one epoll loop; a stream whose client does not take its bytes waits (its next
 * event is sent once the socket drains; what is queued behind then goes in one send).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 65536
#define IN_SIZE 65536
#define OUT_SIZE 4096

typedef struct {
    int open, streaming, events, sent;
    double due;
    size_t in_len, out_len, out_at;
    char in[IN_SIZE];
    char out[OUT_SIZE];
} Conn;

static Conn *conns[MAX_CONNS];
static int epfd, default_events;
static double interval;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void drop(int fd) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    conns[fd]->open = 0;
}

/* Send what is queued; 0 when all of it went, 1 when the socket is full, -1 when it is gone. */
static int flush(int fd) {
    Conn *c = conns[fd];
    while (c->out_at < c->out_len) {
        ssize_t n = send(fd, c->out + c->out_at, c->out_len - c->out_at, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN) {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.fd = fd};
                epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev);
                return 1;
            }
            drop(fd);
            return -1;
        }
        c->out_at += n;
    }
    c->out_len = c->out_at = 0;
    return 0;
}

static void queue(Conn *c, const char *data, size_t len) {
    if (c->out_len + len <= OUT_SIZE) {
        memcpy(c->out + c->out_len, data, len);
        c->out_len += len;
    }
}

static void chunk(Conn *c, const char *data) {
    char head[16];
    size_t len = strlen(data);
    queue(c, head, snprintf(head, sizeof head, "%zx\r\n", len));
    queue(c, data, len);
    queue(c, "\r\n", 2);
}

static void event(int fd) {
    Conn *c = conns[fd];
    char data[512];
    if (c->sent < c->events) {
        snprintf(data, sizeof data,
                 "data: {\"id\":\"chatcmpl-fast\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                 "\"model\":\"fast\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok%d\"},"
                 "\"finish_reason\":null}]}\n\n",
                 c->sent);
        chunk(c, data);
        c->sent++;
        c->due += interval;
    } else {
        snprintf(data, sizeof data,
                 "data: {\"id\":\"chatcmpl-fast\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                 "\"model\":\"fast\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d,"
                 "\"total_tokens\":%d}}\n\n",
                 c->sent, c->sent + 10);
        c->streaming = 0;
        chunk(c, data);
        if (flush(fd) < 0) return;
        chunk(c, "data: [DONE]\n\n");
        if (flush(fd) < 0) return;
        queue(c, "0\r\n", 3);
        if (flush(fd) < 0) return;
        queue(c, "\r\n", 2);
    }
    flush(fd);
}

/* Answer every whole request in the connection's input; 0 when it needs more bytes. */
static void serve(int fd) {
    Conn *c = conns[fd];
    while (c->open && !c->streaming) {
        char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
        if (end == NULL) return;
        size_t head = end + 4 - c->in, body = 0;
        char *length = strcasestr(c->in, "\ncontent-length:");
        if (length != NULL && length < end) body = strtoul(length + 16, NULL, 10);
        if (c->in_len < head + body) return;
        if (strncmp(c->in, "GET /health", 11) == 0) {
            const char *ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"
                             "{\"status\":\"ok\"}";
            queue(c, ok, strlen(ok));
        } else {
            char *tokens = memmem(c->in + head, body, "\"max_tokens\":", 13);
            c->events = tokens != NULL ? atoi(tokens + 13) : default_events;
            c->sent = 0;
            c->streaming = 1;
            c->due = now();
            const char *ok = "HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
                             "X-Accel-Buffering: no\r\nContent-Type: text/event-stream\r\n"
                             "Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n";
            queue(c, ok, strlen(ok));
        }
        memmove(c->in, c->in + head + body, c->in_len - head - body);
        c->in_len -= head + body;
        if (flush(fd) < 0) return;
    }
}

static void readable(int fd) {
    Conn *c = conns[fd];
    ssize_t n = recv(fd, c->in + c->in_len, IN_SIZE - 1 - c->in_len, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN)) {
        drop(fd);
        return;
    }
    if (n > 0) c->in_len += n;
    c->in[c->in_len] = 0;
    serve(fd);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SOCKET EVENTS INTERVAL_S\n", argv[0]);
        return 2;
    }
    default_events = atoi(argv[2]);
    interval = atof(argv[3]);
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, argv[1], sizeof address.sun_path - 1);
    unlink(argv[1]);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) < 0 || listen(listener, 4096) < 0) {
        perror("listen");
        return 1;
    }
    epfd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = listener}, events[256];
    epoll_ctl(epfd, EPOLL_CTL_ADD, listener, &ev);
    int highest = listener;
    for (;;) {
        double soonest = -1, t = now();
        for (int fd = 0; fd <= highest; fd++) {
            Conn *c = conns[fd];
            if (c == NULL || !c->open || !c->streaming || c->out_len) continue;
            if (c->due <= t) event(fd);
            if (c->open && c->streaming && (soonest < 0 || c->due < soonest)) soonest = c->due;
        }
        int wait = soonest < 0 ? 1000 : (int)((soonest - now()) * 1000 + 0.999);
        int ready = epoll_wait(epfd, events, 256, wait < 0 ? 0 : wait);
        for (int i = 0; i < ready; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int client;
                while ((client = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (client >= MAX_CONNS) {
                        close(client);
                        continue;
                    }
                    if (conns[client] == NULL) conns[client] = malloc(sizeof(Conn));
                    memset(conns[client], 0, offsetof(Conn, in));
                    conns[client]->open = 1;
                    if (client > highest) highest = client;
                    struct epoll_event in = {.events = EPOLLIN, .data.fd = client};
                    epoll_ctl(epfd, EPOLL_CTL_ADD, client, &in);
                }
                continue;
            }
            Conn *c = conns[fd];
            if (c == NULL || !c->open) continue;
            if (events[i].events & EPOLLOUT) {
                if (flush(fd) != 0) continue;
                struct epoll_event in = {.events = EPOLLIN, .data.fd = fd};
                epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &in);
                if (!c->streaming) serve(fd);
            }
            if (c->open && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) readable(fd);
        }
    }
}
