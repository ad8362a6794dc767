#include "ps_metrics_http.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ps_error.h"

struct ps_metrics_http {
    ps_metrics *m;
    struct MHD_Daemon *d;
    int port;
    char url[320];
    _Atomic unsigned long long scrapes;
};

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* libmicrohttpd is loaded the first time an exporter starts, not linked:
 * with metrics off (the default) no process maps it, nor the GnuTLS it
 * brings (several MiB, in every program and in libps.so's users). */
#ifndef PS_MHD_SONAME
#define PS_MHD_SONAME "libmicrohttpd.so.12"
#endif
static struct {
    struct MHD_Daemon *(*start)(unsigned int flags, uint16_t port, MHD_AcceptPolicyCallback apc,
                                void *apc_cls, MHD_AccessHandlerCallback dh, void *dh_cls, ...);
    void (*stop)(struct MHD_Daemon *d);
    struct MHD_Response *(*response)(size_t size, void *buffer, enum MHD_ResponseMemoryMode m);
    enum MHD_Result (*header)(struct MHD_Response *r, const char *name, const char *value);
    enum MHD_Result (*queue)(struct MHD_Connection *c, unsigned int status,
                             struct MHD_Response *r);
    void (*destroy)(struct MHD_Response *r);
    char why[256]; /* why it could not be loaded; "" when it was */
} mhd;
static pthread_once_t mhd_once = PTHREAD_ONCE_INIT;

static void mhd_load(void)
{
    void *h = dlopen(PS_MHD_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(mhd.why, sizeof mhd.why, "%s (Debian: libmicrohttpd12)", dlerror());
        return;
    }
#define SYM_(field, name)                                                    \
    if (!(*(void **)&mhd.field = dlsym(h, name)) && !mhd.why[0])             \
        snprintf(mhd.why, sizeof mhd.why, "%s has no %s", PS_MHD_SONAME, name);
    SYM_(start, "MHD_start_daemon")
    SYM_(stop, "MHD_stop_daemon")
    SYM_(response, "MHD_create_response_from_buffer")
    SYM_(header, "MHD_add_response_header")
    SYM_(queue, "MHD_queue_response")
    SYM_(destroy, "MHD_destroy_response")
#undef SYM_
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, char *body,
                             const char *type)
{
    struct MHD_Response *r =
        mhd.response(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    mhd.header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = mhd.queue(conn, status, r);
    mhd.destroy(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **state)
{
    (void)version;
    (void)upload_data;
    ps_metrics_http *h = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, strdup("only GET /metrics\n"),
                     "text/plain");
    if (*upload_size) /* a GET with a body: ignore it */
        return (*upload_size = 0, MHD_YES);
    if (!*state) { /* the first call is for the headers alone */
        *state = h;
        return MHD_YES;
    }
    if (!strcmp(url, "/"))
        return reply(conn, MHD_HTTP_OK,
                     strdup("<html><body><a href=\"/metrics\">/metrics</a></body></html>\n"),
                     "text/html");
    if (strcmp(url, "/metrics"))
        return reply(conn, MHD_HTTP_NOT_FOUND, strdup("not found: this serves /metrics\n"),
                     "text/plain");
    ps_strbuf b = {0};
    int rc = ps_metrics_render(h->m, &b);
    char *body = ps_strbuf_take(&b);
    if (rc || !body) {
        free(body);
        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, strdup("out of memory\n"),
                     "text/plain");
    }
    atomic_fetch_add_explicit(&h->scrapes, 1, memory_order_relaxed);
    return reply(conn, MHD_HTTP_OK, body, CONTENT_TYPE);
}

/* A listening socket on addr:port, or -1 (PS_EIO) / -2 (PS_EINVAL) with why. */
static int listen_on(const char *addr, int port, int *family, int *bound_port, char *why,
                     size_t why_len)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(addr, ps, &hints, &ai);
    if (g) {
        ps_errorf(why, why_len, "--metrics-bind %s: %s", addr, gai_strerror(g));
        return -2;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 64)) {
        ps_errorf(why, why_len, "cannot listen on %s:%d for metrics: %s (another process "
                  "has the port? give --metrics-port another one)", addr, port,
                  strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    *family = ai->ai_family;
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int ps_metrics_http_start(ps_metrics *m, const char *addr, int port, ps_metrics_http **out,
                          char *why, size_t why_len)
{
    *out = NULL;
    if (!addr || !*addr)
        addr = "127.0.0.1";
    if (port < 0 || port > 65535) {
        ps_errorf(why, why_len, "--metrics-port must be in [0, 65535], got %d", port);
        return PS_EINVAL;
    }
    pthread_once(&mhd_once, mhd_load);
    if (mhd.why[0]) {
        ps_errorf(why, why_len, "cannot serve metrics: %s", mhd.why);
        return PS_EIO;
    }
    ps_metrics_http *h = calloc(1, sizeof *h);
    if (!h)
        return PS_ENOMEM;
    h->m = m;
    int family = AF_INET;
    int fd = listen_on(addr, port, &family, &h->port, why, why_len);
    if (fd < 0) {
        free(h);
        return fd == -2 ? PS_EINVAL : PS_EIO;
    }
    /* a connection is served on the library's one thread; a client that
     * sends nothing is dropped after 10 s, and at most 32 are open */
    /* the library's thread takes no signals: they stay the program's threads' */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    h->d = mhd.start(MHD_USE_AUTO_INTERNAL_THREAD | (family == AF_INET6 ? MHD_USE_IPv6 : 0), 0,
                     NULL, NULL, on_request, h, MHD_OPTION_LISTEN_SOCKET, fd,
                     MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_CONNECTION_LIMIT, 32u,
                     MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!h->d) {
        ps_errorf(why, why_len, "cannot serve metrics on %s:%d: libmicrohttpd did not start "
                  "(out of threads or file descriptors?)", addr, h->port);
        close(fd);
        free(h);
        return PS_EIO;
    }
    int v6 = strchr(addr, ':') != NULL;
    snprintf(h->url, sizeof h->url, "http://%s%s%s:%d/metrics", v6 ? "[" : "", addr,
             v6 ? "]" : "", h->port);
    *out = h;
    return 0;
}

int ps_metrics_http_port(const ps_metrics_http *h) { return h->port; }

const char *ps_metrics_http_url(const ps_metrics_http *h) { return h->url; }

unsigned long long ps_metrics_http_scrapes(const ps_metrics_http *h)
{
    return atomic_load_explicit(&h->scrapes, memory_order_relaxed);
}

void ps_metrics_http_stop(ps_metrics_http *h)
{
    if (!h)
        return;
    mhd.stop(h->d); /* closes the listening socket */
    free(h);
}
