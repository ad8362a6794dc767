/* Replays every committed fuzz input (tests/fuzz/corpus/<target>/ and
 * tests/fuzz/regress/<target>/) through the checks the libFuzzer targets run
 * (tests/fuzz/fuzz_checks.h), so `make test` and `make test SAN=1` keep every
 * crash the fuzzers ever found fixed, without clang.
 *
 * The directories are found relative to the repository root: the current
 * directory (tests run from the root), its parents, or the directories above
 * this program (build/tests/..), in that order; PS_FUZZ_DIR overrides. */
#include <dirent.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tests/fuzz/fuzz_checks.h"
#include "ps_table_decl.h"
#include "ps_test.h"

typedef const char *(*check_fn)(const uint8_t *, size_t, char *, size_t);

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* tests/fuzz of this checkout, or "" */
static const char *fuzz_dir(void)
{
    static char dir[PATH_MAX + 32];
    if (dir[0])
        return dir;
    const char *env = getenv("PS_FUZZ_DIR");
    if (env && *env) {
        snprintf(dir, sizeof dir, "%s", env);
        return dir;
    }
    char base[PATH_MAX], probe[PATH_MAX + 32];
    for (int from = 0; from < 2; from++) {
        if (from == 0) {
            if (!getcwd(base, sizeof base))
                continue;
        } else {
            ssize_t n = readlink("/proc/self/exe", base, sizeof base - 1);
            if (n <= 0)
                continue;
            base[n] = 0;
        }
        for (;;) {
            snprintf(probe, sizeof probe, "%s/tests/fuzz/corpus", base);
            if (is_dir(probe)) {
                snprintf(dir, sizeof dir, "%s/tests/fuzz", base);
                return dir;
            }
            char *slash = strrchr(base, '/');
            if (!slash || slash == base)
                break;
            *slash = 0;
        }
    }
    return "";
}

static int read_all(const char *path, uint8_t **data, size_t *size)
{
    *data = (uint8_t *)ps_test_read_file(path, size);
    return *data ? 0 : -1;
}

/* Run check on every regular file of dir; returns files replayed, or -1 on
 * a failed check (already reported).  A missing dir counts 0. */
static int replay_dir(const char *dir, check_fn check)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (de->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        uint8_t *data = NULL;
        size_t size = 0;
        if (read_all(path, &data, &size) != 0) {
            ps_test_fail(__FILE__, __LINE__, "cannot read %s", path);
            n = -1;
            break;
        }
        char msg[512];
        const char *bad = check(data, size, msg, sizeof msg);
        free(data);
        if (bad) {
            ps_test_fail(__FILE__, __LINE__, "%s: %s", path, bad);
            n = -1;
            break;
        }
        n++;
    }
    closedir(d);
    return n;
}

static void replay_target(const char *target, check_fn check)
{
    const char *root = fuzz_dir();
    CHECK_MSG(root[0], "tests/fuzz/corpus not found from the current directory or this program "
                       "(run from the repository root, or set PS_FUZZ_DIR)");
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/corpus/%s", root, target);
    int seeds = replay_dir(dir, check);
    CHECK(seeds >= 0);
    CHECK_MSG(seeds > 0, "no seeds in %s (make fuzz-seeds writes them)", dir);
    snprintf(dir, sizeof dir, "%s/regress/%s", root, target);
    int crashes = replay_dir(dir, check);
    CHECK(crashes >= 0);
    printf("# %s: %d seeds, %d regression inputs replayed\n", target, seeds, crashes);
}

PS_TEST(fuzz_proto_corpus_and_regressions_pass)
{
    replay_target("fuzz_proto", fuzz_check_proto);
}

PS_TEST(fuzz_idx_corpus_and_regressions_pass)
{
    replay_target("fuzz_idx", fuzz_check_idx);
}

PS_TEST(fuzz_smap_corpus_and_regressions_pass)
{
    replay_target("fuzz_smap", fuzz_check_smap);
}

/* The seeds are what the fuzzers start from: they must be real messages and
 * real IDX files, not inputs the decoders refuse at the first byte. */
PS_TEST(fuzz_seeds_are_valid_inputs)
{
    const char *root = fuzz_dir();
    CHECK_MSG(root[0], "tests/fuzz/corpus not found");
    char path[PATH_MAX + 64];
    uint8_t *data;
    size_t size;
    ps_header h;
    char why[256];
    /* a request of every type (error is a reply only) */
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        if (t == PS_MSG_ERROR)
            continue;
        snprintf(path, sizeof path, "%s/corpus/fuzz_proto/%s-request.bin", root,
                 ps_msg_type_name(t));
        CHECK_MSG(read_all(path, &data, &size) == 0, "missing seed %s (make fuzz-seeds)", path);
        int rc = ps_proto_decode(data, size, &h, why, sizeof why);
        free(data);
        CHECK_MSG(rc == 0, "%s: %s", path, why);
        CHECK_EQ_INT(h.type, t);
    }
    /* the table messages with their first frame: valid as the server takes
     * them, and a declaration the server would accept */
    static const char *const sparse[] = {"spull-request", "spull-reply", "spush-request",
                                         "spushpull-request", "spushpull-reply"};
    for (size_t i = 0; i < sizeof sparse / sizeof sparse[0]; i++) {
        snprintf(path, sizeof path, "%s/corpus/fuzz_proto/%s-payload.bin", root, sparse[i]);
        CHECK_MSG(read_all(path, &data, &size) == 0, "missing seed %s (make fuzz-seeds)", path);
        size_t hl = fuzz_msgpack_len(data, size, 0, 0);
        int rc = hl ? ps_proto_decode(data, hl, &h, why, sizeof why) : -1;
        size_t frames[3] = {size - hl, 3 * 4 * 4, 2 * 8};
        int nf = ps_payload_frames((h.flags & PS_FLAG_REPLY) ? ps_msg_reply_layout(h.type)
                                                              : ps_msg_request_layout(h.type));
        if (!rc)
            rc = ps_proto_check_frames(&h, nf, frames, why, sizeof why);
        free(data);
        CHECK_MSG(rc == 0, "%s: %s", path, why);
        CHECK(h.dim == 4 && h.count == 3);
    }
    snprintf(path, sizeof path, "%s/corpus/fuzz_proto/table-request.bin", root);
    CHECK_MSG(read_all(path, &data, &size) == 0, "missing seed %s", path);
    int drc = ps_proto_decode(data, size, &h, why, sizeof why);
    free(data);
    CHECK_MSG(drc == 0, "%s: %s", path, why);
    CHECK_EQ_INT(h.table.opt.kind, PS_TABLE_OPT_FTRL);
    CHECK_MSG(ps_table_decl_check(h.key, &h.table, why, sizeof why) == 0, "%s", why);
    snprintf(path, sizeof path, "%s/corpus/fuzz_proto/error-reply.bin", root);
    CHECK_MSG(read_all(path, &data, &size) == 0, "missing seed %s", path);
    int rc = ps_proto_decode(data, size, &h, why, sizeof why);
    free(data);
    CHECK_MSG(rc == 0 && h.type == PS_MSG_ERROR && h.err_text[0], "%s: %s", path, why);

    char ipath[PATH_MAX + 64], lpath[PATH_MAX + 64];
    ps_dataset *ds = NULL;
    snprintf(ipath, sizeof ipath, "%s/corpus/fuzz_idx/images-2x2x3.idx.gz", root);
    snprintf(lpath, sizeof lpath, "%s/corpus/fuzz_idx/labels-2.idx", root);
    rc = ps_dataset_load_idx(ipath, lpath, &ds, why, sizeof why);
    CHECK_MSG(rc == 0, "%s", why);
    int ok = ds->count == 2 && ds->height == 2 && ds->width == 3 && ds->labels[0] == 3 &&
             ds->labels[1] == 9 && ds->num_classes == 10 && ds->images[1] == 23.0f / 255.0f;
    ps_dataset_free(ds);
    CHECK_MSG(ok, "the seed IDX files do not load as 2 images of 2x3 with labels 3, 9");

    /* the server maps: one moved, with a removed slot and both kinds moved */
    snprintf(path, sizeof path, "%s/corpus/fuzz_smap/moved-4.bin", root);
    CHECK_MSG(read_all(path, &data, &size) == 0, "missing seed %s (make fuzz-seeds)", path);
    ps_smap m;
    rc = ps_smap_decode(data, size, &m, why, sizeof why);
    free(data);
    CHECK_MSG(rc == 0, "%s: %s", path, why);
    ok = m.nslots == 4 && m.nlive == 3 && m.nover == 4 && m.epoch == 3 &&
         ps_smap_part_owner(&m, 77, 1, 3) == 3;
    ps_smap_free(&m);
    CHECK_MSG(ok, "%s is not the map gen_seeds makes", path);
}

/* Found by fuzz_proto once the corpus had table seeds: a declaration of an
 * FTRL table whose eps (or lr) was a tiny negative double decoded as a given
 * -0 whose own encoding decoded as +0 ("not given"), so the round trip
 * changed it; f2 a denormal double became 0 the same way.  The decoder was
 * wrong: a number the protocol carries as a float32 that becomes 0 only as a
 * float32 is refused, naming the field (tests/fuzz/regress/fuzz_proto/
 * table-ftrl-*). */
PS_TEST(a_table_declaration_number_that_underflows_float32_is_refused_naming_it)
{
    const char *root = fuzz_dir();
    CHECK_MSG(root[0], "tests/fuzz/corpus not found");
    static const struct {
        const char *file, *field;
    } cases[] = {{"table-ftrl-eps-underflows-float32", "'tb.eps' is -1.34e-200"},
                 {"table-ftrl-lr-underflows-float32", "'tb.lr' is -2.19e-194"},
                 {"table-ftrl-f2-denormal-double", "'tb.f2' is 1.3e-314"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[PATH_MAX + 64], why[256], msg[512];
        uint8_t *data;
        size_t size;
        snprintf(path, sizeof path, "%s/regress/fuzz_proto/%s", root, cases[i].file);
        CHECK_MSG(read_all(path, &data, &size) == 0, "missing %s", path);
        ps_header h;
        int rc = ps_proto_decode(data, size, &h, why, sizeof why);
        const char *bad = fuzz_check_proto(data, size, msg, sizeof msg);
        free(data);
        CHECK_MSG(bad == NULL, "%s: %s", cases[i].file, bad);
        CHECK_EQ_INT(rc, PS_EPROTO);
        CHECK_MSG(strstr(why, cases[i].field) && strstr(why, "float32"), "%s: %s",
                  cases[i].file, why);
        CHECK_EQ_INT(h.version, PS_PROTO_VERSION); /* answered, q echoed */
        CHECK_EQ_INT(h.seq, 1011);
    }
}

/* The fix for the first fuzz_idx crash: a header promising ~76 GB of pixels
 * in a 24-byte file is refused as truncated, without allocating it. */
PS_TEST(idx_header_promising_more_than_the_file_is_truncated_not_allocated)
{
    static const uint8_t img[] = {0x00, 0x00, 0x08, 0x03, 0x00, 0x21, 0x00, 0x02,
                                  0x00, 0x00, 0x00, 0xfa, 0x00, 0x00, 0x00, 0x8d,
                                  0x03, 0x00, 0x17, 0x2e, 0x45, 0x5c, 0x73, 0x8a};
    static const uint8_t lab[] = {0x00, 0x00, 0x08, 0x01, 0x00, 0x00, 0x00, 0x01, 0x05};
    char ipath[64], lpath[64], why[512];
    int ifd = fuzz_file(img, sizeof img, ipath, sizeof ipath);
    int lfd = fuzz_file(lab, sizeof lab, lpath, sizeof lpath);
    CHECK(ifd >= 0 && lfd >= 0);
    ps_dataset *ds = NULL;
    int rc = ps_dataset_load_idx(ipath, lpath, &ds, why, sizeof why);
    fuzz_file_close(ifd, ipath);
    fuzz_file_close(lfd, lpath);
    CHECK_EQ_INT(rc, PS_EDATA);
    CHECK(ds == NULL);
    CHECK_MSG(strstr(why, "truncated: header promises 76234822500 bytes of image data, file "
                          "has 8"),
              "%s", why);
}
