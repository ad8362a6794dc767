/* Data loading: IDX files (real Fashion-MNIST and hand-written ones, gzip and
 * plain), the errors for bad files, synthetic data, shards and shuffles. */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "data.h"
#include "ps_error.h"
#include "ps_test.h"

static void be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Write bytes to path, gzip-compressed when gz. */
static int put_file(const char *path, const unsigned char *buf, size_t n, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (!f)
            return -1;
        int put = n ? gzwrite(f, buf, (unsigned)n) : 0;
        return (gzclose(f) == Z_OK && (size_t)put == n) ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t put = fwrite(buf, 1, n, f);
    return (fclose(f) == 0 && put == n) ? 0 : -1;
}

/* An IDX image file of n images of rows x cols with pixel (i, j) = (7*i + j)
 * mod 256, keeping only the first `keep` payload bytes (truncation). */
static int write_images(const char *path, uint32_t magic, uint32_t n, uint32_t rows,
                        uint32_t cols, size_t keep, int gz)
{
    size_t payload = (size_t)n * rows * cols;
    unsigned char *buf = malloc(16 + payload);
    be32(buf, magic);
    be32(buf + 4, n);
    be32(buf + 8, rows);
    be32(buf + 12, cols);
    for (size_t i = 0; i < payload; i++)
        buf[16 + i] = (unsigned char)((7 * (i / (rows * cols)) + i % (rows * cols)) % 256);
    if (keep > payload)
        keep = payload;
    int rc = put_file(path, buf, 16 + keep, gz);
    free(buf);
    return rc;
}

/* An IDX label file of n labels, label i = i % 10. */
static int write_labels(const char *path, uint32_t n, int gz)
{
    unsigned char *buf = malloc(8 + n);
    be32(buf, 0x00000801);
    be32(buf + 4, n);
    for (uint32_t i = 0; i < n; i++)
        buf[8 + i] = (unsigned char)(i % 10);
    int rc = put_file(path, buf, 8 + n, gz);
    free(buf);
    return rc;
}

static const char *tmp(const char *name)
{
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", ps_test_tmpdir(), name);
    return p;
}

/* ---- real files ------------------------------------------------------------ */

static int check_fashion(int split, size_t want_count)
{
    if (access(PS_DATA_DEFAULT_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0)
        return -1;
    char why[512];
    ps_dataset *ds;
    if (ps_dataset_load_dir(NULL, split, &ds, why, sizeof why)) {
        printf("# %s\n", why);
        return 1;
    }
    int bad = ds->count != want_count || ds->channels != 1 || ds->height != 28 ||
              ds->width != 28 || ds->num_classes != 10;
    size_t per_class[10] = {0};
    float lo = 1, hi = 0;
    for (size_t i = 0; i < ds->count * 784; i++) {
        lo = ds->images[i] < lo ? ds->images[i] : lo;
        hi = ds->images[i] > hi ? ds->images[i] : hi;
    }
    for (size_t i = 0; i < ds->count && !bad; i++) {
        if (ds->labels[i] < 0 || ds->labels[i] >= 10)
            bad = 1;
        else
            per_class[ds->labels[i]]++;
    }
    /* Fashion-MNIST is balanced: count/10 per class */
    for (int c = 0; c < 10 && !bad; c++)
        bad = per_class[c] != want_count / 10;
    /* the scaling maps byte 0 to 0 and 255 to exactly 1 */
    bad |= lo != 0.0f || hi != 1.0f;
    if (bad)
        printf("# %s: %zu samples %dx%dx%d, %d classes, pixels in [%g, %g]\n", ds->name,
               ds->count, ds->channels, ds->height, ds->width, ds->num_classes, lo, hi);
    ps_dataset_free(ds);
    return bad;
}

PS_TEST(fashion_mnist_train_and_test_files)
{
    int rc = check_fashion(PS_SPLIT_TRAIN, 60000);
    if (rc < 0)
        SKIP("%s not installed (Debian package dataset-fashion-mnist)", PS_DATA_DEFAULT_DIR);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(check_fashion(PS_SPLIT_TEST, 10000), 0);
}

/* ---- hand-written files ------------------------------------------------------ */

PS_TEST(idx_reads_gzip_and_plain_files)
{
    for (int gz = 0; gz < 2; gz++) {
        const char *ip = tmp(gz ? "img.gz" : "img"), *lp = tmp(gz ? "lab.gz" : "lab");
        CHECK_OK(write_images(ip, 0x00000803, 3, 2, 5, SIZE_MAX, gz));
        CHECK_OK(write_labels(lp, 3, gz));
        char why[512];
        ps_dataset *ds = NULL;
        int rc = ps_dataset_load_idx(ip, lp, &ds, why, sizeof why);
        CHECK_MSG(rc == 0, "%s", why);
        int ok = ds->count == 3 && ds->channels == 1 && ds->height == 2 && ds->width == 5 &&
                 ds->num_classes == 10;
        for (size_t i = 0; i < 3 * 10 && ok; i++)
            ok = ds->images[i] == (float)((7 * (i / 10) + i % 10) % 256) / 255.0f;
        for (int i = 0; i < 3 && ok; i++)
            ok = ds->labels[i] == i;
        ps_dataset_free(ds);
        CHECK_MSG(ok, "gz=%d: wrong contents", gz);
    }
}

PS_TEST(load_dir_finds_plain_files_without_gz)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/plain", ps_test_tmpdir());
    CHECK_OK(mkdir(dir, 0755));
    char ip[600], lp[600], why[512];
    snprintf(ip, sizeof ip, "%s/t10k-images-idx3-ubyte", dir);
    snprintf(lp, sizeof lp, "%s/t10k-labels-idx1-ubyte", dir);
    CHECK_OK(write_images(ip, 0x00000803, 4, 28, 28, SIZE_MAX, 0));
    CHECK_OK(write_labels(lp, 4, 0));
    ps_dataset *ds = NULL;
    int rc = ps_dataset_load_dir(dir, PS_SPLIT_TEST, &ds, why, sizeof why);
    CHECK_MSG(rc == 0, "%s", why);
    size_t n = ds->count;
    ps_dataset_free(ds);
    CHECK_EQ_INT(n, 4);
    /* the train split is not there: the message names the .gz we looked for */
    rc = ps_dataset_load_dir(dir, PS_SPLIT_TRAIN, &ds, why, sizeof why);
    CHECK_EQ_INT(rc, PS_EDATA);
    CHECK_MSG(strstr(why, "train-images-idx3-ubyte.gz") && strstr(why, "No such file"), "%s",
              why);
}

/* Load and expect PS_EDATA with every needle in the message. */
static int expect_refusal(const char *ip, const char *lp, const char *n1, const char *n2)
{
    char why[512] = "";
    ps_dataset *ds = NULL;
    int rc = ps_dataset_load_idx(ip, lp, &ds, why, sizeof why);
    ps_dataset_free(ds);
    if (rc != PS_EDATA || ds || !strstr(why, n1) || (n2 && !strstr(why, n2))) {
        printf("# rc %d, message '%s', wanted '%s' and '%s'\n", rc, why, n1, n2 ? n2 : "");
        return 1;
    }
    return 0;
}

PS_TEST(idx_wrong_magic_is_refused)
{
    const char *ip = tmp("magic-img.gz"), *lp = tmp("magic-lab.gz");
    CHECK_OK(write_images(ip, 0x00000801, 3, 2, 2, SIZE_MAX, 1));
    CHECK_OK(write_labels(lp, 3, 1));
    CHECK_EQ_INT(expect_refusal(ip, lp, ip, "magic 0x00000801, expected 0x00000803"), 0);
    /* a label file passed as images, and images passed as labels */
    CHECK_EQ_INT(expect_refusal(lp, lp, lp, "not an IDX image file"), 0);
    CHECK_OK(write_images(ip, 0x00000803, 3, 2, 2, SIZE_MAX, 1));
    CHECK_EQ_INT(expect_refusal(ip, ip, ip, "not an IDX label file"), 0);
}

PS_TEST(idx_truncated_is_refused)
{
    const char *lp = tmp("trunc-lab");
    CHECK_OK(write_labels(lp, 3, 0));
    for (int gz = 0; gz < 2; gz++) {
        const char *ip = tmp(gz ? "trunc-img.gz" : "trunc-img");
        /* header promises 3 images of 4x4, 40 of 48 bytes follow */
        CHECK_OK(write_images(ip, 0x00000803, 3, 4, 4, 40, gz));
        CHECK_EQ_INT(expect_refusal(ip, lp, ip, "truncated"), 0);
        /* a header cut short */
        CHECK_OK(put_file(ip, (const unsigned char *)"\0\0\x08\x03\0\0", 6, gz));
        CHECK_EQ_INT(expect_refusal(ip, lp, ip, "truncated"), 0);
    }
    /* a gzip stream cut in the middle */
    const char *full = tmp("full-img.gz"), *cut = tmp("cut-img.gz");
    CHECK_OK(write_images(full, 0x00000803, 3, 28, 28, SIZE_MAX, 1));
    FILE *f = fopen(full, "rb");
    CHECK(f);
    unsigned char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    CHECK_OK(put_file(cut, buf, n / 2, 0));
    CHECK_EQ_INT(expect_refusal(cut, lp, cut, "truncated"), 0);
}

PS_TEST(idx_missing_file_is_refused)
{
    const char *ip = tmp("img-ok"), *lp = tmp("lab-ok");
    CHECK_OK(write_images(ip, 0x00000803, 3, 2, 2, SIZE_MAX, 0));
    CHECK_OK(write_labels(lp, 3, 0));
    const char *gone = tmp("no-such-file.gz");
    CHECK_EQ_INT(expect_refusal(gone, lp, gone, "No such file"), 0);
    CHECK_EQ_INT(expect_refusal(ip, gone, gone, "No such file"), 0);
}

PS_TEST(idx_count_mismatch_is_refused)
{
    const char *ip = tmp("mm-img"), *lp = tmp("mm-lab");
    CHECK_OK(write_images(ip, 0x00000803, 3, 2, 2, SIZE_MAX, 0));
    CHECK_OK(write_labels(lp, 2, 0));
    CHECK_EQ_INT(expect_refusal(ip, lp, "has 3 images", "has 2 labels"), 0);
}

/* ---- synthetic -------------------------------------------------------------- */

PS_TEST(synthetic_data_is_deterministic_and_balanced)
{
    char why[256];
    ps_dataset *a = NULL, *b = NULL, *t = NULL, *o = NULL;
    int rc = ps_dataset_open("synthetic:2000", PS_SPLIT_TRAIN, 5, &a, why, sizeof why);
    rc |= ps_dataset_open("synthetic:2000", PS_SPLIT_TRAIN, 5, &b, why, sizeof why);
    rc |= ps_dataset_open("synthetic:2000", PS_SPLIT_TEST, 5, &t, why, sizeof why);
    rc |= ps_dataset_open("synthetic:2000", PS_SPLIT_TRAIN, 6, &o, why, sizeof why);
    int same = 0, test_differs = 0, seed_differs = 0, in_range = 1, min_class = 2000;
    if (!rc) {
        size_t px = 2000 * 784;
        same = memcmp(a->images, b->images, px * 4) == 0 &&
               memcmp(a->labels, b->labels, 2000 * 4) == 0;
        test_differs = memcmp(a->images, t->images, px * 4) != 0;
        seed_differs = memcmp(a->images, o->images, px * 4) != 0;
        for (size_t i = 0; i < px; i++)
            in_range &= a->images[i] >= 0.0f && a->images[i] <= 1.0f;
        int per[10] = {0};
        for (int i = 0; i < 2000; i++)
            per[a->labels[i]]++;
        for (int c = 0; c < 10; c++)
            min_class = per[c] < min_class ? per[c] : min_class;
        in_range &= a->count == 2000 && a->num_classes == 10 && a->height == 28;
    }
    ps_dataset_free(a), ps_dataset_free(b), ps_dataset_free(t), ps_dataset_free(o);
    CHECK_MSG(rc == 0, "%s", why);
    CHECK(same);
    CHECK(test_differs);
    CHECK(seed_differs);
    CHECK(in_range);
    /* every class present; a random teacher is not perfectly balanced */
    CHECK_MSG(min_class >= 50, "smallest class has %d of 2000", min_class);

    const char *bad[] = {"synthetic:", "synthetic:0", "synthetic:abc", "synthetic:-5",
                         "synthetic:10x", "synthetic:99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ps_dataset *d = NULL;
        int r = ps_dataset_open(bad[i], PS_SPLIT_TRAIN, 1, &d, why, sizeof why);
        ps_dataset_free(d);
        CHECK_MSG(r == PS_EINVAL && strstr(why, bad[i]), "'%s': rc %d, '%s'", bad[i], r, why);
    }
}

/* ---- shards ----------------------------------------------------------------- */

/* A dataset of n 1x1x2 samples whose label and pixels hold the index. */
static ps_dataset *index_dataset(size_t n)
{
    ps_dataset *ds = calloc(1, sizeof *ds);
    ds->count = n;
    ds->channels = 1, ds->height = 1, ds->width = 2, ds->num_classes = 10;
    ds->images = malloc(n * 2 * sizeof(float));
    ds->labels = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        ds->images[2 * i] = (float)i;
        ds->images[2 * i + 1] = -(float)i;
        ds->labels[i] = (int32_t)i;
    }
    snprintf(ds->name, sizeof ds->name, "index");
    return ds;
}

PS_TEST(shards_are_disjoint_and_cover_everything)
{
    enum { N = 23 };
    ps_dataset *ds = index_dataset(N);
    char why[256];
    int bad = 0;
    for (int W = 1; W <= 3 && !bad; W++) {
        int seen[N] = {0};
        for (int rank = 0; rank < W && !bad; rank++) {
            ps_data_shard *s;
            if (ps_data_shard_create(ds, rank, W, 99, &s, why, sizeof why)) {
                bad = 1;
                break;
            }
            /* sizes differ by at most one: ceil or floor of N / W */
            size_t size = ps_data_shard_size(s);
            bad |= size != (size_t)(N - rank + W - 1) / W;
            /* walk one epoch in batches of 4 through the copying iterator */
            float img[4 * 2];
            int32_t lab[4];
            size_t got = 0;
            while (got < size && !bad) {
                int n;
                uint64_t epoch;
                if (ps_data_shard_next_batch(s, 4, img, lab, &n, &epoch) || epoch != 0 || n < 1) {
                    bad = 1;
                    break;
                }
                /* never spans the epoch end: full batches, then the rest */
                bad |= (size_t)n != (size - got < 4 ? size - got : 4);
                for (int j = 0; j < n; j++) {
                    int i = lab[j];
                    bad |= i < 0 || i >= N || i % W != rank || img[2 * j] != (float)i ||
                           img[2 * j + 1] != -(float)i;
                    if (!bad)
                        seen[i]++;
                }
                got += (size_t)n;
            }
            /* the next batch starts epoch 1 */
            int n;
            uint64_t epoch = 0;
            bad |= ps_data_shard_next_batch(s, 4, img, lab, &n, &epoch) != 0 || epoch != 1;
            ps_data_shard_destroy(s);
        }
        for (int i = 0; i < N; i++)
            if (seen[i] != 1) {
                printf("# W=%d: sample %d seen %d times\n", W, i, seen[i]);
                bad = 1;
            }
    }
    ps_data_shard *s = NULL;
    int rc_world = ps_data_shard_create(ds, 0, 0, 1, &s, why, sizeof why);
    int rc_rank = ps_data_shard_create(ds, 3, 3, 1, &s, why, sizeof why);
    int rc_small = ps_data_shard_create(ds, 30, 40, 1, &s, why, sizeof why);
    ps_dataset_free(ds);
    CHECK(!bad);
    CHECK_EQ_INT(rc_world, PS_EINVAL);
    CHECK_EQ_INT(rc_rank, PS_EINVAL);
    CHECK_EQ_INT(rc_small, PS_EINVAL);
}

static void order_of(ps_data_shard *s, size_t *out)
{
    for (size_t j = 0; j < ps_data_shard_size(s); j++)
        out[j] = ps_data_shard_index(s, j);
}

PS_TEST(epoch_shuffle_is_deterministic)
{
    enum { N = 200 };
    ps_dataset *ds = index_dataset(N);
    char why[256];
    ps_data_shard *a, *b, *c;
    CHECK_OK(ps_data_shard_create(ds, 1, 2, 7, &a, why, sizeof why));
    CHECK_OK(ps_data_shard_create(ds, 1, 2, 7, &b, why, sizeof why));
    CHECK_OK(ps_data_shard_create(ds, 1, 2, 8, &c, why, sizeof why));
    size_t a0[N], a1[N], b0[N], b1[N], c0[N], a1again[N];
    size_t n = ps_data_shard_size(a);
    order_of(a, a0);
    order_of(b, b0);
    order_of(c, c0);
    /* reach epoch 1 of b by iterating, of a by jumping */
    float img[64 * 2];
    int32_t lab[64];
    int got;
    uint64_t epoch = 0;
    while (epoch == 0)
        ps_data_shard_next_batch(b, 64, img, lab, &got, &epoch);
    ps_data_shard_set_epoch(a, 1);
    order_of(a, a1);
    order_of(b, b1);
    /* the first batch of epoch 1 is the start of its order */
    int first_ok = got == 64;
    for (int j = 0; j < got; j++)
        first_ok &= (size_t)lab[j] == b1[j];
    ps_data_shard_set_epoch(a, 5);
    ps_data_shard_set_epoch(a, 1);
    order_of(a, a1again);
    int is_shuffled = 0, sorted_set = 1;
    for (size_t j = 0; j < n; j++) {
        is_shuffled |= a0[j] != 1 + 2 * j;
        sorted_set &= a0[j] % 2 == 1;
    }
    int same0 = memcmp(a0, b0, n * sizeof(size_t)) == 0;
    int same1 = memcmp(a1, b1, n * sizeof(size_t)) == 0;
    int epochs_differ = memcmp(a0, a1, n * sizeof(size_t)) != 0;
    int seeds_differ = memcmp(a0, c0, n * sizeof(size_t)) != 0;
    int repeatable = memcmp(a1, a1again, n * sizeof(size_t)) == 0;
    ps_data_shard_destroy(a), ps_data_shard_destroy(b), ps_data_shard_destroy(c);
    ps_dataset_free(ds);
    CHECK(same0);
    CHECK(same1);
    CHECK(first_ok);
    CHECK(epochs_differ);
    CHECK(seeds_differ);
    CHECK(repeatable);
    CHECK(is_shuffled);
    CHECK(sorted_set);
}
