#include "ps_etcd.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

#define MAX_URLS 8

struct ps_etcd {
    CURL *h;
    char *urls[MAX_URLS];
    int nurls, last; /* last: the endpoint that answered last, tried first */
    long timeout_ms;
    char body_err[CURL_ERROR_SIZE];
    struct curl_slist *hdrs;
};

/* libcurl is loaded the first time an etcd client opens, not linked: a
 * server without replicas (and every other program) maps neither it nor
 * the TLS libraries it brings, as metrics/ps_metrics_http.c does for
 * libmicrohttpd. */
#ifndef PS_CURL_SONAME
#define PS_CURL_SONAME "libcurl.so.4"
#endif
static struct {
    CURLcode (*global_init)(long flags);
    CURL *(*init)(void);
    void (*cleanup)(CURL *h);
    void (*reset)(CURL *h);
    CURLcode (*setopt)(CURL *h, CURLoption opt, ...);
    CURLcode (*perform)(CURL *h);
    CURLcode (*getinfo)(CURL *h, CURLINFO info, ...);
    const char *(*strerror)(CURLcode rc);
    struct curl_slist *(*slist_append)(struct curl_slist *l, const char *s);
    void (*slist_free_all)(struct curl_slist *l);
    char why[256]; /* why it could not be loaded; "" when it was */
} cu;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void g_init(void)
{
    void *h = dlopen(PS_CURL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cu.why, sizeof cu.why, "%s (Debian: libcurl4)", dlerror());
        return;
    }
#define SYM_(field, name)                                                    \
    if (!(*(void **)&cu.field = dlsym(h, name)) && !cu.why[0])              \
        snprintf(cu.why, sizeof cu.why, "%s has no %s", PS_CURL_SONAME, name);
    SYM_(global_init, "curl_global_init")
    SYM_(init, "curl_easy_init")
    SYM_(cleanup, "curl_easy_cleanup")
    SYM_(reset, "curl_easy_reset")
    SYM_(setopt, "curl_easy_setopt")
    SYM_(perform, "curl_easy_perform")
    SYM_(getinfo, "curl_easy_getinfo")
    SYM_(strerror, "curl_easy_strerror")
    SYM_(slist_append, "curl_slist_append")
    SYM_(slist_free_all, "curl_slist_free_all")
#undef SYM_
    if (!cu.why[0])
        cu.global_init(CURL_GLOBAL_DEFAULT);
}

void ps_etcd_global_init(void) { pthread_once(&g_once, g_init); }

void ps_etcd_kv_free(ps_etcd_kv *kv)
{
    if (!kv)
        return;
    free(kv->key);
    free(kv->value);
    memset(kv, 0, sizeof *kv);
}

/* ---------- base64 (the gateway's encoding of bytes) ---------- */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const void *data, size_t n)
{
    const unsigned char *p = data;
    char *o = malloc(4 * ((n + 2) / 3) + 1), *w = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *w++ = B64[v >> 18 & 63];
        *w++ = B64[v >> 12 & 63];
        *w++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? B64[v & 63] : '=';
    }
    *w = 0;
    return o;
}

static int b64_val(char c)
{
    const char *q = c ? strchr(B64, c) : NULL;
    return q ? (int)(q - B64) : -1;
}

/* NULL on bad input or no memory; *n the bytes (a NUL follows them). */
static char *b64_decode(const char *s, size_t *n)
{
    size_t len = strlen(s);
    char *o = malloc(len / 4 * 3 + 4);
    if (!o || len % 4) {
        free(o);
        return NULL;
    }
    size_t w = 0;
    for (size_t i = 0; i < len; i += 4) {
        int a = b64_val(s[i]), b = b64_val(s[i + 1]);
        int c = s[i + 2] == '=' ? 0 : b64_val(s[i + 2]);
        int d = s[i + 3] == '=' ? 0 : b64_val(s[i + 3]);
        if (a < 0 || b < 0 || c < 0 || d < 0) {
            free(o);
            return NULL;
        }
        uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
        o[w++] = (char)(v >> 16);
        if (s[i + 2] != '=')
            o[w++] = (char)(v >> 8 & 255);
        if (s[i + 3] != '=')
            o[w++] = (char)(v & 255);
    }
    o[w] = 0;
    *n = w;
    return o;
}

/* ---------- the handle ---------- */

int ps_etcd_open(const char *urls, long timeout_ms, ps_etcd **out, char *why, size_t why_len)
{
    *out = NULL;
    if (!urls || !*urls) {
        ps_errorf(why, why_len, "no etcd endpoint given (http://host:port[,...])");
        return PS_EINVAL;
    }
    ps_etcd *e = calloc(1, sizeof *e);
    if (!e)
        return PS_ENOMEM;
    e->timeout_ms = timeout_ms > 0 ? timeout_ms : 2000;
    for (const char *p = urls;;) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        while (n && p[n - 1] == '/')
            n--; /* "http://h:p/" and "http://h:p" name one endpoint */
        if (n) {
            if (e->nurls == MAX_URLS || (strncmp(p, "http://", 7) && strncmp(p, "https://", 8))) {
                ps_errorf(why, why_len, "etcd endpoints: '%.*s' is not http://host:port (at "
                          "most %d, comma-separated)", (int)n, p, MAX_URLS);
                ps_etcd_close(e);
                return PS_EINVAL;
            }
            if (!(e->urls[e->nurls++] = strndup(p, n))) {
                ps_etcd_close(e);
                return PS_ENOMEM;
            }
        }
        if (!c)
            break;
        p = c + 1;
    }
    if (!e->nurls) {
        ps_errorf(why, why_len, "no etcd endpoint in '%s'", urls);
        ps_etcd_close(e);
        return PS_EINVAL;
    }
    ps_etcd_global_init();
    if (cu.why[0]) {
        ps_errorf(why, why_len, "cannot load libcurl for etcd: %s", cu.why);
        ps_etcd_close(e);
        return PS_EIO;
    }
    e->h = cu.init();
    e->hdrs = cu.slist_append(NULL, "Content-Type: application/json");
    if (!e->h || !e->hdrs) {
        ps_etcd_close(e);
        return PS_ENOMEM;
    }
    *out = e;
    return 0;
}

void ps_etcd_close(ps_etcd *e)
{
    if (!e)
        return;
    if (e->h)
        cu.cleanup(e->h);
    if (e->hdrs)
        cu.slist_free_all(e->hdrs);
    for (int i = 0; i < e->nurls; i++)
        free(e->urls[i]);
    free(e);
}

const char *ps_etcd_endpoint(const ps_etcd *e) { return e->nurls ? e->urls[e->last] : ""; }

typedef struct body {
    char *p;
    size_t n;
    int oom;
} body;

static size_t on_body(char *data, size_t sz, size_t nm, void *user)
{
    body *b = user;
    size_t add = sz * nm;
    char *q = realloc(b->p, b->n + add + 1);
    if (!q) {
        b->oom = 1;
        return 0;
    }
    memcpy(q + b->n, data, add);
    b->n += add;
    q[b->n] = 0;
    b->p = q;
    return add;
}

/* POST req to path on the first endpoint that answers; *res the parsed
 * reply (the caller puts it).  An etcd error reply ({"error": ...} or
 * {"code": N, "message": ...}) is PS_EIO naming it. */
static int call(ps_etcd *e, const char *path, json_object *req, json_object **res, char *why,
                size_t why_len)
{
    *res = NULL;
    const char *txt = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    char url[512], last_err[1024] = "";
    for (int k = 0; k < e->nurls; k++) {
        int i = (e->last + k) % e->nurls;
        snprintf(url, sizeof url, "%s%s", e->urls[i], path);
        body b = {0};
        e->body_err[0] = 0;
        cu.reset(e->h);
        cu.setopt(e->h, CURLOPT_URL, url);
        cu.setopt(e->h, CURLOPT_POST, 1L);
        cu.setopt(e->h, CURLOPT_POSTFIELDS, txt);
        cu.setopt(e->h, CURLOPT_HTTPHEADER, e->hdrs);
        cu.setopt(e->h, CURLOPT_WRITEFUNCTION, on_body);
        cu.setopt(e->h, CURLOPT_WRITEDATA, &b);
        cu.setopt(e->h, CURLOPT_TIMEOUT_MS, e->timeout_ms);
        cu.setopt(e->h, CURLOPT_CONNECTTIMEOUT_MS, e->timeout_ms);
        cu.setopt(e->h, CURLOPT_NOSIGNAL, 1L);
        cu.setopt(e->h, CURLOPT_ERRORBUFFER, e->body_err);
        CURLcode rc = cu.perform(e->h);
        if (rc != CURLE_OK || b.oom) {
            snprintf(last_err, sizeof last_err, "%s: %s", url,
                     b.oom ? "out of memory" : e->body_err[0] ? e->body_err : cu.strerror(rc));
            free(b.p);
            if (b.oom)
                break;
            continue;
        }
        long status = 0;
        cu.getinfo(e->h, CURLINFO_RESPONSE_CODE, &status);
        json_object *j = b.p ? json_tokener_parse(b.p) : NULL;
        json_object *err = NULL, *msg = NULL;
        if (j && (json_object_object_get_ex(j, "error", &err) ||
                  (status != 200 && json_object_object_get_ex(j, "message", &msg)))) {
            ps_errorf(why, why_len, "etcd at %s said: %s", url,
                      json_object_get_string(err ? err : msg));
            json_object_put(j);
            free(b.p);
            e->last = i;
            return PS_EIO;
        }
        if (!j || status != 200) {
            ps_errorf(why, why_len, "etcd at %s answered HTTP %ld: %.120s", url, status,
                      b.p ? b.p : "(no body)");
            json_object_put(j);
            free(b.p);
            e->last = i;
            return PS_EIO;
        }
        free(b.p);
        e->last = i;
        *res = j;
        return 0;
    }
    ps_errorf(why, why_len, "no etcd endpoint answered (last: %s)", last_err);
    return PS_EIO;
}

/* ---------- reading replies ---------- */

/* An int64 field the gateway writes as a string (or a number). */
static int64_t get_i64(json_object *o, const char *k)
{
    json_object *v;
    if (!o || !json_object_object_get_ex(o, k, &v))
        return 0;
    if (json_object_is_type(v, json_type_string))
        return strtoll(json_object_get_string(v), NULL, 10);
    return json_object_get_int64(v);
}

static int kv_from(json_object *o, ps_etcd_kv *kv)
{
    memset(kv, 0, sizeof *kv);
    json_object *k, *v;
    size_t n = 0;
    if (json_object_object_get_ex(o, "key", &k) &&
        !(kv->key = b64_decode(json_object_get_string(k), &n)))
        return PS_EIO;
    if (json_object_object_get_ex(o, "value", &v)) {
        if (!(kv->value = b64_decode(json_object_get_string(v), &kv->len))) {
            ps_etcd_kv_free(kv);
            return PS_EIO;
        }
    } else if (!(kv->value = calloc(1, 1))) {
        ps_etcd_kv_free(kv);
        return PS_ENOMEM;
    }
    kv->create_rev = get_i64(o, "create_revision");
    kv->mod_rev = get_i64(o, "mod_revision");
    kv->version = get_i64(o, "version");
    kv->lease = get_i64(o, "lease");
    return 0;
}

static int add_b64(json_object *o, const char *field, const void *data, size_t n)
{
    char *s = b64_encode(data, n);
    if (!s)
        return PS_ENOMEM;
    json_object_object_add(o, field, json_object_new_string(s));
    free(s);
    return 0;
}

/* The end of the range of keys that start with prefix: prefix with its
 * last byte below 0xff incremented (etcd's rule). */
static int prefix_end(const char *prefix, char *out, size_t cap)
{
    size_t n = strlen(prefix);
    if (n + 1 > cap || !n)
        return PS_EINVAL;
    memcpy(out, prefix, n + 1);
    while (n && (unsigned char)out[n - 1] == 0xff)
        out[--n] = 0;
    if (!n)
        return PS_EINVAL;
    out[n - 1]++;
    return 0;
}

static int range(ps_etcd *e, const char *key, const char *end, ps_etcd_kv **kvs, size_t *n,
                 char *why, size_t why_len)
{
    *kvs = NULL;
    *n = 0;
    json_object *req = json_object_new_object(), *res = NULL;
    int rc = add_b64(req, "key", key, strlen(key));
    if (!rc && end)
        rc = add_b64(req, "range_end", end, strlen(end));
    if (!rc)
        rc = call(e, "/v3/kv/range", req, &res, why, why_len);
    json_object_put(req);
    if (rc)
        return rc;
    json_object *arr;
    if (json_object_object_get_ex(res, "kvs", &arr) && json_object_is_type(arr, json_type_array)) {
        size_t m = json_object_array_length(arr);
        *kvs = calloc(m ? m : 1, sizeof **kvs);
        if (!*kvs)
            rc = PS_ENOMEM;
        for (size_t i = 0; !rc && i < m; i++) {
            rc = kv_from(json_object_array_get_idx(arr, i), &(*kvs)[i]);
            if (!rc)
                (*n)++;
        }
        if (rc) {
            for (size_t i = 0; i < *n; i++)
                ps_etcd_kv_free(&(*kvs)[i]);
            free(*kvs);
            *kvs = NULL;
            *n = 0;
            ps_errorf(why, why_len, "etcd's range reply for '%s' holds a bad key or value", key);
        }
    }
    json_object_put(res);
    return rc;
}

int ps_etcd_get(ps_etcd *e, const char *key, ps_etcd_kv *kv, char *why, size_t why_len)
{
    memset(kv, 0, sizeof *kv);
    ps_etcd_kv *kvs;
    size_t n;
    int rc = range(e, key, NULL, &kvs, &n, why, why_len);
    if (rc)
        return rc;
    if (!n) {
        free(kvs);
        ps_errorf(why, why_len, "etcd has no key '%s'", key);
        return PS_ENOTFOUND;
    }
    *kv = kvs[0];
    for (size_t i = 1; i < n; i++)
        ps_etcd_kv_free(&kvs[i]);
    free(kvs);
    return 0;
}

int ps_etcd_list(ps_etcd *e, const char *prefix, ps_etcd_kv **kvs, size_t *n, char *why,
                 size_t why_len)
{
    char end[512];
    if (prefix_end(prefix, end, sizeof end)) {
        ps_errorf(why, why_len, "etcd: prefix '%s' cannot be listed", prefix);
        return PS_EINVAL;
    }
    return range(e, prefix, end, kvs, n, why, why_len);
}

static json_object *put_req(const char *key, const void *value, size_t len, int64_t lease)
{
    json_object *p = json_object_new_object();
    if (add_b64(p, "key", key, strlen(key)) || add_b64(p, "value", value, len)) {
        json_object_put(p);
        return NULL;
    }
    if (lease)
        json_object_object_add(p, "lease", json_object_new_int64(lease));
    return p;
}

static int64_t header_rev(json_object *res)
{
    json_object *h;
    return json_object_object_get_ex(res, "header", &h) ? get_i64(h, "revision") : 0;
}

int ps_etcd_put(ps_etcd *e, const char *key, const void *value, size_t len, int64_t lease,
                int64_t *rev, char *why, size_t why_len)
{
    json_object *req = put_req(key, value, len, lease), *res = NULL;
    if (!req)
        return PS_ENOMEM;
    int rc = call(e, "/v3/kv/put", req, &res, why, why_len);
    json_object_put(req);
    if (!rc && rev)
        *rev = header_rev(res);
    json_object_put(res);
    return rc;
}

int ps_etcd_cas(ps_etcd *e, const char *key, int64_t expect_rev, const void *value, size_t len,
                int64_t lease, int64_t *rev, ps_etcd_kv *cur, char *why, size_t why_len)
{
    if (cur)
        memset(cur, 0, sizeof *cur);
    /* compare: the key's mod revision is expect_rev (0: its create revision
     * is 0, it does not exist); success: put; failure: read it back */
    json_object *req = json_object_new_object(), *cmp = json_object_new_object();
    json_object *put = put_req(key, value, len, lease), *res = NULL;
    if (!put || add_b64(cmp, "key", key, strlen(key))) {
        json_object_put(req);
        json_object_put(cmp);
        json_object_put(put);
        return PS_ENOMEM;
    }
    json_object_object_add(cmp, "target", json_object_new_string(expect_rev ? "MOD" : "CREATE"));
    json_object_object_add(cmp, "result", json_object_new_string("EQUAL"));
    json_object_object_add(cmp, expect_rev ? "mod_revision" : "create_revision",
                           json_object_new_int64(expect_rev));
    json_object *cmps = json_object_new_array(), *ok = json_object_new_array();
    json_object *fail = json_object_new_array(), *op = json_object_new_object();
    json_object *rd = json_object_new_object(), *rq = json_object_new_object();
    json_object_array_add(cmps, cmp);
    json_object_object_add(op, "request_put", put);
    json_object_array_add(ok, op);
    add_b64(rq, "key", key, strlen(key));
    json_object_object_add(rd, "request_range", rq);
    json_object_array_add(fail, rd);
    json_object_object_add(req, "compare", cmps);
    json_object_object_add(req, "success", ok);
    json_object_object_add(req, "failure", fail);
    int rc = call(e, "/v3/kv/txn", req, &res, why, why_len);
    json_object_put(req);
    if (rc)
        return rc;
    json_object *succ;
    /* proto3's JSON leaves out a false "succeeded" */
    if (json_object_object_get_ex(res, "succeeded", &succ) && json_object_get_boolean(succ)) {
        if (rev)
            *rev = header_rev(res);
        json_object_put(res);
        return 0;
    }
    json_object *arr, *r0, *rr, *kvs;
    if (cur && json_object_object_get_ex(res, "responses", &arr) &&
        (r0 = json_object_array_get_idx(arr, 0)) &&
        json_object_object_get_ex(r0, "response_range", &rr) &&
        json_object_object_get_ex(rr, "kvs", &kvs) && json_object_array_length(kvs) > 0)
        rc = kv_from(json_object_array_get_idx(kvs, 0), cur);
    json_object_put(res);
    if (rc)
        return rc;
    ps_errorf(why, why_len, "'%s' is no longer at revision %" PRId64 " (it is at %" PRId64 ")",
              key, expect_rev, cur ? cur->mod_rev : (int64_t)-1);
    return PS_ESTALE;
}

int ps_etcd_delete(ps_etcd *e, const char *key, int prefix, char *why, size_t why_len)
{
    char end[512];
    json_object *req = json_object_new_object(), *res = NULL;
    int rc = add_b64(req, "key", key, strlen(key));
    if (!rc && prefix) {
        rc = prefix_end(key, end, sizeof end);
        if (!rc)
            rc = add_b64(req, "range_end", end, strlen(end));
    }
    if (!rc)
        rc = call(e, "/v3/kv/deleterange", req, &res, why, why_len);
    json_object_put(req);
    json_object_put(res);
    return rc;
}

int ps_etcd_lease_grant(ps_etcd *e, int ttl_s, int64_t *id, int *ttl, char *why,
                        size_t why_len)
{
    json_object *req = json_object_new_object(), *res = NULL;
    json_object_object_add(req, "TTL", json_object_new_int64(ttl_s));
    int rc = call(e, "/v3/lease/grant", req, &res, why, why_len);
    json_object_put(req);
    if (rc)
        return rc;
    *id = get_i64(res, "ID");
    if (ttl)
        *ttl = (int)get_i64(res, "TTL");
    json_object_put(res);
    if (!*id) {
        ps_errorf(why, why_len, "etcd granted no lease");
        return PS_EIO;
    }
    return 0;
}

int ps_etcd_lease_keepalive(ps_etcd *e, int64_t id, int *ttl, char *why, size_t why_len)
{
    json_object *req = json_object_new_object(), *res = NULL, *r;
    char ids[32];
    snprintf(ids, sizeof ids, "%" PRId64, id);
    json_object_object_add(req, "ID", json_object_new_string(ids));
    int rc = call(e, "/v3/lease/keepalive", req, &res, why, why_len);
    json_object_put(req);
    if (rc)
        return rc;
    /* a stream: one result; an expired lease has no TTL (0) */
    int64_t left = json_object_object_get_ex(res, "result", &r) ? get_i64(r, "TTL") : 0;
    json_object_put(res);
    if (ttl)
        *ttl = (int)left;
    if (left <= 0) {
        ps_errorf(why, why_len, "etcd lease %" PRId64 " expired", id);
        return PS_ENOTFOUND;
    }
    return 0;
}

int ps_etcd_lease_revoke(ps_etcd *e, int64_t id, char *why, size_t why_len)
{
    json_object *req = json_object_new_object(), *res = NULL;
    char ids[32];
    snprintf(ids, sizeof ids, "%" PRId64, id);
    json_object_object_add(req, "ID", json_object_new_string(ids));
    int rc = call(e, "/v3/lease/revoke", req, &res, why, why_len);
    json_object_put(req);
    json_object_put(res);
    return rc;
}
