/* Data loading: IDX files (real Fashion-MNIST and hand-written ones, gzip and
 * plain), the errors for bad files, synthetic data, and the per-epoch shuffle
 * and its per-worker slices (data.h "shards and batches"). */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "data.h"
#include "ps_error.h"
#include "ps_test.h"
#include "rng.h"

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

PS_TEST(fashion_mnist_loads_60000_and_10000_balanced_28x28_samples_scaled_to_0_1)
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

/* The order of data.h, written out independently: Fisher-Yates of 0..n-1 from
 * ps_rng seeded with seed * 1000003 + epoch + 1.  Pins the order bit for bit,
 * so runs (and the W x b == 1 x W*b training test) stay repeatable. */
static void reference_order(size_t n, uint64_t seed, uint64_t epoch, size_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = i;
    ps_rng r;
    ps_rng_seed(&r, seed * 1000003u + epoch + 1);
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)ps_rng_below(&r, i + 1);
        size_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

/* An elastic job's re-split: a shard made for 4 workers, then split among
 * 3 (or 2) members: each global batch k is the members' slices of order
 * [k*b*n, (k+1)*b*n), disjoint; steps per epoch stay those of 4. */
PS_TEST(a_shard_re_split_among_fewer_members_partitions_each_global_batch)
{
    enum { N = 40, B = 2, WMAX = 4 };
    ps_dataset *ds = index_dataset(N);
    char why[256];
    size_t order[N];
    reference_order(N, 99, 1, order);
    for (int n = 1; n <= WMAX; n++) {
        int seen[N] = {0};
        for (int r = 0; r < n; r++) {
            ps_data_shard *s;
            CHECK_OK(ps_data_shard_create(ds, 0, WMAX, B, 99, &s, why, sizeof why));
            CHECK_OK(ps_data_shard_set_split(s, r, n));
            CHECK_EQ_INT(ps_data_shard_steps_per_epoch(s), N / (B * WMAX));
            for (size_t k = 0; k < N / (B * WMAX); k++) {
                float img[B * 2];
                int32_t lab[B];
                CHECK_OK(ps_data_shard_fill(s, 1, k, img, lab));
                for (int j = 0; j < B; j++) {
                    CHECK_EQ_INT(lab[j], (int)order[k * B * (size_t)n + (size_t)(r * B + j)]);
                    seen[lab[j]]++;
                }
            }
            ps_data_shard_destroy(s);
        }
        for (int i = 0; i < N; i++)
            CHECK_MSG(seen[i] <= 1, "%d members: sample %d taken %d times", n, i, seen[i]);
    }
    ps_data_shard *s;
    CHECK_OK(ps_data_shard_create(ds, 0, WMAX, B, 99, &s, why, sizeof why));
    CHECK_EQ_INT(ps_data_shard_set_split(s, 0, WMAX + 1), PS_EINVAL);
    CHECK_EQ_INT(ps_data_shard_set_split(s, 3, 3), PS_EINVAL);
    ps_data_shard_destroy(s);
    ps_dataset_free(ds);
}

/* Per epoch, for W = 1..4 and b = 1..4 (W*b <= N): every worker's batches are
 * its slices of the epoch's order, the W shards are disjoint, and together
 * they cover exactly the first steps_per_epoch*W*b samples of the order. */
PS_TEST(shards_are_disjoint_and_cover_the_order_prefix)
{
    enum { N = 23 };
    ps_dataset *ds = index_dataset(N);
    char why[256];
    int bad = 0;
    for (int W = 1; W <= 4 && !bad; W++)
        for (int b = 1; b <= 4 && !bad; b++)
            for (uint64_t e = 0; e < 3 && !bad; e++) {
                size_t steps = (size_t)N / (size_t)(W * b), order[N];
                int seen[N] = {0};
                reference_order(N, 99, e, order);
                for (int rank = 0; rank < W && !bad; rank++) {
                    ps_data_shard *s;
                    if (ps_data_shard_create(ds, rank, W, b, 99, &s, why, sizeof why)) {
                        printf("# W=%d b=%d rank %d: %s\n", W, b, rank, why);
                        bad = 1;
                        break;
                    }
                    bad |= ps_data_shard_steps_per_epoch(s) != steps;
                    bad |= memcmp(ps_data_shard_order(s, e), order, sizeof order) != 0;
                    for (size_t k = 0; k < steps && !bad; k++) {
                        float img[4 * 2];
                        int32_t lab[4];
                        if (ps_data_shard_fill(s, e, k, img, lab)) {
                            bad = 1;
                            break;
                        }
                        for (int j = 0; j < b; j++) {
                            int i = lab[j];
                            size_t pos = k * (size_t)(W * b) + (size_t)(rank * b + j);
                            bad |= i < 0 || i >= N || (size_t)i != order[pos] ||
                                   img[2 * j] != (float)i || img[2 * j + 1] != -(float)i;
                            if (!bad)
                                seen[i]++;
                        }
                    }
                    /* one past the last step is refused */
                    float img[4 * 2];
                    int32_t lab[4];
                    bad |= ps_data_shard_fill(s, e, steps, img, lab) != PS_EINVAL;
                    ps_data_shard_destroy(s);
                }
                for (size_t p = 0; p < N && !bad; p++)
                    if (seen[order[p]] != (p < steps * (size_t)(W * b))) {
                        printf("# W=%d b=%d epoch %llu: position %zu (sample %zu) seen %d times\n",
                               W, b, (unsigned long long)e, p, order[p], seen[order[p]]);
                        bad = 1;
                    }
            }
    ps_dataset_free(ds);
    CHECK(!bad);
}

/* W = 2 workers with batch b see exactly what 1 worker with batch 2b sees:
 * rank 0's slice then rank 1's is the single worker's batch, every step of
 * several epochs, visited in the training loop's order (and out of order). */
PS_TEST(two_shards_of_batch_b_equal_one_of_batch_2b)
{
    enum { N = 203, B = 8 };
    ps_dataset *ds = index_dataset(N);
    char why[256];
    ps_data_shard *one, *r0, *r1;
    CHECK_OK(ps_data_shard_create(ds, 0, 1, 2 * B, 5, &one, why, sizeof why));
    CHECK_OK(ps_data_shard_create(ds, 0, 2, B, 5, &r0, why, sizeof why));
    CHECK_OK(ps_data_shard_create(ds, 1, 2, B, 5, &r1, why, sizeof why));
    size_t steps = ps_data_shard_steps_per_epoch(one);
    int same_steps = steps == N / (2 * B) && ps_data_shard_steps_per_epoch(r0) == steps &&
                     ps_data_shard_steps_per_epoch(r1) == steps;
    int bad = 0, checked = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t e = 0; e < 3 && !bad; e++)
            for (size_t i = 0; i < steps && !bad; i++) {
                /* pass 1 jumps around: k from the end, epochs interleaved */
                size_t k = pass == 0 ? i : steps - 1 - i;
                uint64_t ep = pass == 0 ? e : (e + i) % 3;
                float x1[2 * B * 2], x2[2 * B * 2];
                int32_t y1[2 * B], y2[2 * B];
                bad |= ps_data_shard_fill(one, ep, k, x1, y1) != 0;
                bad |= ps_data_shard_fill(r0, ep, k, x2, y2) != 0;
                bad |= ps_data_shard_fill(r1, ep, k, x2 + B * 2, y2 + B) != 0;
                bad |= memcmp(x1, x2, sizeof x1) != 0 || memcmp(y1, y2, sizeof y1) != 0;
                checked++;
            }
    ps_data_shard_destroy(one), ps_data_shard_destroy(r0), ps_data_shard_destroy(r1);
    ps_dataset_free(ds);
    CHECK(same_steps);
    CHECK(!bad);
    CHECK_EQ_INT(checked, 2 * 3 * (N / (2 * B)));
}

/* The order is a function of (seed, epoch): the same for two shards, for
 * every rank, whatever epochs were visited before; it is the reference
 * Fisher-Yates; epochs and seeds differ; and it is a shuffled permutation. */
PS_TEST(epoch_order_is_deterministic_per_seed_and_epoch)
{
    enum { N = 200 };
    ps_dataset *ds = index_dataset(N);
    char why[256];
    ps_data_shard *a, *b, *c, *d;
    CHECK_OK(ps_data_shard_create(ds, 1, 2, 4, 7, &a, why, sizeof why));
    CHECK_OK(ps_data_shard_create(ds, 1, 2, 4, 7, &b, why, sizeof why));
    CHECK_OK(ps_data_shard_create(ds, 1, 2, 4, 8, &c, why, sizeof why));
    CHECK_OK(ps_data_shard_create(ds, 0, 3, 9, 7, &d, why, sizeof why));
    size_t a0[N], a1[N], a1again[N], b1[N], c0[N], d1[N], ref0[N], ref1[N];
    memcpy(a0, ps_data_shard_order(a, 0), sizeof a0);
    memcpy(c0, ps_data_shard_order(c, 0), sizeof c0);
    /* a reaches epoch 1 after 0; b jumps there; d (another rank, world and
     * batch) goes 0, 5, 1; a returns to 1 after 5 */
    memcpy(a1, ps_data_shard_order(a, 1), sizeof a1);
    memcpy(b1, ps_data_shard_order(b, 1), sizeof b1);
    ps_data_shard_order(d, 0);
    ps_data_shard_order(d, 5);
    memcpy(d1, ps_data_shard_order(d, 1), sizeof d1);
    ps_data_shard_order(a, 5);
    memcpy(a1again, ps_data_shard_order(a, 1), sizeof a1again);
    reference_order(N, 7, 0, ref0);
    reference_order(N, 7, 1, ref1);
    /* filling a batch of epoch 1 after epoch 5 reshuffles back to epoch 1 */
    ps_data_shard_order(b, 5);
    float img[4 * 2];
    int32_t lab[4];
    int fill_rc = ps_data_shard_fill(b, 1, 3, img, lab), fill_ok = 1;
    for (int j = 0; j < 4; j++) /* rank 1 of 2, batch 4, step 3: positions 28..31 */
        fill_ok &= (size_t)lab[j] == ref1[3 * 8 + 4 + j];
    int count[N] = {0}, is_perm = 1, is_shuffled = 0;
    for (size_t j = 0; j < N; j++) {
        is_perm &= a0[j] < N && ++count[a0[j]] == 1;
        is_shuffled |= a0[j] != j;
    }
    ps_data_shard_destroy(a), ps_data_shard_destroy(b), ps_data_shard_destroy(c);
    ps_data_shard_destroy(d);
    ps_dataset_free(ds);
    CHECK(memcmp(a0, ref0, sizeof a0) == 0);
    CHECK(memcmp(a1, ref1, sizeof a1) == 0);
    CHECK(memcmp(b1, a1, sizeof b1) == 0);
    CHECK(memcmp(d1, a1, sizeof d1) == 0);
    CHECK(memcmp(a1again, a1, sizeof a1) == 0);
    CHECK(memcmp(a0, a1, sizeof a0) != 0);   /* epochs differ */
    CHECK(memcmp(a0, c0, sizeof a0) != 0);   /* seeds differ */
    CHECK_OK(fill_rc);
    CHECK(fill_ok);
    CHECK(is_perm);
    CHECK(is_shuffled);
}

/* world < 1, rank out of range, batch < 1, W*b > N and no data are refused
 * with a message and no shard; W*b == N is one step per epoch. */
PS_TEST(shard_bad_arguments_are_refused)
{
    enum { N = 23 };
    ps_dataset *ds = index_dataset(N);
    static const struct {
        int rank, world, batch;
        const char *says;
    } bad[] = {
        {0, 0, 1, "out of range"},  {0, -1, 1, "out of range"}, {-1, 2, 1, "out of range"},
        {2, 2, 1, "out of range"},  {0, 1, 0, "batch 0"},       {0, 1, -3, "batch -3"},
        {0, 4, 6, "more than the 23 samples"}, {3, 2, 12, "out of range"},
        {0, 1, 24, "more than the 23 samples"},
    };
    char why[256];
    int failures = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ps_data_shard *s = (ps_data_shard *)1;
        why[0] = '\0';
        int rc = ps_data_shard_create(ds, bad[i].rank, bad[i].world, bad[i].batch, 1, &s, why,
                                      sizeof why);
        if (rc != PS_EINVAL || s != NULL || !strstr(why, bad[i].says)) {
            printf("# rank %d world %d batch %d: rc %d, '%s'\n", bad[i].rank, bad[i].world,
                   bad[i].batch, rc, why);
            failures++;
        }
    }
    ps_data_shard *s = NULL;
    int rc_null = ps_data_shard_create(NULL, 0, 1, 1, 1, &s, why, sizeof why);
    int rc_exact = ps_data_shard_create(ds, 0, 1, N, 1, &s, why, sizeof why);
    size_t steps_exact = rc_exact ? 0 : ps_data_shard_steps_per_epoch(s);
    ps_data_shard_destroy(s);
    ps_dataset_free(ds);
    CHECK_EQ_INT(failures, 0);
    CHECK_EQ_INT(rc_null, PS_EINVAL);
    CHECK_OK(rc_exact);
    CHECK_EQ_INT(steps_exact, 1);
}
