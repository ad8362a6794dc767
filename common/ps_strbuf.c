#include "ps_strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

static int reserve(ps_strbuf *b, size_t extra)
{
    if (b->failed)
        return PS_ENOMEM;
    if (b->n + extra + 1 <= b->cap)
        return 0;
    size_t cap = (b->n + extra + 1) * 2;
    char *p = cap > b->n + extra ? realloc(b->p, cap) : NULL; /* no size_t wrap */
    if (!p) {
        b->failed = 1;
        return PS_ENOMEM;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

int ps_strbuf_addn(ps_strbuf *b, const char *s, size_t n)
{
    if (reserve(b, n))
        return PS_ENOMEM;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int ps_strbuf_add(ps_strbuf *b, const char *s) { return ps_strbuf_addn(b, s, strlen(s)); }

int ps_strbuf_vaddf(ps_strbuf *b, const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    int rc = 0;
    if (n < 0) {
        rc = PS_EINVAL;
    } else if ((size_t)n < sizeof tmp) {
        rc = ps_strbuf_addn(b, tmp, (size_t)n);
    } else if (!(rc = reserve(b, (size_t)n))) {
        /* long output: format straight into the reserved space */
        vsnprintf(b->p + b->n, (size_t)n + 1, fmt, again);
        b->n += (size_t)n;
    }
    va_end(again);
    return rc;
}

int ps_strbuf_addf(ps_strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = ps_strbuf_vaddf(b, fmt, ap);
    va_end(ap);
    return rc;
}

const char *ps_strbuf_str(const ps_strbuf *b) { return b->p && !b->failed ? b->p : ""; }

void ps_strbuf_reset(ps_strbuf *b)
{
    b->n = 0;
    b->failed = 0;
    if (b->p)
        b->p[0] = 0;
}

char *ps_strbuf_take(ps_strbuf *b)
{
    char *s = b->failed ? NULL : b->p ? b->p : strdup("");
    if (b->failed)
        free(b->p);
    memset(b, 0, sizeof *b);
    return s;
}

void ps_strbuf_free(ps_strbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int ps_strvec_push(ps_strvec *s, const char *str)
{
    if (s->failed)
        return PS_ENOMEM;
    if (s->n + 2 > s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        char **v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) {
            s->failed = 1;
            return PS_ENOMEM;
        }
        s->v = v;
        s->cap = cap;
    }
    char *copy = strdup(str);
    if (!copy) {
        s->failed = 1;
        return PS_ENOMEM;
    }
    s->v[s->n++] = copy;
    s->v[s->n] = NULL;
    return 0;
}

int ps_strvec_pushf(ps_strvec *s, const char *fmt, ...)
{
    ps_strbuf b = {0};
    va_list ap;
    va_start(ap, fmt);
    int rc = ps_strbuf_vaddf(&b, fmt, ap);
    va_end(ap);
    if (!rc)
        rc = ps_strvec_push(s, ps_strbuf_str(&b));
    else if (rc == PS_ENOMEM)
        s->failed = 1;
    ps_strbuf_free(&b);
    return rc;
}

void ps_strvec_free(ps_strvec *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}
