/*
 * netplugin-cni, compiled: a CNI plugin that only hands the call to the netplugin daemon.
 *
 * A container runtime execs this for every CNI call, as root, with the call's CNI_* variables and
 * the network config on stdin; both are untrusted input here. It parses no JSON: it sends the
 * CNI_* and NETPLUGIN_* variables and stdin in one frame (the format and every limit come from
 * netplugin_frame.h, generated from netplugin/frontends/wire/protocol.py) over the daemon's unix
 * socket, writes the daemon's stdout and stderr, and exits with the daemon's status.
 *
 * The socket is NETPLUGIN_SOCKET, else the socket slot (NP_SOCKET when built; rewritten when a built
 * binary is installed, see the slots below). When the daemon is absent, answers "unavailable" (U: draining, other settings, use_daemon: never) or cannot be
 * given the call, the fallback runs:
 *   - the fallback slot set (standalone nodes): exec the Python shim at that path with the same
 *     environment and the same stdin (replayed from a memfd);
 *   - the fallback slot empty (cluster mode): CNI error 11 (try again later) as CNI JSON on stdout.
 * A connection lost after the request was sent is CNI error 11 either way: the call may have run.
 *
 * Every read, write, connect and wait is bounded (poll with a deadline); every size is checked
 * against the frame's limits before anything is allocated. libc only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "netplugin_frame.h"

struct answer {
    int code; /* -1 when unavailable */
    const unsigned char *out, *err, *why;
    size_t out_len, err_len, why_len;
};

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/*
 * Parse an answer body (after magic and length). Strict: every field inside the body, known tags,
 * each at most once, X exactly one byte (unless U). Returns 0, or -1 with a reason in *why.
 */
int npf_parse_answer(const unsigned char *body, size_t len, struct answer *a, const char **why) {
    size_t pos = 0;
    int seen_x = 0, seen_o = 0, seen_r = 0, seen_u = 0;
    memset(a, 0, sizeof *a);
    a->code = -1;
    while (pos < len) {
        if (len - pos < NPF_FIELD) {
            *why = "truncated field header";
            return -1;
        }
        unsigned char tag = body[pos];
        size_t n = get_u32(body + pos + 1);
        pos += NPF_FIELD;
        if (n > len - pos) {
            *why = "field runs past the body";
            return -1;
        }
        const unsigned char *v = body + pos;
        pos += n;
        int *seen;
        switch (tag) {
        case NPF_TAG_EXIT:
            seen = &seen_x;
            if (n != 1) {
                *why = "exit status is not one byte";
                return -1;
            }
            a->code = v[0];
            break;
        case NPF_TAG_STDOUT:
            seen = &seen_o;
            a->out = v;
            a->out_len = n;
            break;
        case NPF_TAG_STDERR:
            seen = &seen_r;
            a->err = v;
            a->err_len = n;
            break;
        case NPF_TAG_UNAVAILABLE:
            seen = &seen_u;
            a->why = v;
            a->why_len = n;
            break;
        default:
            *why = "unknown field";
            return -1;
        }
        if ((*seen)++) {
            *why = "field given twice";
            return -1;
        }
    }
    if (seen_u) {
        a->code = -1;
        return 0;
    }
    if (!seen_x) {
        *why = "no exit status";
        return -1;
    }
    return 0;
}

#ifndef NPF_NO_MAIN

#ifndef NP_SOCKET
#define NP_SOCKET "/run/netplugin/netplugin.sock"
#endif
#ifndef NP_FALLBACK
#define NP_FALLBACK ""
#endif
/* The socket and the fallback are fixed when the binary is installed: an image builds it once and
 * every node installs it with its own run dir (netplugin.frontends.cni.native.install_built rewrites
 * these slots). Each slot is its marker, then a NUL-terminated value, NP_SLOT_SIZE bytes in all;
 * build_native defines the markers and the size. Writable and not static, so that no compiler folds
 * the values they had at build time into the code. */
#if !defined(NP_SLOT_SIZE) || !defined(NP_SOCKET_MARK) || !defined(NP_FALLBACK_MARK)
#error "build with netplugin.frontends.cni.native.build_native (it defines the slots' markers and size)"
#endif
_Static_assert(sizeof(NP_SOCKET_MARK NP_SOCKET) <= NP_SLOT_SIZE, "NP_SOCKET does not fit its slot");
_Static_assert(sizeof(NP_FALLBACK_MARK NP_FALLBACK) <= NP_SLOT_SIZE, "NP_FALLBACK does not fit its slot");
char np_socket_slot[NP_SLOT_SIZE] = NP_SOCKET_MARK NP_SOCKET;
char np_fallback_slot[NP_SLOT_SIZE] = NP_FALLBACK_MARK NP_FALLBACK;
/* netplugin's version, fixed at build time (build_native defines it from netplugin.__version__):
 * `netplugin-cni --version` prints it; `netplugin version` reads it after its marker, without
 * running the binary. Runtimes call a CNI plugin with no arguments, so the argument is no CNI call. */
#if !defined(NP_VERSION) || !defined(NP_VERSION_MARK)
#error "build with netplugin.frontends.cni.native.build_native (it defines NP_VERSION and its marker)"
#endif
const char np_version[] = NP_VERSION_MARK NP_VERSION;

/* A slot's value; its last byte is forced to NUL, so a damaged slot still ends inside itself. */
static const char *slot_value(char *slot, size_t mark_len) {
    slot[NP_SLOT_SIZE - 1] = '\0';
    return slot + mark_len;
}
#define NP_SOCKET_SLOT slot_value(np_socket_slot, sizeof NP_SOCKET_MARK - 1)
#define NP_FALLBACK_SLOT slot_value(np_fallback_slot, sizeof NP_FALLBACK_MARK - 1)
/* How long the runtime may take to hand over stdin, and to read what is written to stdout. */
#ifndef NP_IO_TIMEOUT_MS
#define NP_IO_TIMEOUT_MS 10000
#endif
/* The tests' sanitizer build shortens the waits for the daemon; installed builds keep the frame's. */
#ifndef NP_ANSWER_TIMEOUT_MS
#define NP_ANSWER_TIMEOUT_MS NPF_ANSWER_TIMEOUT_MS
#endif
#define NP_MSG_MAX 512

extern char **environ;

struct buf {
    unsigned char *p;
    size_t len, cap;
};


static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left until deadline (0 when past it), clamped for poll(2). */
static int left_ms(int64_t deadline) {
    int64_t left = deadline - now_ms();
    if (left <= 0)
        return 0;
    return left > 60000 ? 60000 : (int)left;
}

/* poll one fd for events until deadline: 1 ready, 0 timed out, -1 error (errno set). */
static int wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int left = left_ms(deadline);
        int r = poll(&p, 1, left);
        if (r > 0)
            return 1;
        if (r == 0) {
            if (left_ms(deadline) == 0)
                return 0;
            continue; /* a clamped slice ended, the deadline has not */
        }
        if (errno != EINTR)
            return -1;
    }
}

static int buf_put(struct buf *b, const void *data, size_t n) {
    if (n > b->cap - b->len)
        return -1;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

static int buf_field(struct buf *b, unsigned char tag, const void *data, size_t n) {
    unsigned char head[NPF_FIELD] = {tag, (unsigned char)(n >> 24), (unsigned char)(n >> 16),
                                     (unsigned char)(n >> 8), (unsigned char)n};
    if (n > UINT32_MAX || buf_put(b, head, sizeof head) != 0)
        return -1;
    return buf_put(b, data, n);
}


/* Write all of data to fd, after poll each time, so no write blocks past the deadline. A socket
 * (to_socket) is written with send(MSG_NOSIGNAL): a daemon that went away is an error, not SIGPIPE.
 * Anything else (stdout, stderr, a pipe to the fallback) PIPE_BUF at a time: a pipe that poll calls
 * writable takes that much without blocking. */
static int write_all(int fd, const unsigned char *data, size_t n, int64_t deadline, int to_socket) {
    while (n > 0) {
        int r = wait_fd(fd, POLLOUT, deadline);
        if (r <= 0)
            return -1;
        ssize_t w = to_socket ? send(fd, data, n, MSG_NOSIGNAL) : write(fd, data, n < 4096 ? n : 4096);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -1;
        }
        data += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Append a JSON string literal of s (ASCII-escaped) to out, bounded by cap. */
static void json_str(char *out, size_t cap, const char *s) {
    size_t o = strlen(out);
    if (o + 2 >= cap)
        return;
    out[o++] = '"';
    for (; *s && o + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o++] = '"';
    out[o] = '\0';
}

/* Print a CNI error document on stdout and exit 1. */
static void cni_fail(int code, const char *msg) {
    char doc[NP_MSG_MAX * 7 + 128];
    snprintf(doc, sizeof doc, "{\"cniVersion\":\"%s\",\"code\":%d,\"msg\":", NPF_CNI_LATEST, code);
    json_str(doc, sizeof doc, msg);
    strncat(doc, "}\n", sizeof doc - strlen(doc) - 1);
    (void)write_all(STDOUT_FILENO, (const unsigned char *)doc, strlen(doc), now_ms() + NP_IO_TIMEOUT_MS, 0);
    exit(1);
}

struct call {
    const char *sock;
    const char *command;
    unsigned char *stdin_data;
    size_t stdin_len;
};

/* Not run by the daemon: exec the Python shim with the same environment and stdin, or fail (11). */
static void fall_back(const struct call *c, const char *why) {
    const char *fallback = NP_FALLBACK_SLOT;
    if (!fallback[0]) {
        char msg[NP_MSG_MAX];
        if (c->command && strcmp(c->command, "VERSION") == 0) {
            char doc[256];
            snprintf(doc, sizeof doc, "{\"cniVersion\":\"%s\",\"supportedVersions\":[%s]}\n", NPF_CNI_LATEST,
                     NPF_CNI_VERSIONS);
            exit(write_all(STDOUT_FILENO, (const unsigned char *)doc, strlen(doc), now_ms() + NP_IO_TIMEOUT_MS, 0)
                     ? 1
                     : 0);
        }
        snprintf(msg, sizeof msg, "the netplugin daemon at %s is required (cluster mode) but unavailable: %s",
                 c->sock, why);
        cni_fail(NPF_E_TRY_AGAIN, msg);
    }
    int fd = memfd_create("netplugin-cni-stdin", MFD_CLOEXEC);
    if (fd < 0 || write_all(fd, c->stdin_data, c->stdin_len, now_ms() + NP_IO_TIMEOUT_MS, 0) != 0 ||
        lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, STDIN_FILENO) != STDIN_FILENO) {
        char msg[NP_MSG_MAX];
        snprintf(msg, sizeof msg, "netplugin-cni: cannot hand stdin to the Python shim %s: %s", fallback,
                 strerror(errno));
        cni_fail(NPF_E_IO, msg);
    }
    close(fd);
    signal(SIGPIPE, SIG_DFL);
    char *argv[] = {(char *)fallback, NULL};
    execve(fallback, argv, environ);
    char msg[NP_MSG_MAX];
    snprintf(msg, sizeof msg, "netplugin-cni: the daemon did not run the call (%s) and the Python shim %s cannot run: %s",
             why, fallback, strerror(errno));
    cni_fail(NPF_E_TRY_AGAIN, msg);
}

/* Read stdin, at most NPF_MAX_STDIN bytes (one past the shim's limit: the parser then says so). */
static void read_stdin(struct call *c) {
    c->stdin_data = malloc(NPF_MAX_STDIN);
    if (!c->stdin_data)
        cni_fail(NPF_E_IO, "netplugin-cni: out of memory for stdin");
    int64_t deadline = now_ms() + NP_IO_TIMEOUT_MS;
    while (c->stdin_len < NPF_MAX_STDIN) {
        int r = wait_fd(STDIN_FILENO, POLLIN, deadline);
        if (r == 0)
            cni_fail(NPF_E_IO, "cannot read stdin: no end of input in time");
        if (r < 0)
            break; /* stdin closed or not open: an empty config, which the parser reports */
        ssize_t n = read(STDIN_FILENO, c->stdin_data + c->stdin_len, NPF_MAX_STDIN - c->stdin_len);
        if (n == 0)
            break;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            char msg[NP_MSG_MAX];
            snprintf(msg, sizeof msg, "cannot read stdin: %s", strerror(errno));
            cni_fail(NPF_E_IO, msg);
        }
        c->stdin_len += (size_t)n;
    }
}

/* The request frame, or NULL with *why. *input is the CNI code of an input the frame cannot carry (too
 * many or too long variables: 5; one without '=': 4), a permanent error of the call, not the daemon's;
 * 0 when the frame could not be built for another reason. */
static unsigned char *build_request(const struct call *c, size_t *len, const char **why, int *input) {
    *input = 0;
    struct buf b = {.cap = NPF_MAX_REQUEST + NPF_HEADER};
    b.p = malloc(b.cap);
    if (!b.p) {
        *why = "out of memory for the request";
        return NULL;
    }
    b.len = NPF_HEADER;
    size_t count = 0;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "CNI_", 4) != 0 && strncmp(*e, "NETPLUGIN_", 10) != 0)
            continue;
        size_t n = strnlen(*e, NPF_MAX_ENV_ENTRY + 1);
        if (++count > NPF_MAX_ENV || n > NPF_MAX_ENV_ENTRY || !memchr(*e, '=', n)) {
            if (n > NPF_MAX_ENV_ENTRY)
                *why = "a CNI_/NETPLUGIN_ variable is too large (longer than the frame allows)";
            else if (count > NPF_MAX_ENV)
                *why = "too many CNI_/NETPLUGIN_ variables (more than the frame allows)";
            else
                *why = "a CNI_/NETPLUGIN_ variable is not NAME=VALUE";
            *input = n <= NPF_MAX_ENV_ENTRY && count <= NPF_MAX_ENV ? NPF_E_INVALID_ENV : NPF_E_IO;
            free(b.p);
            return NULL;
        }
        if (buf_field(&b, NPF_TAG_ENV, *e, n) != 0)
            goto full;
    }
    if (buf_field(&b, NPF_TAG_STDIN, c->stdin_data, c->stdin_len) != 0)
        goto full;
    memcpy(b.p, NPF_MAGIC, NPF_MAGIC_LEN);
    size_t body = b.len - NPF_HEADER;
    unsigned char size[4] = {(unsigned char)(body >> 24), (unsigned char)(body >> 16), (unsigned char)(body >> 8),
                             (unsigned char)body};
    memcpy(b.p + NPF_MAGIC_LEN, size, 4);
    *len = b.len;
    return b.p;
full:
    *why = "the request is larger than the frame allows";
    free(b.p);
    return NULL;
}

/* Connect to the daemon's socket within the connect timeout; the peer must be root or us. */
static int connect_daemon(const char *path, char *why, size_t why_cap) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        snprintf(why, why_cap, "socket path too long");
        return -1;
    }
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int64_t deadline = now_ms() + NPF_CONNECT_TIMEOUT_MS;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            snprintf(why, why_cap, "%s", strerror(errno));
            return -1;
        }
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
            struct ucred cred;
            socklen_t clen = sizeof cred;
            if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
                snprintf(why, why_cap, "%s", strerror(errno));
            } else if (cred.uid != 0 && cred.uid != geteuid()) {
                snprintf(why, why_cap, "the socket is served by uid %u, not by root", (unsigned)cred.uid);
            } else {
                return fd;
            }
            close(fd);
            return -1;
        }
        int err = errno;
        close(fd);
        /* A unix socket's connect fails at once with EAGAIN when the listen backlog is full. */
        if ((err != EAGAIN && err != EINTR) || left_ms(deadline) == 0) {
            snprintf(why, why_cap, "%s", err == EAGAIN ? "its backlog stayed full" : strerror(err));
            return -1;
        }
        struct timespec pause = {.tv_nsec = 5 * 1000000};
        nanosleep(&pause, NULL);
    }
}

/* Read exactly n bytes: 0, or -1 with *why ("closed", "timed out", errno text). */
static int recv_all(int fd, unsigned char *into, size_t n, int64_t deadline, const char **why) {
    while (n > 0) {
        int r = wait_fd(fd, POLLIN, deadline);
        if (r == 0) {
            *why = "timeout";
            return -1;
        }
        if (r < 0) {
            *why = strerror(errno);
            return -1;
        }
        ssize_t got = recv(fd, into, n, 0);
        if (got == 0) {
            *why = "it closed the connection";
            return -1;
        }
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            *why = strerror(errno);
            return -1;
        }
        into += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Lost after sending: the call may have run, so CNI error 11 (the runtime retries), never a fallback. */
static void lost(const struct call *c, const char *what) {
    char msg[NP_MSG_MAX];
    snprintf(msg, sizeof msg, "netplugin daemon at %s: %s", c->sock, what);
    cni_fail(NPF_E_TRY_AGAIN, msg);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("netplugin-cni %s\n", np_version + sizeof NP_VERSION_MARK - 1);
        return fflush(stdout) == 0 ? 0 : NPF_E_IO;
    }
    struct call c = {0};
    signal(SIGPIPE, SIG_IGN);
    c.command = getenv("CNI_COMMAND");
    const char *env_sock = getenv("NETPLUGIN_SOCKET");
    c.sock = env_sock && env_sock[0] ? env_sock : NP_SOCKET_SLOT;
    read_stdin(&c);

    const char *mode = getenv("NETPLUGIN_USE_DAEMON");
    if (mode && strcmp(mode, "never") == 0 && NP_FALLBACK_SLOT[0])
        fall_back(&c, "NETPLUGIN_USE_DAEMON is never");
    const char *why = NULL;
    size_t req_len = 0;
    int input = 0;
    unsigned char *req = build_request(&c, &req_len, &why, &input);
    if (!req && input) {
        char imsg[NP_MSG_MAX];
        snprintf(imsg, sizeof imsg, "netplugin-cni: %s", why);
        cni_fail(input, imsg);
    }
    if (!req)
        fall_back(&c, why);
    char cwhy[NP_MSG_MAX];
    int fd = connect_daemon(c.sock, cwhy, sizeof cwhy);
    if (fd < 0)
        fall_back(&c, cwhy);
    int gc = c.command && strcmp(c.command, "GC") == 0;
    int64_t deadline = now_ms() + (gc ? NPF_GC_TIMEOUT_MS : NP_ANSWER_TIMEOUT_MS);
    if (write_all(fd, req, req_len, deadline, 1) != 0) {
        /* The daemon acts on whole frames only: a frame it did not get whole was not run. */
        snprintf(cwhy, sizeof cwhy, "cannot send the request: %s", strerror(errno));
        fall_back(&c, cwhy);
    }
    free(req);
    shutdown(fd, SHUT_WR);

    unsigned char head[NPF_HEADER];
    char msg[NP_MSG_MAX];
    if (recv_all(fd, head, sizeof head, deadline, &why) != 0) {
        if (strcmp(why, "timeout") == 0)
            snprintf(msg, sizeof msg, "no answer to cni after %ds; the operation may still be running",
                     (gc ? NPF_GC_TIMEOUT_MS : NP_ANSWER_TIMEOUT_MS) / 1000);
        else
            snprintf(msg, sizeof msg, "%s while it ran cni, before answering; the operation may or may not have run",
                     why);
        lost(&c, msg);
    }
    if (memcmp(head, NPF_MAGIC, NPF_MAGIC_LEN) != 0)
        lost(&c, "answer is not a netplugin frame");
    size_t body_len = get_u32(head + NPF_MAGIC_LEN);
    if (body_len > NPF_MAX_ANSWER)
        lost(&c, "answer too long");
    unsigned char *body = malloc(body_len ? body_len : 1);
    if (!body)
        lost(&c, "out of memory for the answer");
    if (recv_all(fd, body, body_len, deadline, &why) != 0) {
        snprintf(msg, sizeof msg, "%s in the middle of its answer; the operation may or may not have run",
                 strcmp(why, "timeout") == 0 ? "no more bytes" : why);
        lost(&c, msg);
    }
    close(fd);
    struct answer a;
    if (npf_parse_answer(body, body_len, &a, &why) != 0) {
        snprintf(msg, sizeof msg, "answer is not a valid frame: %s", why);
        lost(&c, msg);
    }
    if (a.code < 0) {
        snprintf(msg, sizeof msg, "%.*s", (int)(a.why_len < 400 ? a.why_len : 400), (const char *)a.why);
        fall_back(&c, msg);
    }
    int64_t io = now_ms() + NP_IO_TIMEOUT_MS;
    int bad = 0;
    if (a.out_len)
        bad |= write_all(STDOUT_FILENO, a.out, a.out_len, io, 0);
    if (a.err_len)
        (void)write_all(STDERR_FILENO, a.err, a.err_len, io, 0);
    int code = bad && !a.code ? 1 : a.code;
    free(body);
    free(c.stdin_data);
    return code;
}

#endif /* NPF_NO_MAIN */
