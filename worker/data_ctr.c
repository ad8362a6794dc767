/* Click-through data (data.h): the synthetic generator, which
 * python/ps/data_ctr.py repeats operation for operation, and the Criteo
 * text format. */
#include "data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "ps_error.h"
#include "rng.h"

static ps_dataset *ctr_alloc(size_t n, int fields)
{
    ps_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return NULL;
    ds->channels = PS_CTR_DENSE;
    ds->height = ds->width = 1;
    ds->num_classes = 2;
    ds->num_fields = fields;
    if (n > SIZE_MAX / (PS_CTR_DENSE * sizeof(float)) || n > SIZE_MAX / 8 / (size_t)fields)
        goto fail;
    ds->images = malloc((n ? n : 1) * PS_CTR_DENSE * sizeof(float));
    ds->labels = malloc((n ? n : 1) * sizeof(int32_t));
    ds->ids = malloc((n ? n : 1) * (size_t)fields * sizeof(uint64_t));
    if (ds->images && ds->labels && ds->ids)
        return ds;
fail:
    ps_dataset_free(ds);
    return NULL;
}

/* ---- synthetic ------------------------------------------------------------
 * The constants and formulas are python/ps/data_ctr.py's (its docstring
 * states them); a change here is a change there. */

#define SYN_BIAS (-2.0)         /* about 25% clicks, like Criteo */
#define SYN_WEIGHT 0.75         /* hidden weight of a (field, id): uniform in +-this */
#define SYN_DENSE_WEIGHT 3.0    /* dense coefficients: uniform in +-this */
/* The Zipf inverse CDF: a table of the first SYN_TABLE_ROWS ranks' running
 * sums (the whole of it up to that many rows), the rest of the ranks by
 * the integral of k^-s (below), so any id space costs at most 32 MiB */
#define SYN_TABLE_ROWS ((uint64_t)1 << 22)
#define SYN_MAX_ROWS ((uint64_t)1 << 40)
#define TAG_IDS 0x6374722d69647321ull    /* "ctr-ids!" */
#define TAG_DENSE 0x6374722d64656e73ull  /* "ctr-dens" */
#define TAG_WEIGHT 0x6374722d77656967ull /* "ctr-weig" */
#define TAG_COEF 0x6374722d636f6566ull   /* "ctr-coef" */
#define TAG_LABEL 0x6374722d6c61626cull  /* "ctr-labl" */

static double unit(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b)
{
    return ps_rng_unit(ps_rng_hash(seed, tag, a, b));
}

/* The first k >= 0 with cdf[k] > v (numpy's searchsorted(side="right")),
 * at most n - 1. */
static uint64_t upper_bound(const double *cdf, uint64_t n, double v)
{
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (cdf[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n ? lo : n - 1;
}

/* The antiderivative of x^-s: x^(1-s) / (1-s), ln x for s = 1; and its
 * inverse.  Our portable exp and log (data_ctr.py has the same). */
static double zipf_f(double x, double s)
{
    return s == 1.0 ? ps_rng_log(x) : ps_rng_exp((1.0 - s) * ps_rng_log(x)) / (1.0 - s);
}

static double zipf_f_inv(double y, double s)
{
    return s == 1.0 ? ps_rng_exp(y) : ps_rng_exp(ps_rng_log((1.0 - s) * y) / (1.0 - s));
}

/* Ranks 0 .. rows-1 with weights (k+1)^-s: the table's nt running sums,
 * and beyond them (rows > nt) the tail's mass as the integral of x^-s
 * from nt + 1/2 (the midpoint rule's sum of the ranks after nt). */
typedef struct zipf_inv {
    const double *cdf;
    uint64_t nt, rows;
    double s, f0, total;
} zipf_inv;

static void zipf_init(zipf_inv *z, const double *cdf, uint64_t nt, uint64_t rows, double s)
{
    *z = (zipf_inv){cdf, nt, rows, s, 0.0, cdf[nt - 1]};
    if (rows > nt) {
        z->f0 = zipf_f((double)nt + 0.5, s);
        z->total = cdf[nt - 1] + (zipf_f((double)rows + 0.5, s) - z->f0);
    }
}

/* The rank of u in (0, 1): the table's count of sums <= u * total, or
 * past the table the x where the tail's integral from nt + 1/2 to x + 1/2
 * reaches what is left, rounded down, at most rows - 1. */
static uint64_t zipf_rank(const zipf_inv *z, double u)
{
    double v = u * z->total;
    if (z->rows == z->nt || v < z->cdf[z->nt - 1])
        return upper_bound(z->cdf, z->nt, v);
    double x = zipf_f_inv(z->f0 + (v - z->cdf[z->nt - 1]), z->s) - 0.5;
    uint64_t k = !(x < (double)z->rows) ? z->rows - 1 : x < 0 ? 0 : (uint64_t)x;
    return k < z->nt ? z->nt : k > z->rows - 1 ? z->rows - 1 : k;
}

int ps_dataset_synthetic_ctr(uint64_t start, size_t n, uint64_t seed, int fields, uint64_t rows,
                             double zipf, ps_dataset **out, char *why, size_t why_len)
{
    *out = NULL;
    if (n == 0 || n > (size_t)INT32_MAX || fields < 1 || rows < 1 || rows > SYN_MAX_ROWS ||
        !(zipf >= 0 && zipf <= 10)) {
        snprintf(why, why_len,
                 "synthetic-ctr: need 1 to %d samples, fields >= 1, rows in [1, %llu] (the "
                 "model's rows=) and a Zipf exponent in [0, 10]; got %zu samples, fields %d, "
                 "rows %llu, zipf %g",
                 INT32_MAX, (unsigned long long)SYN_MAX_ROWS, n, fields,
                 (unsigned long long)rows, zipf);
        return PS_EINVAL;
    }
    ps_dataset *ds = ctr_alloc(n, fields);
    uint64_t nt = rows < SYN_TABLE_ROWS ? rows : SYN_TABLE_ROWS;
    double *cdf = malloc(nt * sizeof *cdf);
    if (!ds || !cdf) {
        snprintf(why, why_len, "synthetic-ctr:%zu: out of memory", n);
        ps_dataset_free(ds);
        free(cdf);
        return PS_ENOMEM;
    }
    ds->count = n;
    snprintf(ds->name, sizeof ds->name, "synthetic-ctr samples %llu..%llu (seed %llu)",
             (unsigned long long)start, (unsigned long long)(start + n - 1),
             (unsigned long long)seed);
    /* inverse-CDF table of ranks 1..nt with weights k^-zipf, summed in order */
    double acc = 0.0;
    for (uint64_t k = 0; k < nt; k++) {
        acc += ps_rng_exp(-zipf * ps_rng_log((double)(k + 1)));
        cdf[k] = acc;
    }
    zipf_inv zi;
    zipf_init(&zi, cdf, nt, rows, zipf);
    for (size_t s = 0; s < n; s++) {
        uint64_t i = start + s;
        uint64_t *ids = ds->ids + s * (size_t)fields;
        double z = SYN_BIAS;
        for (int f = 0; f < fields; f++) {
            ids[f] = zipf_rank(&zi, unit(seed, TAG_IDS, i, (uint64_t)f));
            z += SYN_WEIGHT * (2.0 * unit(seed, TAG_WEIGHT, (uint64_t)f, ids[f]) - 1.0);
        }
        float *dense = ds->images + s * PS_CTR_DENSE;
        for (int j = 0; j < PS_CTR_DENSE; j++) {
            /* a count with a heavy tail: r / (1 - r) is log-logistic */
            double r = unit(seed, TAG_DENSE, i, (uint64_t)j), scale = ldexp(1.0, j);
            double x = floor(scale * r / (1.0 - r));
            dense[j] = (float)log1p(x);
            double c = SYN_DENSE_WEIGHT * (2.0 * unit(seed, TAG_COEF, (uint64_t)j, 0) - 1.0);
            z += c * (x / (x + scale) - 0.5);
        }
        /* Bernoulli(sigmoid(z)): logistic noise below z, in our portable log */
        double u = unit(seed, TAG_LABEL, i, 0);
        ds->labels[s] = ps_rng_log(u) - ps_rng_log(1.0 - u) < z;
    }
    free(cdf);
    *out = ds;
    return 0;
}

/* ---- Criteo -------------------------------------------------------------- */

#define CRITEO_LINE_MAX 8192

uint64_t ps_criteo_id(int field, uint64_t value, int missing)
{
    uint64_t h = missing ? ps_rng_hash(0, PS_CRITEO_TAG, (uint64_t)field + 64, 0)
                         : ps_rng_hash(0, PS_CRITEO_TAG, (uint64_t)field, value);
    return (uint64_t)field << 58 | h >> 6;
}

/* One line (without its newline) into sample s of ds; 0, or PS_EDATA with
 * what is wrong in msg. */
static int criteo_line(char *line, ps_dataset *ds, size_t s, char *msg, size_t msg_len)
{
    char *col[1 + PS_CTR_DENSE + PS_CRITEO_FIELDS];
    int ncol = 0;
    for (char *p = line;; p++) {
        if (ncol < (int)(sizeof col / sizeof *col))
            col[ncol] = p;
        ncol++;
        p = strchr(p, '\t');
        if (!p)
            break;
        *p = '\0';
    }
    if (ncol != 1 + PS_CTR_DENSE + PS_CRITEO_FIELDS) {
        snprintf(msg, msg_len, "expected %d tab-separated fields (label, %d integers, %d "
                 "categorical), got %d", 1 + PS_CTR_DENSE + PS_CRITEO_FIELDS, PS_CTR_DENSE,
                 PS_CRITEO_FIELDS, ncol);
        return PS_EDATA;
    }
    if (strcmp(col[0], "0") != 0 && strcmp(col[0], "1") != 0) {
        snprintf(msg, msg_len, "label must be 0 or 1, got '%.20s'", col[0]);
        return PS_EDATA;
    }
    ds->labels[s] = col[0][0] - '0';
    for (int j = 0; j < PS_CTR_DENSE; j++) {
        const char *t = col[1 + j];
        char *end;
        errno = 0;
        long long x = *t ? strtoll(t, &end, 10) : 0;
        if (*t && (*end || errno || !((*t >= '0' && *t <= '9') || *t == '-'))) {
            snprintf(msg, msg_len, "integer feature %d must be an integer or empty, got '%.20s'",
                     j + 1, t);
            return PS_EDATA;
        }
        ds->images[s * PS_CTR_DENSE + (size_t)j] = (float)log1p((double)(x > 0 ? x : 0));
    }
    for (int f = 0; f < PS_CRITEO_FIELDS; f++) {
        const char *t = col[1 + PS_CTR_DENSE + f];
        size_t len = strlen(t);
        uint64_t v = 0;
        for (size_t k = 0; k < len && len <= 16; k++) {
            int c = t[k], d = c >= '0' && c <= '9' ? c - '0'
                              : c >= 'a' && c <= 'f' ? c - 'a' + 10
                              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) {
                len = 17; /* refused below */
                break;
            }
            v = v << 4 | (uint64_t)d;
        }
        if (len > 16) {
            snprintf(msg, msg_len,
                     "categorical feature %d must be up to 16 hex digits or empty, got '%.20s'",
                     f + 1, t);
            return PS_EDATA;
        }
        ds->ids[s * PS_CRITEO_FIELDS + (size_t)f] = ps_criteo_id(f, v, len == 0);
    }
    return 0;
}

/* Room for at least want samples (doubling). */
static int criteo_grow(ps_dataset *ds, size_t *cap, size_t want)
{
    if (want <= *cap)
        return 0;
    size_t ncap = *cap ? 2 * *cap : 4096;
    float *im = realloc(ds->images, ncap * PS_CTR_DENSE * sizeof(float));
    if (im)
        ds->images = im;
    int32_t *lb = im ? realloc(ds->labels, ncap * sizeof(int32_t)) : NULL;
    if (lb)
        ds->labels = lb;
    uint64_t *ids = lb ? realloc(ds->ids, ncap * PS_CRITEO_FIELDS * sizeof(uint64_t)) : NULL;
    if (!ids)
        return PS_ENOMEM;
    ds->ids = ids;
    *cap = ncap;
    return 0;
}

int ps_dataset_load_criteo(const char *path, size_t max_lines, ps_dataset **out, char *why,
                           size_t why_len)
{
    *out = NULL;
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        snprintf(why, why_len, "%s: cannot open: %s", path,
                 errno ? strerror(errno) : "out of memory");
        return PS_EDATA;
    }
    ps_dataset *ds = ctr_alloc(0, PS_CRITEO_FIELDS);
    char *line = malloc(CRITEO_LINE_MAX);
    size_t cap = 0, lineno = 0;
    int rc = ds && line ? 0 : PS_ENOMEM;
    while (!rc && (max_lines == 0 || ds->count < max_lines) &&
           gzgets(f, line, CRITEO_LINE_MAX)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n')
            line[--len] = '\0';
        else if (!gzeof(f)) {
            snprintf(why, why_len, "%s:%zu: line longer than %d bytes: not the Criteo format",
                     path, lineno, CRITEO_LINE_MAX - 2);
            rc = PS_EDATA;
            break;
        }
        if (len && line[len - 1] == '\r')
            line[--len] = '\0';
        char msg[200];
        if ((rc = criteo_grow(ds, &cap, ds->count + 1)))
            break;
        if ((rc = criteo_line(line, ds, ds->count, msg, sizeof msg))) {
            snprintf(why, why_len, "%s:%zu: %s", path, lineno, msg);
            break;
        }
        ds->count++;
    }
    int gzerr = Z_OK;
    const char *gzmsg = rc ? NULL : gzerror(f, &gzerr);
    if (!rc && gzerr != Z_OK && gzerr != Z_BUF_ERROR) { /* Z_BUF_ERROR: a cut gzip stream */
        snprintf(why, why_len, "%s: read error after line %zu: %s", path, lineno, gzmsg);
        rc = PS_EDATA;
    } else if (!rc && ds->count == 0) {
        snprintf(why, why_len, "%s: no samples (an empty file?)", path);
        rc = PS_EDATA;
    }
    if (rc == PS_ENOMEM)
        snprintf(why, why_len, "%s: out of memory at line %zu", path, lineno);
    gzclose(f);
    free(line);
    if (rc) {
        ps_dataset_free(ds);
        return rc;
    }
    snprintf(ds->name, sizeof ds->name, "%s", path);
    *out = ds;
    return 0;
}

/* ---- --data values ----------------------------------------------------------- */

/* The last n samples of ds moved into a new dataset *tail (ds keeps the rest). */
static int split_tail(ps_dataset *ds, size_t n, ps_dataset **tail)
{
    ps_dataset *t = ctr_alloc(n, ds->num_fields);
    if (!t)
        return PS_ENOMEM;
    size_t first = ds->count - n, f = (size_t)ds->num_fields;
    memcpy(t->images, ds->images + first * PS_CTR_DENSE, n * PS_CTR_DENSE * sizeof(float));
    memcpy(t->labels, ds->labels + first, n * sizeof(int32_t));
    memcpy(t->ids, ds->ids + first * f, n * f * sizeof(uint64_t));
    t->count = n;
    ds->count = first;
    *tail = t;
    return 0;
}

int ps_dataset_open_ctr(const char *spec, uint64_t seed, int fields, uint64_t rows,
                        ps_dataset **train, ps_dataset **test, char *why, size_t why_len)
{
    *train = *test = NULL;
    int synthetic = spec && strncmp(spec, "synthetic-ctr:", 14) == 0;
    if (!ps_dataset_is_ctr(spec)) {
        snprintf(why, why_len, "--data %s: --model ctr reads click-through data: "
                 "synthetic-ctr:N or criteo:PATH", spec ? spec : "(default)");
        return PS_EINVAL;
    }
    /* the head (N or PATH), then KEY=VALUE options */
    char buf[4096], *opt[3] = {0};
    snprintf(buf, sizeof buf, "%s", strchr(spec, ':') + 1);
    int nopt = 0;
    for (char *p = strchr(buf, ','); p; p = strchr(p + 1, ',')) {
        *p = '\0';
        if (nopt == 3)
            goto bad;
        opt[nopt++] = p + 1;
    }
    unsigned long long n = 0, held = 0, lines = 0;
    double zipf = 1.05;
    const char *test_path = NULL;
    char *end;
    for (int i = 0; i < nopt; i++) {
        char *v = strchr(opt[i], '=');
        if (!v)
            goto bad;
        *v++ = '\0';
        errno = 0;
        if (synthetic && !strcmp(opt[i], "test") && !held) {
            held = *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;
            if (!held || *end || errno || held > INT32_MAX)
                goto bad;
        } else if (synthetic && !strcmp(opt[i], "zipf")) {
            zipf = strtod(v, &end);
            if (end == v || *end || errno)
                goto bad;
        } else if (!synthetic && !strcmp(opt[i], "test") && !test_path && *v) {
            test_path = v;
        } else if (!synthetic && !strcmp(opt[i], "lines") && !lines) {
            lines = *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;
            if (!lines || *end || errno)
                goto bad;
        } else {
            goto bad;
        }
    }
    int rc;
    if (synthetic) {
        errno = 0;
        n = buf[0] >= '0' && buf[0] <= '9' ? strtoull(buf, &end, 10) : 0;
        if (!n || *end || errno || n > INT32_MAX)
            goto bad;
        if (!held)
            held = n / 10 ? n / 10 : 1;
        if ((rc = ps_dataset_synthetic_ctr(0, n, seed, fields, rows, zipf, train, why,
                                           why_len)) ||
            (rc = ps_dataset_synthetic_ctr(n, held, seed, fields, rows, zipf, test, why,
                                           why_len))) {
            ps_dataset_free(*train);
            *train = NULL;
        }
        return rc;
    }
    if (!buf[0])
        goto bad;
    if (fields != PS_CRITEO_FIELDS) {
        snprintf(why, why_len,
                 "--data %s: Criteo data has %d categorical fields, the model fields=%d (the "
                 "default ctr has %d)",
                 spec, PS_CRITEO_FIELDS, fields, PS_CRITEO_FIELDS);
        return PS_EINVAL;
    }
    if ((rc = ps_dataset_load_criteo(buf, (size_t)lines, train, why, why_len)))
        return rc;
    if (test_path) {
        rc = ps_dataset_load_criteo(test_path, 0, test, why, why_len);
    } else if ((*train)->count < 2) {
        snprintf(why, why_len, "%s: one line is not enough for a training and a test set", buf);
        rc = PS_EDATA;
    } else {
        size_t tail = (*train)->count / 10 ? (*train)->count / 10 : 1;
        if ((rc = split_tail(*train, tail, test)))
            snprintf(why, why_len, "%s: out of memory for the test set", buf);
        else
            snprintf((*test)->name, sizeof (*test)->name, "%.200s (its last %zu lines)", buf,
                     tail);
    }
    if (rc) {
        ps_dataset_free(*train);
        *train = NULL;
    }
    return rc;
bad:
    snprintf(why, why_len,
             "--data %s: expected synthetic-ctr:N[,test=H][,zipf=S] (N, H sample counts) or "
             "criteo:PATH[,test=PATH2][,lines=N]",
             spec);
    return PS_EINVAL;
}
