#include "top_source.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ps_curve.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_time.h"

struct ps_top_conn {
    void *zctx, *sock;
    char endpoint[256], curve_dir[1024], key[256];
    int server_rank;
    uint64_t seq;
};

static int conn_socket(ps_top_conn *c, char *why, size_t len)
{
    c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
    if (!c->sock) {
        ps_errorf(why, len, "cannot make a socket: %s", zmq_strerror(zmq_errno()));
        return PS_EIO;
    }
    int zero = 0, ivl = 100;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(c->sock, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    if (*c->curve_dir) {
        int rc = ps_curve_client_setup_key(c->sock, c->curve_dir, c->key, c->server_rank, why,
                                           len);
        if (rc) {
            zmq_close(c->sock);
            c->sock = NULL;
            return rc;
        }
    }
    if (zmq_connect(c->sock, c->endpoint)) {
        ps_errorf(why, len, "%s: %s", c->endpoint, zmq_strerror(zmq_errno()));
        zmq_close(c->sock);
        c->sock = NULL;
        return PS_EINVAL;
    }
    return 0;
}

int ps_top_conn_open(void *zctx, const char *endpoint, int server_rank, const char *curve_dir,
                     const char *key, ps_top_conn **out, char *why, size_t len)
{
    *out = NULL;
    ps_top_conn *c = calloc(1, sizeof *c);
    if (!c)
        return PS_ENOMEM;
    c->zctx = zctx;
    c->server_rank = server_rank;
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    snprintf(c->curve_dir, sizeof c->curve_dir, "%s", curve_dir ? curve_dir : "");
    snprintf(c->key, sizeof c->key, "%s", key ? key : "worker-0");
    int rc = conn_socket(c, why, len);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int ps_top_conn_stats(ps_top_conn *c, int timeout_ms, ps_stats *out, char *why, size_t len)
{
    if (!c->sock && conn_socket(c, why, len))
        return PS_EIO;
    ps_header h;
    ps_header_init(&h, PS_MSG_STATS);
    h.rank = -1; /* a tool: no hello, no rank of the job's */
    h.seq = ++c->seq;
    char buf[PS_HEADER_MAX];
    size_t n;
    if (ps_proto_encode(&h, buf, sizeof buf, &n) ||
        zmq_send(c->sock, buf, n, ZMQ_DONTWAIT) < 0) {
        ps_errorf(why, len, "cannot send a STATS request: %s", zmq_strerror(zmq_errno()));
        return PS_EIO;
    }
    int64_t deadline = ps_now_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        int64_t left = (deadline - ps_now_ns()) / 1000000;
        zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLIN, 0};
        if (left <= 0 || zmq_poll(&it, 1, (long)left) <= 0) {
            /* a reply that comes late must not answer the next request: a
             * new socket (CURVE: a new handshake) for the next try */
            zmq_close(c->sock);
            c->sock = NULL;
            ps_errorf(why, len, "no answer from %s in %d ms%s", c->endpoint, timeout_ms,
                      *c->curve_dir ? " (with CURVE: is the key in its authorized/?)" : "");
            return PS_ETIMEDOUT;
        }
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->sock, 0) < 0) {
            zmq_msg_close(&m);
            continue;
        }
        int more = zmq_msg_more(&m);
        ps_header r;
        char dwhy[256];
        int rc = ps_proto_decode(zmq_msg_data(&m), zmq_msg_size(&m), &r, dwhy, sizeof dwhy);
        zmq_msg_close(&m);
        while (more) { /* a STATS reply has no payload: drop whatever follows */
            zmq_msg_init(&m);
            zmq_msg_recv(&m, c->sock, 0);
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (rc) {
            ps_errorf(why, len, "%s: a reply that does not decode: %s", c->endpoint, dwhy);
            return PS_EPROTO;
        }
        if (r.seq != c->seq)
            continue; /* an earlier request's */
        if (r.type == PS_MSG_ERROR) {
            ps_errorf(why, len, "%s refused: %s", c->endpoint, r.err_text);
            return r.err_code ? r.err_code : PS_EPROTO;
        }
        if (r.type != PS_MSG_STATS) {
            ps_errorf(why, len, "%s answered a STATS request with a %s", c->endpoint,
                      ps_msg_type_name(r.type));
            return PS_EPROTO;
        }
        *out = r.stats;
        return 0;
    }
}

void ps_top_conn_close(ps_top_conn *c)
{
    if (!c)
        return;
    if (c->sock)
        zmq_close(c->sock);
    free(c);
}

/* ---- /metrics ---- */

static size_t on_body(char *p, size_t size, size_t n, void *user)
{
    ps_strbuf *b = user;
    return ps_strbuf_addn(b, p, size * n) ? 0 : size * n;
}

int ps_top_scrape(const char *target, int timeout_ms, ps_strbuf *out, char *why, size_t len)
{
    ps_strbuf_reset(out);
    CURL *h = curl_easy_init();
    if (!h) {
        ps_errorf(why, len, "%s: libcurl did not start", target);
        return PS_EIO;
    }
    char url[512], err[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "http://%s/metrics", target);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*"); /* the job's own hosts, never a proxy */
    CURLcode rc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) {
        ps_errorf(why, len, "%s: %s", target, *err ? err : curl_easy_strerror(rc));
        return PS_EIO;
    }
    return 0;
}

/* The sample line of `name` at p (the start of a line), or NULL: its value
 * text in *val and its labels (after '{') in *labels (NULL: none). */
static int sample_of(const char *p, const char *name, size_t nlen, const char **labels,
                     const char **val)
{
    if (*p == '#' || strncmp(p, name, nlen) || (p[nlen] != '{' && p[nlen] != ' '))
        return 0;
    *labels = NULL;
    p += nlen;
    if (*p == '{') {
        *labels = p + 1;
        /* the closing brace: quoted values may hold one */
        int q = 0;
        for (p++; *p && *p != '\n' && (q || *p != '}'); p++) {
            if (*p == '\\' && p[1])
                p++;
            else if (*p == '"')
                q = !q;
        }
        if (*p != '}')
            return 0;
        p++;
    }
    *val = p;
    return 1;
}

double ps_top_metric(const char *text, const char *name, int *found)
{
    size_t nlen = strlen(name);
    double sum = 0;
    *found = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *lab, *val;
        if (!sample_of(p, name, nlen, &lab, &val))
            continue;
        char *end;
        double v = strtod(val, &end);
        if (end != val) {
            sum += v;
            (*found)++;
        }
    }
    return sum;
}

const char *ps_top_metric_label(const char *text, const char *name, const char *label,
                                char *buf, size_t len)
{
    size_t nlen = strlen(name), llen = strlen(label);
    buf[0] = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *lab, *val;
        if (!sample_of(p, name, nlen, &lab, &val))
            continue;
        for (const char *l = lab; l && *l && *l != '}';) {
            if (!strncmp(l, label, llen) && l[llen] == '=' && l[llen + 1] == '"') {
                size_t k = 0;
                for (l += llen + 2; *l && *l != '"' && k + 1 < len; l++)
                    buf[k++] = *l == '\\' && l[1] ? *++l : *l;
                buf[k] = 0;
                return buf;
            }
            /* the next label: past this one's quoted value */
            l = strchr(l, '"');
            if (!l)
                break;
            for (l++; *l && *l != '"'; l++)
                if (*l == '\\' && l[1])
                    l++;
            if (*l == '"')
                l++;
            if (*l == ',')
                l++;
        }
        return buf;
    }
    return buf;
}
