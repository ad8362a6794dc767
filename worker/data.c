#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "ps_error.h"
#include "rng.h"

/* ---- IDX files --------------------------------------------------------- */

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u
/* Far beyond any MNIST-style set; refuses absurd headers before allocating. */
#define IDX_MAX_DIM 4096u
#define IDX_MAX_COUNT (1u << 28)

size_t ps_dataset_sample_size(const ps_dataset *ds)
{
    return (size_t)ds->channels * ds->height * ds->width;
}

/* Which reader takes a --data spec is decided here, so data_ctr.c (the
 * click-through readers) needs this file and not the other way round. */
int ps_dataset_is_ctr(const char *spec)
{
    return spec && (strncmp(spec, "synthetic-ctr:", 14) == 0 || strncmp(spec, "criteo:", 7) == 0);
}

void ps_dataset_free(ps_dataset *ds)
{
    if (!ds)
        return;
    free(ds->images);
    free(ds->labels);
    free(ds->ids);
    free(ds);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Read up to n bytes; *got is how many arrived before end of file.  A gzip
 * stream cut short is reported by zlib as an error after the data it could
 * decode, which for our purposes is also "truncated", so it is not an error
 * here: the caller compares *got with what the header promised. */
static int read_bytes(gzFile f, void *buf, size_t n, size_t *got)
{
    unsigned char *p = buf;
    size_t done = 0;
    while (done < n) {
        size_t want = n - done;
        if (want > (1u << 30))
            want = 1u << 30;
        int r = gzread(f, p + done, (unsigned)want);
        if (r <= 0)
            break;
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

static gzFile open_idx(const char *path, char *why, size_t why_len)
{
    errno = 0;
    gzFile f = gzopen(path, "rb");
    if (!f)
        snprintf(why, why_len, "%s: cannot open: %s", path,
                 errno ? strerror(errno) : "out of memory");
    return f;
}

/* Reads the whole file's payload after a header of hdr_len bytes (magic
 * first).  On success *data holds `expect` bytes from the file (malloc'd). */
static int read_idx(const char *path, uint32_t magic, const char *what, unsigned char *hdr,
                    size_t hdr_len, int (*payload_size)(const unsigned char *hdr, size_t *bytes,
                                                        char *why, size_t why_len),
                    unsigned char **data, size_t *bytes, char *why, size_t why_len)
{
    *data = NULL;
    gzFile f = open_idx(path, why, why_len);
    if (!f)
        return PS_EDATA;
    size_t got;
    read_bytes(f, hdr, hdr_len, &got);
    if (got < 4 || be32(hdr) != magic) {
        if (got < 4)
            snprintf(why, why_len, "%s: not an IDX %s file (only %zu bytes)", path, what, got);
        else
            snprintf(why, why_len,
                     "%s: not an IDX %s file (magic 0x%08x, expected 0x%08x)", path, what,
                     be32(hdr), magic);
        gzclose(f);
        return PS_EDATA;
    }
    if (got < hdr_len) {
        snprintf(why, why_len, "%s: truncated: header needs %zu bytes, file has %zu", path,
                 hdr_len, got);
        gzclose(f);
        return PS_EDATA;
    }
    char msg[200];
    if (payload_size(hdr, bytes, msg, sizeof msg)) {
        snprintf(why, why_len, "%s: %s", path, msg);
        gzclose(f);
        return PS_EDATA;
    }
    /* grow the buffer with the data that actually arrives: a 16-byte header
     * may promise terabytes, which must not be allocated on its word */
    unsigned char *buf = NULL;
    size_t cap = *bytes < (1u << 16) ? *bytes : (1u << 16), r;
    for (got = 0;; cap = cap > *bytes / 2 ? *bytes : 2 * cap) {
        unsigned char *nb = realloc(buf, cap ? cap : 1);
        if (!nb) {
            snprintf(why, why_len, "%s: out of memory for %zu bytes", path, *bytes);
            free(buf);
            gzclose(f);
            return PS_ENOMEM;
        }
        buf = nb;
        read_bytes(f, buf + got, cap - got, &r);
        got += r;
        if (got < cap || cap == *bytes)
            break;
    }
    gzclose(f);
    if (got < *bytes) {
        snprintf(why, why_len, "%s: truncated: header promises %zu bytes of %s data, file has %zu",
                 path, *bytes, what, got);
        free(buf);
        return PS_EDATA;
    }
    *data = buf;
    return 0;
}

static int image_payload(const unsigned char *hdr, size_t *bytes, char *why, size_t why_len)
{
    uint32_t n = be32(hdr + 4), rows = be32(hdr + 8), cols = be32(hdr + 12);
    if (n == 0 || n > IDX_MAX_COUNT || rows == 0 || rows > IDX_MAX_DIM || cols == 0 ||
        cols > IDX_MAX_DIM) {
        snprintf(why, why_len, "implausible header: %u images of %ux%u", n, rows, cols);
        return PS_EDATA;
    }
    *bytes = (size_t)n * rows * cols;
    return 0;
}

static int label_payload(const unsigned char *hdr, size_t *bytes, char *why, size_t why_len)
{
    uint32_t n = be32(hdr + 4);
    if (n == 0 || n > IDX_MAX_COUNT) {
        snprintf(why, why_len, "implausible header: %u labels", n);
        return PS_EDATA;
    }
    *bytes = n;
    return 0;
}

int ps_dataset_load_idx(const char *images_path, const char *labels_path, ps_dataset **out,
                        char *why, size_t why_len)
{
    *out = NULL;
    unsigned char ih[16], lh[8], *pix = NULL, *lab = NULL;
    size_t npix, nlab;
    int rc = read_idx(images_path, IDX_IMAGES_MAGIC, "image", ih, sizeof ih, image_payload, &pix,
                      &npix, why, why_len);
    if (rc)
        return rc;
    rc = read_idx(labels_path, IDX_LABELS_MAGIC, "label", lh, sizeof lh, label_payload, &lab,
                  &nlab, why, why_len);
    if (rc) {
        free(pix);
        return rc;
    }
    uint32_t n = be32(ih + 4), rows = be32(ih + 8), cols = be32(ih + 12);
    if (nlab != n) {
        snprintf(why, why_len, "%s has %u images but %s has %zu labels", images_path, n,
                 labels_path, nlab);
        free(pix);
        free(lab);
        return PS_EDATA;
    }
    ps_dataset *ds = calloc(1, sizeof *ds);
    if (ds) {
        ds->images = malloc(npix * sizeof(float));
        ds->labels = malloc((size_t)n * sizeof(int32_t));
    }
    if (!ds || !ds->images || !ds->labels) {
        snprintf(why, why_len, "%s: out of memory for %u images", images_path, n);
        ps_dataset_free(ds);
        free(pix);
        free(lab);
        return PS_ENOMEM;
    }
    ds->count = n;
    ds->channels = 1;
    ds->height = (int)rows;
    ds->width = (int)cols;
    for (size_t i = 0; i < npix; i++)
        ds->images[i] = (float)pix[i] / 255.0f; /* correctly rounded; 255 -> exactly 1 */
    int max_label = 0;
    for (uint32_t i = 0; i < n; i++) {
        ds->labels[i] = lab[i];
        if (lab[i] > max_label)
            max_label = lab[i];
    }
    /* MNIST-format sets have 10 classes; a small file that happens to miss
     * the top classes must not shrink the model's output layer */
    ds->num_classes = max_label + 1 > 10 ? max_label + 1 : 10;
    snprintf(ds->name, sizeof ds->name, "%s", images_path);
    free(pix);
    free(lab);
    *out = ds;
    return 0;
}

/* dir/name, or dir/name without ".gz" when only the plain file exists. */
static void find_file(const char *dir, const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    if (access(path, F_OK) == 0)
        return;
    char plain[4096];
    snprintf(plain, sizeof plain, "%s", path);
    size_t l = strlen(plain);
    if (l > 3 && strcmp(plain + l - 3, ".gz") == 0) {
        plain[l - 3] = '\0';
        if (access(plain, F_OK) == 0)
            snprintf(path, len, "%s", plain);
    }
    /* neither exists: keep the .gz name so the error names what we wanted */
}

int ps_dataset_load_dir(const char *dir, int split, ps_dataset **out, char *why, size_t why_len)
{
    if (!dir || !*dir)
        dir = PS_DATA_DEFAULT_DIR;
    if (split != PS_SPLIT_TRAIN && split != PS_SPLIT_TEST) {
        snprintf(why, why_len, "ps_dataset_load_dir: split must be train or test");
        return PS_EINVAL;
    }
    const char *prefix = split == PS_SPLIT_TRAIN ? "train" : "t10k";
    char name[64], ipath[4096], lpath[4096];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte.gz", prefix);
    find_file(dir, name, ipath, sizeof ipath);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte.gz", prefix);
    find_file(dir, name, lpath, sizeof lpath);
    int rc = ps_dataset_load_idx(ipath, lpath, out, why, why_len);
    if (rc == 0)
        snprintf((*out)->name, sizeof (*out)->name, "%s (%s)", dir,
                 split == PS_SPLIT_TRAIN ? "train" : "test");
    return rc;
}

/* ---- synthetic data ----------------------------------------------------- */

#define SYN_C 1
#define SYN_H 28
#define SYN_W 28
#define SYN_CLASSES 10
#define SYN_PIXELS (SYN_C * SYN_H * SYN_W)
/* Each sample comes from a latent z ~ N(0, I) of SYN_LATENT dims: the image
 * is a fixed random linear map of z plus a little uniform pixel noise,
 * clamped to [0, 1] (so about half the pixels are 0 and the mean is ~0.12,
 * much like MNIST; a mid-grey offset on every pixel would make plain SGD
 * badly conditioned), and the label is the argmax of a fixed random linear
 * teacher on z plus small noise.  Living on a low-dimensional subspace makes
 * it learnable in a few hundred SGD steps, unlike i.i.d. pixels. */
#define SYN_LATENT 16
#define SYN_PIXEL_SCALE 0.3   /* per-pixel std of the signal before clamping */
#define SYN_PIXEL_NOISE 0.05  /* half-width of the uniform pixel noise */
#define SYN_LABEL_NOISE 0.25  /* teacher logits have std ~4 */

int ps_dataset_synthetic(size_t n, uint64_t seed, int split, ps_dataset **out, char *why,
                         size_t why_len)
{
    *out = NULL;
    if (n == 0 || n > (size_t)INT32_MAX) {
        snprintf(why, why_len, "synthetic:%zu: need between 1 and %d samples", n, INT32_MAX);
        return PS_EINVAL;
    }
    ps_dataset *ds = calloc(1, sizeof *ds);
    /* basis [pixels][latent] then teacher [classes][latent] */
    double *basis = malloc(sizeof(double) * (SYN_PIXELS + SYN_CLASSES) * SYN_LATENT);
    if (ds && n <= SIZE_MAX / (SYN_PIXELS * sizeof(float))) {
        ds->images = malloc(n * SYN_PIXELS * sizeof(float));
        ds->labels = malloc(n * sizeof(int32_t));
    }
    if (!ds || !basis || !ds->images || !ds->labels) {
        snprintf(why, why_len, "synthetic:%zu: out of memory", n);
        ps_dataset_free(ds);
        free(basis);
        return PS_ENOMEM;
    }
    ds->count = n;
    ds->channels = SYN_C;
    ds->height = SYN_H;
    ds->width = SYN_W;
    ds->num_classes = SYN_CLASSES;
    snprintf(ds->name, sizeof ds->name, "synthetic:%zu (seed %llu, %s)", n,
             (unsigned long long)seed, split == PS_SPLIT_TRAIN ? "train" : "test");

    /* basis and teacher depend on the seed only, so train and test agree */
    ps_rng r;
    uint64_t st = seed ^ 0x7465616368657221ull; /* "teacher!" */
    ps_rng_seed(&r, ps_splitmix64(&st));
    for (int i = 0; i < (SYN_PIXELS + SYN_CLASSES) * SYN_LATENT; i++)
        basis[i] = ps_rng_normal(&r) * (1.0 / 4.0); /* 1/sqrt(SYN_LATENT): unit-variance pixels */
    const double *teacher = basis + SYN_PIXELS * SYN_LATENT;

    st = seed ^ 0x73616d706c657321ull; /* "samples!" */
    st = ps_splitmix64(&st) + (uint64_t)split;
    ps_rng_seed(&r, ps_splitmix64(&st));
    for (size_t s = 0; s < n; s++) {
        double z[SYN_LATENT];
        for (int k = 0; k < SYN_LATENT; k++)
            z[k] = ps_rng_normal(&r);
        /* fixed summation order (gcc does not reassociate without
         * -ffast-math) keeps the data identical everywhere */
        float *x = ds->images + s * SYN_PIXELS;
        for (int j = 0; j < SYN_PIXELS; j++) {
            double v = 0.0;
            for (int k = 0; k < SYN_LATENT; k++)
                v += basis[j * SYN_LATENT + k] * z[k];
            v = SYN_PIXEL_SCALE * v + SYN_PIXEL_NOISE * (2.0 * ps_rng_uniform(&r) - 1.0);
            x[j] = (float)(v < 0.0 ? 0.0 : v > 1.0 ? 1.0 : v);
        }
        int best = 0;
        double best_v = 0.0;
        for (int c = 0; c < SYN_CLASSES; c++) {
            double v = 0.0;
            for (int k = 0; k < SYN_LATENT; k++)
                v += teacher[c * SYN_LATENT + k] * z[k];
            v = 4.0 * v + SYN_LABEL_NOISE * ps_rng_normal(&r);
            if (c == 0 || v > best_v) {
                best = c;
                best_v = v;
            }
        }
        ds->labels[s] = best;
    }
    free(basis);
    *out = ds;
    return 0;
}

int ps_dataset_open(const char *spec, int split, uint64_t seed, ps_dataset **out, char *why,
                    size_t why_len)
{
    *out = NULL;
    if (ps_dataset_is_ctr(spec)) {
        snprintf(why, why_len,
                 "--data %s is click-through data: it needs --model ctr[:KEY=VALUE,...]", spec);
        return PS_EINVAL;
    }
    if (spec && strncmp(spec, "synthetic:", 10) == 0) {
        const char *p = spec + 10;
        char *end;
        errno = 0;
        unsigned long long n = (*p >= '0' && *p <= '9') ? strtoull(p, &end, 10) : 0;
        if (n == 0 || *end || errno || n > INT32_MAX) {
            snprintf(why, why_len,
                     "--data %s: expected synthetic:N with N a sample count in [1, %d], e.g. "
                     "synthetic:60000",
                     spec, INT32_MAX);
            return PS_EINVAL;
        }
        return ps_dataset_synthetic((size_t)n, seed, split, out, why, why_len);
    }
    return ps_dataset_load_dir(spec, split, out, why, why_len);
}

/* ---- shards ------------------------------------------------------------ */

struct ps_data_shard {
    const ps_dataset *ds;
    int rank, world, batch;
    int world_max;     /* world at create: steps per epoch stay its */
    uint64_t seed;
    size_t steps;      /* per epoch */
    uint64_t epoch;    /* the epoch order[] holds, when have_order */
    int have_order;
    size_t *order;     /* that epoch's order of the whole dataset */
};

int ps_data_shard_create(const ps_dataset *ds, int rank, int world, int batch, uint64_t seed,
                         ps_data_shard **out, char *why, size_t why_len)
{
    *out = NULL;
    if (!ds || ds->count == 0) {
        snprintf(why, why_len, "shard: no samples to shard");
        return PS_EINVAL;
    }
    if (world < 1 || rank < 0 || rank >= world) {
        snprintf(why, why_len, "shard: rank %d of %d workers is out of range", rank, world);
        return PS_EINVAL;
    }
    if (batch < 1) {
        snprintf(why, why_len, "shard: batch %d must be at least 1", batch);
        return PS_EINVAL;
    }
    /* both factors are ints, so the product fits in 64 bits */
    size_t per_step = (size_t)batch * (size_t)world;
    if (per_step > ds->count) {
        snprintf(why, why_len,
                 "batch %d x %d workers is more than the %zu samples of %s: not one step per "
                 "epoch",
                 batch, world, ds->count, ds->name);
        return PS_EINVAL;
    }
    ps_data_shard *s = calloc(1, sizeof *s);
    if (s)
        s->order = malloc(ds->count * sizeof *s->order);
    if (!s || !s->order) {
        free(s);
        snprintf(why, why_len, "shard: out of memory for the order of %zu samples", ds->count);
        return PS_ENOMEM;
    }
    s->ds = ds;
    s->rank = rank;
    s->world = s->world_max = world;
    s->batch = batch;
    s->seed = seed;
    s->steps = ds->count / per_step;
    *out = s;
    return 0;
}

void ps_data_shard_destroy(ps_data_shard *s)
{
    if (!s)
        return;
    free(s->order);
    free(s);
}

int ps_data_shard_set_split(ps_data_shard *s, int rank, int world)
{
    if (world < 1 || world > s->world_max || rank < 0 || rank >= world)
        return PS_EINVAL;
    s->rank = rank;
    s->world = world;
    return 0;
}

size_t ps_data_shard_steps_per_epoch(const ps_data_shard *s)
{
    return s->steps;
}

const size_t *ps_data_shard_order(ps_data_shard *s, uint64_t epoch)
{
    if (s->have_order && s->epoch == epoch)
        return s->order;
    /* from the identity each time, so the order depends on (seed, epoch) only */
    size_t n = s->ds->count;
    for (size_t i = 0; i < n; i++)
        s->order[i] = i;
    ps_rng r;
    ps_rng_seed(&r, s->seed * 1000003u + epoch + 1);
    for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates; n >= 1 (checked at create) */
        size_t j = (size_t)ps_rng_below(&r, i + 1);
        size_t t = s->order[i];
        s->order[i] = s->order[j];
        s->order[j] = t;
    }
    s->epoch = epoch;
    s->have_order = 1;
    return s->order;
}

/* Where this worker's slice of global batch k starts in the epoch's order. */
static size_t slice_base(const ps_data_shard *s, size_t k)
{
    return k * (size_t)s->batch * (size_t)s->world + (size_t)s->rank * (size_t)s->batch;
}

int ps_data_shard_fill(ps_data_shard *s, uint64_t epoch, size_t k, float *images,
                       int32_t *labels)
{
    if (k >= s->steps)
        return PS_EINVAL;
    const size_t *order = ps_data_shard_order(s, epoch);
    size_t ss = ps_dataset_sample_size(s->ds);
    size_t base = slice_base(s, k);
    for (int j = 0; j < s->batch; j++) {
        size_t idx = order[base + (size_t)j];
        memcpy(images + (size_t)j * ss, s->ds->images + idx * ss, ss * sizeof(float));
        labels[j] = s->ds->labels[idx];
    }
    return 0;
}

int ps_data_shard_fill_ids(ps_data_shard *s, uint64_t epoch, size_t k, uint64_t *ids)
{
    if (k >= s->steps || !s->ds->ids)
        return PS_EINVAL;
    const size_t *order = ps_data_shard_order(s, epoch);
    size_t f = (size_t)s->ds->num_fields, base = slice_base(s, k);
    for (int j = 0; j < s->batch; j++)
        memcpy(ids + (size_t)j * f, s->ds->ids + order[base + (size_t)j] * f, f * sizeof *ids);
    return 0;
}
