/* Writes the seed corpus of the fuzz targets (`make fuzz-seeds`):
 *   tests/fuzz/corpus/fuzz_proto/  the header of every message type (request
 *     and reply, as ps_proto_encode makes them; a table's declaration with
 *     every field of `tb`, the sparse ones with ids of a dim-4 table), and the
 *     data-carrying ones again followed by their payload (a table message's
 *     first frame: its ids, or its rows);
 *   tests/fuzz/corpus/fuzz_idx/    tiny IDX image and label files, plain and
 *     gzip;
 *   tests/fuzz/corpus/fuzz_smap/   encoded server maps: a fresh one, and one
 *     with an added and a removed slot and objects of both kinds moved.
 * Deterministic, so regenerating leaves the committed files unchanged unless
 * the encoder changed.  Usage: gen_seeds [CORPUS_DIR] (default tests/fuzz/corpus). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "ps_client.h"
#include "ps_proto.h"
#include "ps_smap.h"

static const char *g_dir = "tests/fuzz/corpus";
static int g_files;

static int put(const char *target, const char *name, const void *a, size_t alen, const void *b,
               size_t blen)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(a, 1, alen, f) != alen || (blen && fwrite(b, 1, blen, f) != blen) ||
        fclose(f) != 0) {
        fprintf(stderr, "gen_seeds: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    g_files++;
    return 0;
}

static int put_gz(const char *target, const char *name, const void *a, size_t alen)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, target, name);
    gzFile f = gzopen(path, "wb9");
    if (!f || gzwrite(f, a, (unsigned)alen) != (int)alen || gzclose(f) != Z_OK) {
        fprintf(stderr, "gen_seeds: cannot write %s\n", path);
        return 1;
    }
    g_files++;
    return 0;
}

/* The payload of a seed: the values of a dense message, or the first frame
 * of a table message's (its ids, or its rows where it has no ids). */
static size_t seed_payload(const ps_header *h, uint8_t *out, size_t cap)
{
    int reply = (h->flags & PS_FLAG_REPLY) != 0;
    if (!reply && ps_msg_request_layout(h->type) == PS_PL_BYTES) { /* a snapshot's bytes */
        memset(out, 0x5a, h->count < cap ? h->count : cap);
        return h->count < cap ? h->count : cap;
    }
    if (!ps_msg_is_sparse(h->type)) {
        float v[4] = {1.0f, -2.5f, 0.0f, 3.25f};
        memcpy(out, v, h->count * sizeof(float));
        return h->count * sizeof(float);
    }
    int layout = reply ? ps_msg_reply_layout(h->type) : ps_msg_request_layout(h->type);
    size_t n = 0;
    if (layout == PS_PL_ROWS) {
        for (uint32_t i = 0; i < h->count * h->dim && n + 4 <= cap; i++, n += 4) {
            float f = 0.125f * (float)i - 0.5f;
            memcpy(out + n, &f, 4);
        }
    } else {
        for (uint64_t i = 0; i < h->count && n + 8 <= cap; i++, n += 8) {
            uint64_t id = 0x9e3779b97f4a7c15ull * (i + 1);
            memcpy(out + n, &id, 8);
        }
    }
    return n;
}

static int seed_header(const char *name, const ps_header *h, int with_payload)
{
    uint8_t buf[PS_HEADER_MAX];
    size_t n;
    if (ps_proto_encode(h, buf, sizeof buf, &n)) {
        fprintf(stderr, "gen_seeds: cannot encode %s\n", name);
        return 1;
    }
    char file[256];
    snprintf(file, sizeof file, "%s.bin", name);
    int rc = put("fuzz_proto", file, buf, n, NULL, 0);
    if (with_payload) {
        uint8_t payload[256];
        snprintf(file, sizeof file, "%s-payload.bin", name);
        rc |= put("fuzz_proto", file, buf, n, payload, seed_payload(h, payload, sizeof payload));
    }
    return rc;
}

static int proto_seeds(void)
{
    ps_header h;
    int rc = 0;
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        for (int reply = 0; reply <= 1; reply++) {
            if (t == PS_MSG_ERROR && !reply)
                continue;
            ps_header_init(&h, t);
            h.flags = reply ? PS_FLAG_REPLY : 0;
            h.seq = 1000 + t;
            h.rank = 1;
            h.key = 7;
            h.chunk = 2;
            ps_header_set_s(&h, 5);
            int payload = reply ? ps_msg_reply_has_payload(t) : ps_msg_request_has_payload(t);
            if (payload) {
                h.count = 4;
                h.dtype = PS_DTYPE_F32;
            }
            if (ps_msg_is_sparse(t)) { /* 3 ids of a dim-4 table; a push's ack has none */
                int layout = reply ? ps_msg_reply_layout(t) : ps_msg_request_layout(t);
                payload = layout != PS_PL_NONE;
                h.count = payload ? 3 : 0;
                h.dim = payload ? 4 : 0;
                h.dtype = payload ? PS_DTYPE_F32 : 0;
                if (layout == PS_PL_IDS_ROWS_IDS)
                    h.npull = 2;
            }
            if (t == PS_MSG_TABLE && !reply) { /* FTRL, every field of `tb` set */
                ps_table_options_default(&h.table);
                h.table.dim = 16;
                h.table.init = PS_TABLE_INIT_NORMAL;
                h.table.init_scale = 0.01f;
                h.table.seed = 42;
                h.table.opt.kind = PS_TABLE_OPT_FTRL;
                h.table.opt.lr = 0.05f;
                h.table.opt.eps = 1e-8f;
                h.table.ftrl_beta = 1.0f;
                h.table.ftrl_l1 = 0.001f;
                h.table.ftrl_l2 = 0.01f;
                h.table.max_rows = 1000000;
                h.table.min_count = 2;
                h.table.filter_cells = 1u << 20;
            }
            if (t == PS_MSG_INIT)
                h.total = 12;
            if (t >= PS_MSG_REPL_HELLO) { /* replicas: the epoch, a member, rank -1 */
                h.rank = -1;
                h.epoch = 3;
                h.member = 1;
                h.total = 16;
                h.stream_pos = 40;
                if (t == PS_MSG_REPL_SNAP && !reply) {
                    h.count = 4;
                    payload = 1;
                }
            }
            if (t == PS_MSG_HELLO || t == PS_MSG_HYPER ||
                ((t == PS_MSG_REPL_HELLO || t == PS_MSG_REPL_JOIN) && !reply)) { /* carry `h` */
                h.hello.mode = reply ? PS_MODE_SYNC : PS_MODE_ASYNC;
                h.hello.max_staleness = reply ? 0 : 3;
                h.hello.num_workers = 2;
                h.hello.num_servers = 2;
                h.hello.server_rank = 1;
                h.hello.model_fp = 0x9e3779b97f4a7c15ull;
                h.hello.opt.kind = reply ? PS_OPT_ADAM : PS_OPT_NONE;
                h.hello.opt.lr = 0.001f;
                h.hello.opt.beta1 = 0.9f;
                h.hello.opt.beta2 = 0.999f;
                h.hello.opt.eps = 1e-8f;
                h.hello.opt.weight_decay = 0.0001f;
            }
            if (t == PS_MSG_STATS && reply) {
                h.stats = (ps_stats){.pushes = 10, .pulls = 20, .inits = 3, .updates = 9,
                                     .bytes_in = 4096, .bytes_out = 8192, .dup_dropped = 1,
                                     .chunks = 6, .workers_seen = 2, .partitions = 2,
                                     .rows = 100, .table_bytes = 6400, .evicted = 1,
                                     .filtered = 2, .nonfinite = 1, .forged = 1,
                                     .min_version = -1, .max_version = 9};
            }
            if (t == PS_MSG_ERROR) {
                h.err_code = 6;
                snprintf(h.err_text, sizeof h.err_text, "push of key 7 chunk 2: not initialized");
            }
            char name[64];
            snprintf(name, sizeof name, "%s-%s", ps_msg_type_name(t),
                     reply ? "reply" : "request");
            rc |= seed_header(name, &h, payload);
        }
    }
    /* a peer of another protocol version */
    ps_header_init(&h, PS_MSG_HEARTBEAT);
    h.version = 2;
    rc |= seed_header("heartbeat-version2", &h, 0);
    return rc;
}

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static int idx_seeds(void)
{
    uint8_t img[16 + 2 * 2 * 3], lab[8 + 3];
    be32(img, 0x00000803u);
    be32(img + 4, 2);
    be32(img + 8, 2);
    be32(img + 12, 3);
    for (int i = 0; i < 12; i++)
        img[16 + i] = (uint8_t)(i * 23);
    be32(lab, 0x00000801u);
    be32(lab + 4, 2);
    lab[8] = 3;
    lab[9] = 9;
    int rc = put("fuzz_idx", "images-2x2x3.idx", img, sizeof img, NULL, 0);
    rc |= put("fuzz_idx", "labels-2.idx", lab, 10, NULL, 0);
    rc |= put_gz("fuzz_idx", "images-2x2x3.idx.gz", img, sizeof img);
    rc |= put_gz("fuzz_idx", "labels-2.idx.gz", lab, 10);
    /* a label past the 10 MNIST classes */
    be32(lab + 4, 3);
    lab[10] = 11;
    rc |= put("fuzz_idx", "labels-3-class11.idx", lab, 11, NULL, 0);
    return rc;
}

static int put_smap(const char *name, const ps_smap *m)
{
    size_t n = ps_smap_encoded_bytes(m);
    unsigned char *b = malloc(n);
    if (!b)
        return 1;
    ps_smap_encode(m, b);
    int rc = put("fuzz_smap", name, b, n, NULL, 0);
    free(b);
    return rc;
}

static int smap_seeds(void)
{
    static const char *const eps[] = {"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555",
                                      "ipc:///tmp/ps-server-2"};
    ps_smap m;
    char why[256];
    if (ps_smap_init(&m, eps, 3, why, sizeof why)) {
        fprintf(stderr, "gen_seeds: %s\n", why);
        return 1;
    }
    int rc = put_smap("fresh-3.bin", &m);
    /* slot 3 added, objects moved onto it and onto 0, then slot 1 removed */
    ps_smap_move mv[] = {{{PS_SMAP_CHUNK, 0x1234, 0, 0}, 4096, 1, 1, 3},
                         {{PS_SMAP_CHUNK, 0x1234, 5, 0}, 4096, 2, 2, 3},
                         {{PS_SMAP_PART, 77, 1, 0}, 1 << 20, 1, 1, 0},
                         {{PS_SMAP_PART, 77, 1, 3}, 1 << 20, 1, 1, 3}};
    int s;
    if (ps_smap_add_slot(&m, "tcp://[::1]:6000", &s, why, sizeof why) ||
        ps_smap_apply(&m, mv, 4, why, sizeof why) || ps_smap_remove_slot(&m, 1, why, sizeof why)) {
        fprintf(stderr, "gen_seeds: %s\n", why);
        ps_smap_free(&m);
        return 1;
    }
    rc |= put_smap("moved-4.bin", &m);
    ps_smap_free(&m);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_dir = argv[1];
    char path[1024];
    const char *sub[] = {"", "/fuzz_proto", "/fuzz_idx", "/fuzz_smap"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s%s", g_dir, sub[i]);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "gen_seeds: cannot create %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    int rc = proto_seeds() | idx_seeds() | smap_seeds();
    printf("gen_seeds: wrote %d seed files under %s\n", g_files, g_dir);
    return rc;
}
