/* The fast relay's loop in C: moves chunked answers from runners' sockets to clients' with no
 * Python per event.
 *
 * mrunner/proxy/cmover.py builds this with the system's C compiler on first use and calls it
 * through ctypes, which releases the GIL for each call. The loop runs on a thread of its own
 * (mover_start), which never takes the GIL: it waits in epoll over every moved stream, and for each
 * readable runner socket recv()s, reads the chunk-size lines (as ChunkedEnd in wire.py does, so
 * the body's end is found at the same byte), send()s to the client and keeps what it sent aside
 * for the observers. A Python thread sits in mover_wait for the streams Python must look at: a
 * first or a full batch kept aside, or a stream handed back (the body's end, the runner's close,
 * a malformed line, a read that leaves bytes to hold, the client's leaving or full socket). A
 * property test holds it to the Twisted relay byte for byte.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_SIZE 65536
#define BATCH 65536
#define MALFORMED (-2)
#define HOLD (-3)

enum { FREE, ACTIVE, HANDED };

struct stream {
    int state;
    uint32_t gen;
    int runner, client;
    /* ChunkedEnd's state: data (and CRLF) still to skip. A cut size line or a begun end is never
     * kept here: that read goes to the reactor (HOLD). */
    int64_t skip;
    /* What was sent and not yet shown to the observers. */
    char *aside;
    size_t aside_len, aside_cap;
    int shown, noted;
    /* Handed back: the last read, and which of it is pending, after the end, or unparsed. */
    char *held;
    size_t held_len, pending_from, pending_to, extra_from;
    int ended, raw;
};

/* What Python takes of a stream: buffers it then owns (to give to mover_free). */
struct collected {
    char *aside;
    size_t aside_len;
    char *held;
    size_t held_len, pending_from, pending_to, extra_from;
    int ended, raw;
    int64_t skip;
};

struct mover {
    int epoll;
    pthread_mutex_t lock;
    pthread_cond_t noted; /* notes were added, for mover_wait */
    struct stream **streams;
    size_t count, capacity;
    uint64_t *notes;
    size_t notes_len, notes_cap;
    char buffer[READ_SIZE];
};

static uint64_t key_of(struct mover *m, size_t slot) {
    return ((uint64_t)m->streams[slot]->gen << 32) | slot;
}

static struct stream *lookup(struct mover *m, uint64_t key) {
    size_t slot = key & 0xffffffffu;
    if (slot >= m->count || m->streams[slot]->gen != (uint32_t)(key >> 32)) return NULL;
    return m->streams[slot];
}

/* Room for needed bytes, with half as much again to spare: a slow stream keeps its few events aside
 * until the stream ends, a thousand of them at once, so no larger first size. */
static int grow(char **buffer, size_t *capacity, size_t needed) {
    if (needed <= *capacity) return 0;
    size_t size = *capacity + *capacity / 2;
    if (size < needed) size = needed;
    char *bigger = realloc(*buffer, size);
    if (!bigger) return -1;
    *buffer = bigger;
    *capacity = size;
    return 0;
}

static void note(struct mover *m, size_t slot) {
    struct stream *s = m->streams[slot];
    if (s->noted) return;
    if (m->notes_len == m->notes_cap) {
        size_t size = m->notes_cap ? m->notes_cap * 2 : 64;
        uint64_t *bigger = realloc(m->notes, size * sizeof(uint64_t));
        if (!bigger) return; /* noted again at its next event */
        m->notes = bigger;
        m->notes_cap = size;
    }
    s->noted = 1;
    m->notes[m->notes_len++] = key_of(m, slot);
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ChunkedEnd.feed: where in data the body ended, -1 not yet, HOLD (a size line cut, or the end
 * begun and not whole: ChunkedEnd.held), MALFORMED (also for a size too big for C, which Python
 * then reads itself); the caller restores the state after HOLD or MALFORMED. */
static long feed(struct stream *s, const char *buf, size_t len) {
    int64_t skip = s->skip;
    if (skip >= (int64_t)len) {
        s->skip = skip - (int64_t)len;
        return -1;
    }
    size_t pos = 0;
    int trailer = 0;
    for (;;) {
        if (skip) {
            int64_t taken = skip < (int64_t)(len - pos) ? skip : (int64_t)(len - pos);
            pos += (size_t)taken;
            skip -= taken;
            if (skip) {
                s->skip = skip;
                return -1;
            }
            if (pos == len) {
                s->skip = 0;
                return -1;
            }
        }
        const char *crlf = memmem(buf + pos, len - pos, "\r\n", 2);
        if (!crlf) return HOLD;
        size_t a = pos, b = (size_t)(crlf - buf);
        pos = b + 2;
        if (trailer) {
            if (a == b) return (long)pos;
            continue;
        }
        const char *semicolon = memchr(buf + a, ';', b - a);
        if (semicolon) b = (size_t)(semicolon - buf);
        while (a < b && is_space(buf[a])) a++;
        while (b > a && is_space(buf[b - 1])) b--;
        if (a == b || b - a > 14) return MALFORMED;
        int64_t size = 0;
        for (size_t i = a; i < b; i++) {
            int digit = hex_value(buf[i]);
            if (digit < 0) return MALFORMED;
            size = size * 16 + digit;
        }
        skip = size + 2;
        if (skip == 2) {
            trailer = 1;
            skip = 0;
        }
    }
}

static void stop(struct mover *m, struct stream *s) {
    epoll_ctl(m->epoll, EPOLL_CTL_DEL, s->runner, NULL);
    epoll_ctl(m->epoll, EPOLL_CTL_DEL, s->client, NULL);
    close(s->runner);
    close(s->client);
}

static void hand_back(struct mover *m, size_t slot, const char *data, size_t n) {
    struct stream *s = m->streams[slot];
    stop(m, s);
    s->state = HANDED;
    if (n && (s->held = malloc(n)) != NULL) {
        memcpy(s->held, data, n);
        s->held_len = n;
    }
    note(m, slot);
}

static void aside(struct mover *m, size_t slot, const char *data, size_t n) {
    struct stream *s = m->streams[slot];
    if (grow(&s->aside, &s->aside_cap, s->aside_len + n) == 0) {
        memcpy(s->aside + s->aside_len, data, n);
        s->aside_len += n;
    }
    if (!s->shown || s->aside_len >= BATCH) {
        s->shown = 1;
        note(m, slot);
    }
}

static void move(struct mover *m, size_t slot) {
    struct stream *s = m->streams[slot];
    char *data = m->buffer;
    ssize_t got = recv(s->runner, data, READ_SIZE, 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (got <= 0) { /* closed or failed: the reactor's own read will see it */
        hand_back(m, slot, NULL, 0);
        return;
    }
    size_t n = (size_t)got;
    int64_t skip = s->skip;
    long end = feed(s, data, n);
    /* Malformed, or a read that leaves bytes to hold: the reactor reads it, and sends the end whole. */
    if (end == MALFORMED || end == HOLD) {
        s->skip = skip;
        s->raw = 1;
        hand_back(m, slot, data, n);
        return;
    }
    if (end >= 0) { /* the body's last bytes go out from the reactor, as with the Twisted relay */
        s->ended = 1;
        s->pending_to = s->extra_from = (size_t)end;
        hand_back(m, slot, data, n);
        return;
    }
    ssize_t sent = send(s->client, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) sent = 0; /* full, or gone: Twisted writes it, and sees which */
    if (sent) aside(m, slot, data, (size_t)sent);
    if ((size_t)sent < n) {
        s->pending_from = (size_t)sent;
        s->pending_to = s->extra_from = n;
        hand_back(m, slot, data, n);
    }
}

struct mover *mover_new(void) {
    struct mover *m = calloc(1, sizeof(struct mover));
    if (!m) return NULL;
    m->epoll = epoll_create1(EPOLL_CLOEXEC);
    if (m->epoll < 0) {
        free(m);
        return NULL;
    }
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->noted, NULL);
    return m;
}

static int64_t free_slot(struct mover *m) {
    for (size_t slot = 0; slot < m->count; slot++)
        if (m->streams[slot]->state == FREE) return (int64_t)slot;
    if (m->count == m->capacity) {
        size_t size = m->capacity ? m->capacity * 2 : 64;
        struct stream **bigger = realloc(m->streams, size * sizeof(struct stream *));
        if (!bigger) return -1;
        m->streams = bigger;
        m->capacity = size;
    }
    struct stream *s = calloc(1, sizeof(struct stream));
    if (!s) return -1;
    m->streams[m->count] = s;
    return (int64_t)m->count++;
}

/* Move runner and client (descriptors the mover then owns), from ChunkedEnd's state between size
 * lines (C{skip}: data and CRLF still to come); its key, or -1 with errno set (the descriptors are
 * then still the caller's). */
int64_t mover_add(struct mover *m, int runner, int client, int64_t skip) {
    pthread_mutex_lock(&m->lock);
    int64_t slot = free_slot(m);
    if (slot < 0) {
        pthread_mutex_unlock(&m->lock);
        errno = ENOMEM;
        return -1;
    }
    struct stream *s = m->streams[slot];
    uint32_t gen = (s->gen + 1) & 0x3fffffff;
    memset(s, 0, sizeof(*s));
    s->gen = gen;
    s->runner = runner;
    s->client = client;
    s->skip = skip;
    uint64_t key = key_of(m, (size_t)slot);
    struct epoll_event on_client = {.events = EPOLLRDHUP, .data.u64 = key * 2 + 1};
    struct epoll_event on_runner = {.events = EPOLLIN, .data.u64 = key * 2};
    if (epoll_ctl(m->epoll, EPOLL_CTL_ADD, client, &on_client) < 0) {
        pthread_mutex_unlock(&m->lock);
        return -1;
    }
    if (epoll_ctl(m->epoll, EPOLL_CTL_ADD, runner, &on_runner) < 0) {
        int error = errno;
        epoll_ctl(m->epoll, EPOLL_CTL_DEL, client, NULL);
        pthread_mutex_unlock(&m->lock);
        errno = error;
        return -1;
    }
    s->state = ACTIVE;
    pthread_mutex_unlock(&m->lock);
    return (int64_t)key;
}

static size_t take_notes(struct mover *m, uint64_t *out, size_t most) {
    size_t taken = m->notes_len < most ? m->notes_len : most;
    for (size_t i = 0; i < taken; i++) {
        out[i] = m->notes[i];
        struct stream *s = lookup(m, out[i]);
        if (s) s->noted = 0;
    }
    memmove(m->notes, m->notes + taken, (m->notes_len - taken) * sizeof(uint64_t));
    m->notes_len -= taken;
    return taken;
}

/* The loop, on a thread of its own that never takes the GIL: a stream moves on while Python is busy. */
static void *loop(void *arg) {
    struct mover *m = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the reactor's, on the main thread */
    struct epoll_event events[256];
    for (;;) {
        int ready = epoll_wait(m->epoll, events, 256, -1);
        if (ready < 0) continue; /* EINTR: nothing else can fail on an epoll this owns */
        pthread_mutex_lock(&m->lock);
        for (int i = 0; i < ready; i++) {
            struct stream *s = lookup(m, events[i].data.u64 / 2);
            if (!s || s->state != ACTIVE) continue; /* taken back since the wait */
            size_t slot = (events[i].data.u64 / 2) & 0xffffffffu;
            if (!(events[i].data.u64 & 1))
                move(m, slot);
            else if (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                hand_back(m, slot, NULL, 0);
        }
        if (m->notes_len) pthread_cond_signal(&m->noted);
        pthread_mutex_unlock(&m->lock);
    }
    return NULL;
}

/* Start the loop's thread; 0, or an errno. */
int mover_start(struct mover *m) {
    pthread_t thread;
    int error = pthread_create(&thread, NULL, loop, m);
    if (!error) pthread_detach(thread);
    return error;
}

/* Wait until some streams need Python: their keys in out (at most most). */
int mover_wait(struct mover *m, uint64_t *out, int most) {
    pthread_mutex_lock(&m->lock);
    while (!m->notes_len) pthread_cond_wait(&m->noted, &m->lock);
    size_t taken = take_notes(m, out, (size_t)most);
    pthread_mutex_unlock(&m->lock);
    return (int)taken;
}

static void give(struct stream *s, struct collected *out) {
    memset(out, 0, sizeof(*out));
    out->aside = s->aside;
    out->aside_len = s->aside_len;
    s->aside = NULL;
    s->aside_len = s->aside_cap = 0;
    out->skip = s->skip;
}

static void give_all(struct stream *s, struct collected *out) {
    give(s, out);
    out->held = s->held;
    out->held_len = s->held_len;
    out->pending_from = s->pending_from;
    out->pending_to = s->pending_to;
    out->extra_from = s->extra_from;
    out->ended = s->ended;
    out->raw = s->raw;
    s->held = NULL;
    s->state = FREE;
}

/* What a noted stream has for Python: 1 handed back (all of it given, its slot free), 0 still
 * moved (what was kept aside given), -1 no such stream. */
int mover_collect(struct mover *m, uint64_t key, struct collected *out) {
    pthread_mutex_lock(&m->lock);
    struct stream *s = lookup(m, key);
    int result = -1;
    if (s && s->state == HANDED) {
        give_all(s, out);
        result = 1;
    } else if (s && s->state == ACTIVE) {
        give(s, out);
        result = 0;
    }
    pthread_mutex_unlock(&m->lock);
    return result;
}

/* Take a stream back (the reactor acts on it): 1 stopped here (all given, its slot free), 0 it was
 * handed back already (mover_wait notes it), -1 no such stream. */
int mover_stop(struct mover *m, uint64_t key, struct collected *out) {
    pthread_mutex_lock(&m->lock);
    struct stream *s = lookup(m, key);
    int result = -1;
    if (s && s->state == ACTIVE) {
        stop(m, s);
        give_all(s, out);
        result = 1;
    } else if (s && s->state == HANDED) {
        result = 0;
    }
    pthread_mutex_unlock(&m->lock);
    return result;
}

void mover_free(void *buffer) { free(buffer); }
