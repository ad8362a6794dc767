/* The hello's settings: the rows of the settings table that servers and
 * workers must agree on (common/ps_settings.h, the hello column), where
 * ps_hello keeps them, and the one comparison rule.  ps_proto.c encodes
 * them under the rows' keys and ps_proto_decode.c decodes them. */
#include <stddef.h>
#include <stdio.h>

#include "ps_error.h"
#include "ps_proto.h"

/* Each agreed row's field in ps_hello. */
static const ps_setting_field agreed[] = {PS_SETTING_HELLO_FIELDS};
enum { NAGREED = sizeof agreed / sizeof agreed[0] };

int ps_hello_nagreed(void)
{
    return NAGREED;
}

const ps_setting *ps_hello_agreed(int i)
{
    return i >= 0 && i < NAGREED ? ps_setting_at(agreed[i].id) : NULL;
}

int64_t ps_hello_get(const ps_hello *h, int i)
{
    return ps_setting_field_get(&agreed[i], h);
}

void ps_hello_set(ps_hello *h, int i, int64_t v)
{
    ps_setting_field_set(&agreed[i], h, v);
}

/* 0 where the row takes no 0 means "not given": an older peer's hello
 * without the key, which stands for the row's default (a hello without
 * "dt" is float32). */
static int unset(int i, int64_t v)
{
    long long lo, hi;
    ps_setting_range(ps_hello_agreed(i), &lo, &hi);
    return v == 0 && (lo > 0 || hi < 0);
}

int ps_hello_sends(const ps_hello *h, int i)
{
    return !unset(i, ps_hello_get(h, i));
}

/* The value as compared and named: the default when not given. */
static int64_t value(const ps_hello *h, int i)
{
    int64_t v = ps_hello_get(h, i);
    return unset(i, v) ? ps_setting_default(ps_hello_agreed(i)) : v;
}

static void value_text(const ps_setting *r, int64_t v, char *out, size_t len)
{
    const char *name = r->type == PS_SETTING_ENUM ? ps_setting_choice_name(r, v) : NULL;
    if (name)
        snprintf(out, len, "%s", name);
    else
        snprintf(out, len, "%lld", (long long)v);
}

int ps_hello_compare(const ps_hello *a, const char *an, const ps_hello *b, const char *bn,
                     int check_opt, char *why, size_t why_len)
{
    for (int i = 0; i < NAGREED; i++) {
        int64_t x = value(a, i), y = value(b, i);
        if (x == y)
            continue;
        const ps_setting *r = ps_hello_agreed(i);
        char xs[32], ys[32];
        value_text(r, x, xs, sizeof xs);
        value_text(r, y, ys, sizeof ys);
        /* a setting ps_launch gives both sides: the user gave it to one */
        if (r->props & PS_SET_SHARED)
            ps_errorf(why, why_len, "%s: %s has %s, %s has %s (give every server and worker the "
                "same %s)", ps_setting_name(r), an, xs, bn, ys, r->flag);
        else
            ps_errorf(why, why_len, "%s: %s has %s, %s has %s", ps_setting_name(r), an, xs, bn,
                ys);
        return PS_EMISMATCH;
    }
    if (a->model_fp && b->model_fp && a->model_fp != b->model_fp) {
        ps_errorf(why, why_len,
            "model: %s has fingerprint %016llx, %s has %016llx (different tensors or chunk size)",
            an, (unsigned long long)a->model_fp, bn, (unsigned long long)b->model_fp);
        return PS_EMISMATCH;
    }
    if (a->tables_fp && b->tables_fp && a->tables_fp != b->tables_fp) {
        ps_errorf(why, why_len,
            "tables: %s has fingerprint %016llx, %s has %016llx (tables declared otherwise)", an,
            (unsigned long long)a->tables_fp, bn, (unsigned long long)b->tables_fp);
        return PS_EMISMATCH;
    }
    if (!check_opt)
        return 0;
    return ps_opt_compare(&a->opt, an, &b->opt, bn, why, why_len);
}
