/* The load of the "fast runner" scenario (bench/fastrunner.py): N streams at once, no Python per event.
 *
 * load TARGET STREAMS RAMP_S WINDOW_S REQUEST_FILE: TARGET is unix:PATH or tcp:HOST:PORT. Opens STREAMS
 * connections spread over RAMP_S, sends each the request in REQUEST_FILE (a whole HTTP/1.1 request),
 * and reads the answers. Prints "window" once the ramp is over and every stream has had its first
 * event (so the requests' own cost, which scenarios 1 and 6 measure, is not in the window), and
 * "end" WINDOW_S later (the bench reads the proxy's CPU at both), then waits for every stream and
 * prints one JSON line: the events seen in the window, the streams that ended with [DONE] or not,
 * the p99 gap between events, and for scenario 13 (bench/realstreams.py) the events of the whole
 * run, its seconds from the first connect to the last end, and the slowest stream's seconds from
 * its connect to its end (a stream is over when its body's end has come, not at the close).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd, done, failed, ok_status, answered, connecting;
    double last, began, ended;
    size_t tail_len;
    char tail[16];
} Stream;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static char *target;

static int open_stream(void) {
    if (strncmp(target, "unix:", 5) == 0) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        strncpy(a.sun_path, target + 5, sizeof a.sun_path - 1);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        return connect(fd, (struct sockaddr *)&a, sizeof a) == 0 ? fd : -1;
    }
    char host[64];
    int port;
    sscanf(target + 4, "%63[^:]:%d", host, &port);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);  /* a full backlog must not stall the load */
    return connect(fd, (struct sockaddr *)&a, sizeof a) == 0 || errno == EINPROGRESS ? fd : -1;
}

/* Count the occurrences of NEEDLE (under 16 bytes) in the stream, one split across two reads included. */
static int count(Stream *s, const char *data, size_t len, const char *needle) {
    size_t n = strlen(needle);
    char joined[32];
    size_t keep = s->tail_len < n - 1 ? s->tail_len : n - 1, head = len < n - 1 ? len : n - 1;
    memcpy(joined, s->tail + s->tail_len - keep, keep);
    memcpy(joined + keep, data, head);
    int found = memmem(joined, keep + head, needle, n) != NULL;
    for (const char *at = data; (at = memmem(at, len - (at - data), needle, n)) != NULL; at += n) found++;
    return found;
}

/* The stream's last 15 bytes, across reads. */
static void keep_tail(Stream *s, const char *data, size_t len) {
    char joined[15 + 15];
    size_t head = len < 15 ? len : 15;
    memcpy(joined, s->tail, s->tail_len);
    memcpy(joined + s->tail_len, data + len - head, head);
    size_t total = s->tail_len + head;
    s->tail_len = total < 15 ? total : 15;
    memcpy(s->tail, joined + total - s->tail_len, s->tail_len);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s TARGET STREAMS RAMP_S WINDOW_S REQUEST_FILE\n", argv[0]);
        return 2;
    }
    target = argv[1];
    int streams = atoi(argv[2]);
    double ramp = atof(argv[3]), window = atof(argv[4]);
    FILE *file = fopen(argv[5], "rb");
    static char request[65536];
    size_t request_len = fread(request, 1, sizeof request, file);
    fclose(file);
    Stream *all = calloc(streams, sizeof(Stream));
    size_t gaps_cap = 1 << 20, gaps_len = 0;
    double *gaps = malloc(gaps_cap * sizeof(double));
    int epfd = epoll_create1(0), opened = 0, finished = 0, said_window = 0, said_end = 0;
    long events = 0, all_events = 0;
    int first_seen = 0, failed_early = 0; /* streams whose first event came; that failed first */
    double began = now(), window_at = INFINITY, end_at = INFINITY;
    struct epoll_event ready[512];
    static char buffer[65536];
    while (finished < streams) {
        double t = now();
        while (opened < streams && t >= began + ramp * opened / streams) {
            Stream *s = &all[opened];
            s->began = t;
            s->fd = open_stream();
            if (s->fd < 0) {
                s->failed = 1;
                failed_early++;
                finished++;
            } else {
                s->connecting = 1;
                struct epoll_event ev = {.events = EPOLLOUT, .data.u32 = opened};
                epoll_ctl(epfd, EPOLL_CTL_ADD, s->fd, &ev);
            }
            opened++;
        }
        if (window_at == INFINITY && t >= began + ramp && first_seen + failed_early >= streams) {
            window_at = t; /* every stream open and answering: the requests' own cost is behind */
            end_at = t + window;
        }
        if (!said_window && t >= window_at) {
            printf("window\n");
            fflush(stdout);
            said_window = 1;
        }
        if (!said_end && t >= end_at) {
            printf("end\n");
            fflush(stdout);
            said_end = 1;
        }
        int n = epoll_wait(epfd, ready, 512, 1);
        t = now();
        int in_window = t >= window_at && t < end_at;
        for (int i = 0; i < n; i++) {
            Stream *s = &all[ready[i].data.u32];
            if (s->connecting) {
                int error = 0;
                socklen_t size = sizeof error;
                getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &error, &size);
                s->connecting = 0;
                struct epoll_event ev = {.events = EPOLLIN, .data.u32 = ready[i].data.u32};
                if (!error && send(s->fd, request, request_len, MSG_NOSIGNAL) == (ssize_t)request_len &&
                    epoll_ctl(epfd, EPOLL_CTL_MOD, s->fd, &ev) == 0)
                    continue;
                s->failed = 1;
                failed_early++;
                epoll_ctl(epfd, EPOLL_CTL_DEL, s->fd, NULL);
                close(s->fd);
                finished++;
                continue;
            }
            ssize_t got = recv(s->fd, buffer, sizeof buffer, 0);
            if (got > 0) {
                if (!s->answered) s->ok_status = got >= 12 && strncmp(buffer + 9, "200", 3) == 0;
                s->answered = 1;
                int seen = count(s, buffer, got, "data: {");
                if (seen && in_window) {
                    events += seen;
                    if (s->last > 0) {
                        if (gaps_len + seen > gaps_cap) gaps = realloc(gaps, (gaps_cap *= 2) * sizeof(double));
                        gaps[gaps_len++] = t - s->last;
                        for (int k = 1; k < seen; k++) gaps[gaps_len++] = 0;
                    }
                }
                all_events += seen;
                if (seen && s->last == 0) first_seen++;
                if (seen) s->last = t;
                if (count(s, buffer, got, "data: [DONE]")) s->done = 1;
                keep_tail(s, buffer, got);
                /* The body's end, "0\r\n\r\n", closes a stream that said [DONE], in whatever reads it came
                 * (llama-server writes "0\r\n" and "\r\n" apart): read as curl and httpx read it. */
                if (s->done && (s->tail_len < 5 || memcmp(s->tail + s->tail_len - 5, "0\r\n\r\n", 5) != 0))
                    continue;
            }
            if (got > 0 && !s->done) continue;
            if (got < 0 && errno == EAGAIN) continue;
            s->failed = !(s->done && s->ok_status);
            if (s->last == 0) failed_early++;
            s->ended = t;
            epoll_ctl(epfd, EPOLL_CTL_DEL, s->fd, NULL);
            close(s->fd);
            finished++;
        }
    }
    if (!said_end) printf("end\n");
    int failed = 0;
    double slowest = 0, last_end = began;
    for (int i = 0; i < streams; i++) {
        failed += all[i].failed;
        if (all[i].ended - all[i].began > slowest) slowest = all[i].ended - all[i].began;
        if (all[i].ended > last_end) last_end = all[i].ended;
    }
    qsort(gaps, gaps_len, sizeof(double), compare);
    double p99 = gaps_len ? gaps[(size_t)(gaps_len * 0.99)] : 0;
    printf("{\"events\": %ld, \"window_s\": %.3f, \"streams\": %d, \"failed\": %d, \"p99_gap_ms\": %.3f, "
           "\"all_events\": %ld, \"elapsed_s\": %.4f, \"slowest_s\": %.4f}\n",
           events, window, streams, failed, p99 * 1000, all_events, last_end - began, slowest);
    return 0;
}
