#include "ps_flags.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"

int ps_parse_int(const char *prog, const char *flag, const char *text, long long lo, long long hi,
                 long long *out, char *why, size_t why_len)
{
    char *end;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || v < lo || v > hi) {
        snprintf(why, why_len, "%s: %s must be an integer in [%lld, %lld], got '%s'", prog, flag,
                 lo, hi, text ? text : "");
        return PS_EINVAL;
    }
    *out = v;
    return 0;
}

int ps_parse_float(const char *prog, const char *flag, const char *text, double lo, double hi,
                   double *out, char *why, size_t why_len)
{
    char *end;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || *end || errno || !isfinite(v) || v < lo || v > hi) {
        snprintf(why, why_len, "%s: %s must be a number in [%g, %g], got '%s'", prog, flag, lo, hi,
                 text ? text : "");
        return PS_EINVAL;
    }
    *out = v;
    return 0;
}

int ps_parse_size(const char *prog, const char *flag, const char *text, uint64_t lo, uint64_t hi,
                  uint64_t *out, char *why, size_t why_len)
{
    char *end;
    errno = 0;
    unsigned long long v = 0;
    int ok = text && *text >= '0' && *text <= '9';
    if (ok) {
        v = strtoull(text, &end, 10);
        uint64_t mul = 1;
        if (*end == 'K' || *end == 'k')
            mul = 1ull << 10;
        else if (*end == 'M' || *end == 'm')
            mul = 1ull << 20;
        else if (*end == 'G' || *end == 'g')
            mul = 1ull << 30;
        if (mul != 1) {
            end++;
            if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0)
                end += strlen(end);
        } else if (strcmp(end, "B") == 0) {
            end++;
        }
        ok = !*end && !errno && (v == 0 || mul <= UINT64_MAX / v);
        if (ok)
            v *= mul;
    }
    if (!ok || v < lo || v > hi) {
        snprintf(why, why_len,
                 "%s: %s must be a size in [%llu, %llu] bytes (suffix K, M, G allowed), got '%s'",
                 prog, flag, (unsigned long long)lo, (unsigned long long)hi, text ? text : "");
        return PS_EINVAL;
    }
    *out = v;
    return 0;
}

int ps_flag_error(const char *msg)
{
    fprintf(stderr, "%s\n", msg);
    return 2;
}
