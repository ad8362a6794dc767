/* Growable strings and NULL-terminated string vectors (argv).
 *
 * Ownership: a ps_strbuf or ps_strvec owns its memory; start from {0} and
 * release with ps_strbuf_free / ps_strvec_free (ps_strbuf_take hands the
 * string to the caller instead).  A ps_strvec owns a copy of every string
 * pushed.
 *
 * Errors: an allocation that fails makes the object "failed": that call and
 * every later add/push on it return PS_ENOMEM and change nothing, so a caller
 * builds a whole string or argv and checks `failed` once at the end. */
#ifndef PS_STRBUF_H
#define PS_STRBUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct ps_strbuf {
    char *p;       /* NUL-terminated once anything was added; NULL before */
    size_t n, cap; /* length without the NUL, allocated bytes */
    int failed;    /* an allocation failed (sticky until reset) */
} ps_strbuf;

/* Append n bytes of s / the string s / printf output.  0 or PS_ENOMEM
 * (PS_EINVAL when fmt cannot be formatted). */
int ps_strbuf_addn(ps_strbuf *b, const char *s, size_t n);
int ps_strbuf_add(ps_strbuf *b, const char *s);
int ps_strbuf_addf(ps_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ps_strbuf_vaddf(ps_strbuf *b, const char *fmt, va_list ap);

/* The string so far: "" when nothing was added (never NULL).  Valid until
 * the next change to b. */
const char *ps_strbuf_str(const ps_strbuf *b);

/* Empty b and clear `failed`, keeping its memory for reuse. */
void ps_strbuf_reset(ps_strbuf *b);

/* Hand the string over (the caller frees it; "" when empty) and leave b
 * empty.  NULL when b failed or the copy of "" cannot be made; b is then
 * freed all the same. */
char *ps_strbuf_take(ps_strbuf *b);

void ps_strbuf_free(ps_strbuf *b);

typedef struct ps_strvec {
    char **v;      /* v[0..n-1], then NULL (once anything was pushed) */
    int n, cap;
    int failed;    /* an allocation failed (sticky until freed) */
} ps_strvec;

/* Append a copy of str / of the printf output.  0 or PS_ENOMEM. */
int ps_strvec_push(ps_strvec *s, const char *str);
int ps_strvec_pushf(ps_strvec *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Free every string and the vector; s is then empty (and not failed). */
void ps_strvec_free(ps_strvec *s);

#endif
