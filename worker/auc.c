#include "auc.h"

#include <math.h>
#include <stdlib.h>

#include "ps_error.h"

typedef struct scored {
    float score;
    int32_t label;
} scored;

static int by_score(const void *a, const void *b)
{
    float x = ((const scored *)a)->score, y = ((const scored *)b)->score;
    return (x > y) - (x < y);
}

int ps_auc(const float *scores, const int32_t *labels, size_t n, double *auc)
{
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (labels[i] != 0 && labels[i] != 1)
            return PS_EINVAL;
        if (isnan(scores[i]))
            return PS_EDATA;
        pos += (uint64_t)labels[i];
    }
    uint64_t neg = n - pos;
    if (pos == 0 || neg == 0)
        return PS_EINVAL;
    scored *s = malloc(n * sizeof *s);
    if (!s)
        return PS_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        s[i].score = scores[i];
        s[i].label = labels[i];
    }
    qsort(s, n, sizeof *s, by_score);
    /* Twice the Mann-Whitney U: each positive gains 2 per negative scored
     * below it and 1 per negative tied with it.  At most 2 pos neg <= n^2 / 2,
     * which fits 64 bits for any n below 6e9. */
    uint64_t twice_u = 0, neg_below = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        uint64_t p = 0, q = 0;
        for (; j < n && s[j].score == s[i].score; j++) {
            p += (uint64_t)s[j].label;
            q += (uint64_t)(1 - s[j].label);
        }
        twice_u += 2 * p * neg_below + p * q;
        neg_below += q;
        i = j;
    }
    free(s);
    *auc = (double)twice_u / (2.0 * (double)pos * (double)neg);
    return 0;
}
