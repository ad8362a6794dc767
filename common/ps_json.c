/* The JSON reader (ps_json.h): recursive descent over the whole text. */
#include "ps_json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

#define MAX_DEPTH 64

typedef struct rd {
    const char *p, *end, *start;
    char *why;
    size_t why_len;
    int rc;
} rd;

static int fail(rd *r, const char *what)
{
    if (!r->rc) {
        int line = 1;
        for (const char *q = r->start; q < r->p && q < r->end; q++)
            line += *q == '\n';
        ps_errorf(r->why, r->why_len, "line %d: %s", line, what);
        r->rc = PS_EDATA;
    }
    return -1;
}

static void ws(rd *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int value(rd *r, ps_json *v, int depth);

static char *string(rd *r)
{
    /* r->p at the opening quote; the text is at most as long as its escapes */
    const char *q = ++r->p;
    size_t cap = 0;
    while (q < r->end && *q != '"') {
        if (*q == '\\')
            q++;
        q++;
        cap++;
    }
    if (q >= r->end) {
        fail(r, "a string that does not end");
        return NULL;
    }
    char *s = malloc(3 * cap + 1), *o = s;
    if (!s) {
        r->rc = PS_ENOMEM;
        return NULL;
    }
    while (*r->p != '"') {
        char c = *r->p++;
        if ((unsigned char)c < 0x20) {
            free(s);
            fail(r, "a control character in a string");
            return NULL;
        }
        if (c != '\\') {
            *o++ = c;
            continue;
        }
        c = *r->p++;
        switch (c) {
        case '"': case '\\': case '/': *o++ = c; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp = 0;
            for (int k = 0; k < 4; k++, r->p++) {
                char h = r->p < r->end ? *r->p : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) {
                    free(s);
                    fail(r, "a bad \\u escape");
                    return NULL;
                }
                cp = cp * 16 + (unsigned)d;
            }
            if (cp < 0x80) {
                *o++ = (char)cp;
            } else if (cp < 0x800) {
                *o++ = (char)(0xc0 | cp >> 6);
                *o++ = (char)(0x80 | (cp & 0x3f));
            } else {
                *o++ = '?';
            }
            break;
        }
        default:
            free(s);
            fail(r, "a bad escape in a string");
            return NULL;
        }
    }
    r->p++;
    *o = 0;
    return s;
}

static int number(rd *r, ps_json *v)
{
    const char *s = r->p;
    v->type = PS_JSON_NUM;
    v->neg = *s == '-';
    const char *d = s + v->neg;
    int digits = 0, integer = 1;
    uint64_t u = 0;
    const char *q = d;
    for (; q < r->end && *q >= '0' && *q <= '9'; q++, digits++) {
        unsigned dg = (unsigned)(*q - '0');
        if (u > (UINT64_MAX - dg) / 10)
            integer = 0;
        u = u * 10 + dg;
    }
    if (!digits)
        return fail(r, "expected a value");
    if (q < r->end && (*q == '.' || *q == 'e' || *q == 'E'))
        integer = 0;
    char buf[64];
    char *end;
    size_t n = 0;
    while (s + n < r->end && n < sizeof buf - 1 && strchr("+-0123456789.eE", s[n]))
        n++;
    memcpy(buf, s, n);
    buf[n] = 0;
    errno = 0;
    v->num = strtod(buf, &end);
    if (end == buf)
        return fail(r, "a bad number");
    r->p = s + (end - buf);
    v->is_int = integer;
    v->u = integer ? u : 0;
    return 0;
}

static int members(rd *r, ps_json *v, int depth, int obj)
{
    v->type = obj ? PS_JSON_OBJ : PS_JSON_ARR;
    char close = obj ? '}' : ']';
    r->p++;
    ws(r);
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    size_t cap = 0;
    for (;;) {
        ws(r);
        if (v->n == cap) {
            size_t nc = cap ? 2 * cap : 8;
            ps_json *k = realloc(v->kids, nc * sizeof *k);
            if (!k) {
                r->rc = PS_ENOMEM;
                return -1;
            }
            v->kids = k;
            cap = nc;
        }
        ps_json *kid = &v->kids[v->n];
        memset(kid, 0, sizeof *kid);
        v->n++;
        if (obj) {
            if (r->p >= r->end || *r->p != '"')
                return fail(r, "expected a member name");
            if (!(kid->key = string(r)))
                return -1;
            ws(r);
            if (r->p >= r->end || *r->p != ':')
                return fail(r, "expected ':'");
            r->p++;
        }
        if (value(r, kid, depth + 1))
            return -1;
        ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == close) {
            r->p++;
            return 0;
        }
        return fail(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int value(rd *r, ps_json *v, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(r, "nested too deep");
    ws(r);
    if (r->p >= r->end)
        return fail(r, "expected a value");
    char c = *r->p;
    if (c == '{' || c == '[')
        return members(r, v, depth, c == '{');
    if (c == '"') {
        v->type = PS_JSON_STR;
        return (v->str = string(r)) ? 0 : -1;
    }
    static const struct { const char *w; int type; double num; } words[] = {
        {"true", PS_JSON_BOOL, 1}, {"false", PS_JSON_BOOL, 0}, {"null", PS_JSON_NULL, 0}};
    for (size_t k = 0; k < 3; k++) {
        size_t n = strlen(words[k].w);
        if ((size_t)(r->end - r->p) >= n && !memcmp(r->p, words[k].w, n)) {
            v->type = words[k].type;
            v->num = words[k].num;
            r->p += n;
            return 0;
        }
    }
    return number(r, v);
}

int ps_json_parse(const char *text, size_t len, ps_json *out, char *why, size_t why_len)
{
    memset(out, 0, sizeof *out);
    rd r = {text, text + len, text, why, why_len, 0};
    if (value(&r, out, 0) == 0) {
        ws(&r);
        if (r.p != r.end)
            fail(&r, "text after the value");
    }
    if (r.rc) {
        if (r.rc == PS_ENOMEM)
            ps_errorf(why, why_len, "out of memory");
        ps_json_free(out);
    }
    return r.rc;
}

int ps_json_load(const char *path, ps_json *out, char *why, size_t why_len)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        ps_errorf(why, why_len, "cannot open %s: %s", path, strerror(e));
        return e == ENOENT ? PS_ENOTFOUND : PS_EIO;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 65536;
            char *b = cap <= (64u << 20) ? realloc(buf, cap) : NULL;
            if (!b) {
                free(buf);
                fclose(f);
                ps_errorf(why, why_len, "%s: too large or out of memory", path);
                return PS_EDATA;
            }
            buf = b;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        ps_errorf(why, why_len, "cannot read %s", path);
        return PS_EIO;
    }
    char msg[200];
    int rc = ps_json_parse(buf, len, out, msg, sizeof msg);
    free(buf);
    if (rc)
        ps_errorf(why, why_len, "%s: %s", path, msg);
    return rc;
}

void ps_json_free(ps_json *j)
{
    if (!j)
        return;
    for (size_t k = 0; k < j->n; k++)
        ps_json_free(&j->kids[k]);
    free(j->kids);
    free(j->key);
    free(j->str);
    memset(j, 0, sizeof *j);
}

const ps_json *ps_json_get(const ps_json *j, const char *key)
{
    if (!j || j->type != PS_JSON_OBJ)
        return NULL;
    for (size_t k = 0; k < j->n; k++)
        if (!strcmp(j->kids[k].key, key))
            return &j->kids[k];
    return NULL;
}

int ps_json_u64(const ps_json *j, const char *key, uint64_t *out)
{
    const ps_json *v = ps_json_get(j, key);
    if (!v || v->type != PS_JSON_NUM || !v->is_int || (v->neg && v->u))
        return -1;
    *out = v->u;
    return 0;
}

int ps_json_i64(const ps_json *j, const char *key, int64_t *out)
{
    const ps_json *v = ps_json_get(j, key);
    if (!v || v->type != PS_JSON_NUM || !v->is_int || v->u > (uint64_t)INT64_MAX + v->neg)
        return -1;
    *out = v->neg ? (int64_t)(0 - v->u) : (int64_t)v->u;
    return 0;
}

int ps_json_f64(const ps_json *j, const char *key, double *out)
{
    const ps_json *v = ps_json_get(j, key);
    if (!v || (v->type != PS_JSON_NUM && v->type != PS_JSON_BOOL))
        return -1;
    *out = v->num;
    return 0;
}

const char *ps_json_str(const ps_json *j, const char *key)
{
    const ps_json *v = ps_json_get(j, key);
    return v && v->type == PS_JSON_STR ? v->str : NULL;
}
