/* A table's messages that are wrong, sent to a live bin/ps_server by a raw
 * DEALER (below libps): each gets an error reply that says what was wrong,
 * and nothing of it is applied (the table's rows, versions and counters
 * are as before).  And libps refuses bad sparse requests before sending. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_exchange.h"
#include "ps_proto.h"
#include "ps_shm.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "tables_job.h"

#define DIM 4
#define KEY 7

static ps_header hdr(uint32_t type, uint64_t seq, uint64_t key, uint32_t part, int64_t s)
{
    ps_header h = ps_test_header(type, 0, seq, key, part, s);
    h.dim = DIM;
    h.dtype = PS_DTYPE_F32;
    return h;
}

/* Send h with frames; the reply into r.  0, or -1 when none came. */
static int ask(void *d, const ps_header *h, const void *const *f, const size_t *b, int n,
               ps_header *r, float *out, size_t cap)
{
    if (ps_test_send_frames(d, h, f, b, n))
        return -1;
    return ps_test_recv(d, PS_TEST_RPC_MS, r, out, cap, NULL) == 0 ? 0 : -1;
}

static int declare(void *d, uint64_t seq, uint32_t dim, ps_header *r)
{
    ps_header h = ps_test_header(PS_MSG_TABLE, 0, seq, KEY, 0, 0);
    ps_table_options_default(&h.table);
    h.table.dim = dim;
    h.table.opt.kind = PS_OPT_SGD;
    h.table.opt.lr = 0.5f;
    return ask(d, &h, NULL, NULL, 0, r, NULL, 0);
}

/* an error reply with this code whose text holds `text` */
#define REFUSED(r, code, text)                                                                  \
    CHECK_MSG((r).type == PS_MSG_ERROR && (r).err_code == (code) && strstr((r).err_text, text), \
              "got %s %d: %s (expected %d: ...%s...)", ps_msg_type_name((r).type),            \
              (r).err_code, (r).err_text, code, text)

PS_TEST(every_bad_table_message_is_refused_and_nothing_is_applied)
{
    TJ_NEED_SERVER();
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode async --threads 2 --quiet"));
    void *d = ps_test_dealer(sv.port), *tool = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(d, 0, PS_MODE_ASYNC, 1, -1));
    ps_header r;
    uint64_t seq = 10, id = 5, two[2] = {5, 6};
    float g[2 * DIM] = {1, 2, 3, 4, 5, 6, 7, 8}, row[2 * DIM];
    const void *push[2] = {&id, g};
    size_t push_b[2] = {8, 4 * DIM};

    /* a sparse message for a table never declared */
    ps_header h = hdr(PS_MSG_SPUSH, ++seq, KEY, 0, 0);
    h.count = 1;
    CHECK_OK(ask(d, &h, push, push_b, 2, &r, NULL, 0));
    REFUSED(r, PS_ENOTFOUND, "table 7 is not declared on this server");
    /* a declaration out of range; then the table, and another declaration of it */
    CHECK_OK(declare(d, ++seq, 0, &r));
    REFUSED(r, PS_EINVAL, "table 7: dim must be in [1, 65536], got 0");
    CHECK_OK(declare(d, ++seq, DIM, &r));
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    CHECK_OK(declare(d, ++seq, DIM, &r)); /* the same again: fine */
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    CHECK_OK(declare(d, ++seq, 2 * DIM, &r));
    REFUSED(r, PS_EMISMATCH, "table 7: dim: worker 0 has 8, server 0 has 4");
    /* the partition of id 5 on this one server of 2 partitions, and another
     * id of it */
    uint32_t part = ps_table_row_part(ps_table_row_hash(KEY, id), 1, 2);
    while (two[1] == id || ps_table_row_part(ps_table_row_hash(KEY, two[1]), 1, 2) != part)
        two[1]++;

    /* the row as it is, and the counters */
    ps_header q = hdr(PS_MSG_SPULL, ++seq, KEY, part, 0);
    q.count = 1;
    const void *pull[1] = {&id};
    size_t pull_b[1] = {8};
    float before[DIM];
    CHECK_OK(ask(d, &q, pull, pull_b, 1, &r, before, DIM));
    CHECK_EQ_INT(r.type, PS_MSG_SPULL);
    ps_stats st0;
    CHECK_OK(ps_test_stats(sv.port, &st0));

    /* each of these is refused, naming what was wrong */
    struct {
        const char *what;
        int code;
        const char *text;
    } cases[] = {
        {"ids frame shorter than n ids", PS_EPROTO, "frame 1 (ids) has 8 bytes, not 16"},
        {"rows frame of another size", PS_EPROTO, "frame 2 (rows) has 16 bytes, not 32"},
        {"too many ids", PS_ETOOBIG, "at most 1048576 per message"},
        {"dim not the table's", PS_EPROTO, "rows of table 7 have dim 4, not 3"},
        {"no dim", PS_EPROTO, "spush request without field 'dim'"},
        {"partition beyond the threads", PS_EPROTO, "has 2 partitions on this server"},
        {"a step beyond the clock", PS_ESTATE, "a push may not skip steps"},
        {"one frame missing", PS_EPROTO, "needs 2 frames after its header, got 1"},
        {"pushpull's pull ids of another size", PS_EPROTO, "frame 3 (ids to pull)"},
        {"rows in an arena never named at hello", PS_EHELLO, "arena is not mapped here"},
        {"an unknown dtype", PS_EPROTO, "field 'd' must be"},
        {"an id of the other partition", PS_EPROTO, "belongs to partition"},
        {"an id to pull of the other partition", PS_EPROTO, "id to pull"},
        {"an assigned id of the other partition", PS_EPROTO, "assigned id"},
        {"an assigned row that is not finite", PS_ENONFINITE, "5 of 8 values are not finite"},
    };
    /* rows to assign: the first ends in -Inf, the second is NaN */
    float bad_rows[2 * DIM] = {1, 2, 3, -INFINITY, NAN, NAN, NAN, NAN};
    /* id 5 and one of the other partition */
    uint64_t wrong[2] = {id, 0};
    while (ps_table_row_part(ps_table_row_hash(KEY, wrong[1]), 1, 2) == part)
        wrong[1]++;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        h = hdr(PS_MSG_SPUSH, ++seq, KEY, part, 0);
        h.count = 2;
        const void *f[3] = {two, g, two};
        size_t b[3] = {16, 2 * 4 * DIM, 16};
        int nf = 2;
        switch (c) {
        case 0: b[0] = 8; break;
        case 1: b[1] = 16; break;
        case 2: h.count = PS_MAX_SPARSE_IDS + 1; break;
        case 3: h.dim = 3; b[1] = 2 * 4 * 3; break;
        case 4: h.dim = 0; break;
        case 5: h.chunk = 2; break;
        case 6: h.push_step = 5; break;
        case 7: nf = 1; break;
        case 8: h.type = PS_MSG_SPUSHPULL, h.npull = 2, b[2] = 8, nf = 3; break;
        case 9: h.flags = PS_FLAG_SHM, nf = 0; break;
        case 10: h.dtype = 9; break;
        case 11: f[0] = wrong; break;
        case 12: h.type = PS_MSG_SPUSHPULL, h.npull = 2, f[2] = wrong, nf = 3; break;
        case 13: h.type = PS_MSG_SASSIGN, f[0] = wrong; break;
        case 14: h.type = PS_MSG_SASSIGN, f[1] = bad_rows; break;
        }
        CHECK_MSG(ask(d, &h, f, b, nf, &r, NULL, 0) == 0, "%s: no reply", cases[c].what);
        CHECK_EQ_INT(r.seq, seq);
        CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == cases[c].code &&
                      strstr(r.err_text, cases[c].text),
                  "%s: got %s %d: %s", cases[c].what, ps_msg_type_name(r.type), r.err_code,
                  r.err_text);
    }
    /* a pull of an id of the other partition: refused naming it and where it
     * belongs; no row made (counted below) */
    q.seq = ++seq;
    const void *wpull[1] = {&wrong[1]};
    CHECK_OK(ask(d, &q, wpull, pull_b, 1, &r, NULL, 0));
    char where[96];
    snprintf(where, sizeof where, "id %llu (number 0 of the request) belongs to partition %u",
             (unsigned long long)wrong[1], 1 - part);
    REFUSED(r, PS_EPROTO, where);
    CHECK(strstr(r.err_text, "where it was sent"));
    /* from a tool: refused */
    h = hdr(PS_MSG_SPUSH, ++seq, KEY, part, 0);
    h.rank = -1;
    h.count = 1;
    CHECK_OK(ask(tool, &h, push, push_b, 2, &r, NULL, 0));
    REFUSED(r, PS_ESTATE, "needs a worker rank");

    /* nothing of it applied: the row, its version, the counters */
    q.seq = ++seq;
    CHECK_OK(ask(d, &q, pull, pull_b, 1, &r, row, DIM));
    CHECK_EQ_INT(r.type, PS_MSG_SPULL);
    CHECK_EQ_INT(r.chunk_version, 0);
    CHECK(memcmp(row, before, sizeof before) == 0);
    ps_stats st1;
    CHECK_OK(ps_test_stats(sv.port, &st1));
    CHECK_EQ_INT(st1.rows, st0.rows);
    CHECK_EQ_INT(st1.updates, st0.updates);
    CHECK_EQ_INT(st1.nonfinite, st0.nonfinite + 1); /* the assign's */
    CHECK_EQ_INT(st1.partitions, 2);
    /* and a good push still goes in */
    h = hdr(PS_MSG_SPUSH, ++seq, KEY, part, 0);
    h.count = 1;
    CHECK_OK(ask(d, &h, push, push_b, 2, &r, NULL, 0));
    CHECK_MSG(r.type == PS_MSG_SPUSH, "%s", r.err_text);
    CHECK_EQ_INT(r.chunk_version, 1);
    zmq_close(d);
    zmq_close(tool);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
}

/* Same host: a worker whose arena the server mapped at hello sends a
 * table's ids and rows in it.  A good pull and push go through it (the rows
 * written after the request's bytes, where the reply says); every request
 * whose bytes, or the room for its reply's rows, reach outside the arena's
 * buffers (before them, past the end, unaligned, far beyond), or
 * whose rows are not float32, or that also sends frames, is refused naming
 * what, and nothing of it is applied. */
PS_TEST(table_requests_in_shared_memory_are_checked_byte_for_byte_and_nothing_bad_applied)
{
    TJ_NEED_SERVER();
    ps_test_server sv;
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 1 --mode async --threads 2 --quiet"));
    ps_shm_arena a;
    char w[256];
    CHECK_MSG(ps_shm_create(1 << 16, &a, w, sizeof w) == 0, "%s", w);
    void *d = ps_test_dealer(sv.port);
    ps_header h = ps_test_header(PS_MSG_HELLO, 0, 1, 0, 0, 0), r;
    h.hello.mode = PS_MODE_ASYNC;
    h.hello.max_staleness = -1;
    h.hello.num_workers = 1;
    h.hello.num_servers = 1;
    h.hello.opt.kind = PS_OPT_NONE;
    snprintf(h.hello.shm_name, sizeof h.hello.shm_name, "%s", a.name);
    h.hello.shm_nonce = a.nonce;
    h.hello.shm_size = a.size;
    CHECK_OK(ask(d, &h, NULL, NULL, 0, &r, NULL, 0));
    CHECK_MSG(r.type == PS_MSG_HELLO && r.hello.shm == 1, "hello: %s %s", r.err_text,
              r.hello.shm_why);
    uint64_t seq = 10, id = 5;
    CHECK_OK(declare(d, ++seq, DIM, &r));
    CHECK_EQ_INT(r.type, PS_MSG_TABLE);
    uint32_t part = ps_table_row_part(ps_table_row_hash(KEY, id), 1, 2);
    /* the row over the network */
    ps_header q = hdr(PS_MSG_SPULL, ++seq, KEY, part, 0);
    q.count = 1;
    const void *pull[1] = {&id};
    size_t pull_b[1] = {8};
    float before[DIM], row[DIM];
    CHECK_OK(ask(d, &q, pull, pull_b, 1, &r, before, DIM));
    CHECK_EQ_INT(r.type, PS_MSG_SPULL);

    /* a pull through the arena: the id at off, its row written after it */
    unsigned char *blk = ps_shm_alloc(&a, 4096);
    CHECK(blk != NULL);
    uint64_t off = (uint64_t)(blk - a.base);
    memcpy(blk, &id, 8);
    h = hdr(PS_MSG_SPULL, ++seq, KEY, part, 0);
    h.flags = PS_FLAG_SHM, h.shm_off = off, h.count = 1;
    CHECK_OK(ask(d, &h, NULL, NULL, 0, &r, NULL, 0));
    CHECK_MSG(r.type == PS_MSG_SPULL && (r.flags & PS_FLAG_SHM) && r.shm_off == off + 8 &&
                  r.count == 1 && r.dim == DIM,
              "shm pull: %s %s at %llu", ps_msg_type_name(r.type), r.err_text,
              (unsigned long long)r.shm_off);
    CHECK(memcmp(blk + 8, before, sizeof before) == 0);
    /* a push through it: applied on arrival (sgd, lr 0.5) */
    float g[DIM] = {1, -2, 0.25f, 8};
    memcpy(blk, &id, 8);
    memcpy(blk + 8, g, sizeof g);
    h = hdr(PS_MSG_SPUSH, ++seq, KEY, part, 0);
    h.flags = PS_FLAG_SHM, h.shm_off = off, h.count = 1;
    CHECK_OK(ask(d, &h, NULL, NULL, 0, &r, NULL, 0));
    CHECK_MSG(r.type == PS_MSG_SPUSH && r.chunk_version == 1, "shm push: %s", r.err_text);
    float after[DIM];
    for (int k = 0; k < DIM; k++)
        after[k] = before[k] - 0.5f * g[k];
    q.seq = ++seq;
    CHECK_OK(ask(d, &q, pull, pull_b, 1, &r, row, DIM));
    CHECK(memcmp(row, after, sizeof after) == 0);
    ps_stats st0;
    CHECK_OK(ps_test_stats(sv.port, &st0));

    struct {
        const char *what;
        int code;
        const char *text;
    } cases[] = {
        {"ids in the arena's header", PS_EPROTO, "are outside its arena"},
        {"rows past the end", PS_EPROTO, "are outside its arena"},
        {"an unaligned offset", PS_EPROTO, "are outside its arena"},
        {"an offset far beyond it", PS_EPROTO, "are outside its arena"},
        {"room for the pulled rows past the end", PS_EPROTO, "are outside its arena"},
        {"a pull's rows past the end", PS_EPROTO, "are outside its arena"},
        {"bfloat16 rows", PS_EPROTO, "in shared memory: rows are float32"},
        {"frames as well", PS_EPROTO, "in shared memory takes no payload frame"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        h = hdr(PS_MSG_SPUSH, ++seq, KEY, part, 1);
        h.flags = PS_FLAG_SHM, h.shm_off = off, h.count = 1;
        const void *f[2] = {&id, g};
        size_t b[2] = {8, sizeof g};
        int nf = 0;
        switch (c) {
        case 0: h.shm_off = 64; break;
        case 1: h.shm_off = a.size - 16; break;
        case 2: h.shm_off = off + 2; break;
        case 3: h.shm_off = (1ull << 61) - 8; break;
        case 4: h.type = PS_MSG_SPUSHPULL, h.npull = 4096; break;
        case 5: h.type = PS_MSG_SPULL, h.count = 4096, h.want_version = 0; break;
        case 6: h.dtype = PS_DTYPE_BF16; break;
        case 7: nf = 2; break;
        }
        CHECK_MSG(ask(d, &h, f, b, nf, &r, NULL, 0) == 0, "%s: no reply", cases[c].what);
        CHECK_EQ_INT(r.seq, seq);
        CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == cases[c].code &&
                      strstr(r.err_text, cases[c].text),
                  "%s: got %s %d: %s", cases[c].what, ps_msg_type_name(r.type), r.err_code,
                  r.err_text);
    }
    /* nothing of it applied: the row, its version, the counters */
    q.seq = ++seq;
    CHECK_OK(ask(d, &q, pull, pull_b, 1, &r, row, DIM));
    CHECK_EQ_INT(r.chunk_version, 1);
    CHECK(memcmp(row, after, sizeof after) == 0);
    ps_stats st1;
    CHECK_OK(ps_test_stats(sv.port, &st1));
    CHECK_EQ_INT(st1.rows, st0.rows);
    CHECK_EQ_INT(st1.updates, st0.updates);
    zmq_close(d);
    ps_shm_close(&a);
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
}

/* libps refuses what it cannot send, before anything goes: a table before
 * start or not registered, NULL buffers, a bad declaration, a key twice. */
PS_TEST(libps_refuses_bad_table_requests_at_once)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = "tcp://127.0.0.1:1";
    o.mode = PS_MODE_ASYNC;
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    ps_table_options t;
    ps_table_options_default(&t);
    CHECK_EQ_INT(ps_client_register_table(c, 7, &t), PS_EINVAL); /* dim 0 */
    CHECK_MSG(strstr(ps_client_last_error(c), "table 7: dim must be in [1, 65536], got 0"),
              "%s", ps_client_last_error(c));
    t.dim = 8;
    t.opt.kind = 17;
    CHECK_EQ_INT(ps_client_register_table(c, 7, &t), PS_EINVAL);
    t.opt.kind = PS_OPT_NONE;
    CHECK_OK(ps_client_register_table(c, 7, &t));
    CHECK_EQ_INT(ps_client_register_table(c, 7, &t), PS_EINVAL);
    CHECK_EQ_INT(ps_client_register(c, 7, 10), PS_EINVAL);
    uint64_t id = 1;
    float row[8];
    ps_request r;
    CHECK_EQ_INT(ps_client_sparse_pull(c, 7, &id, 1, row, 0, &r), PS_ESTATE);
    CHECK_EQ_INT(ps_request_wait(&r), PS_ESTATE);
    ps_client_close(c);

    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_start(&j, 1, 1, "--mode async --optimizer sgd --lr 0.1", 8,
                      PS_TABLE_INIT_ZEROS));
    CHECK_EQ_INT(ps_client_sparse_pull(j.c[0], 8, &id, 1, row, 0, &r), PS_ENOTFOUND);
    CHECK_EQ_INT(ps_client_sparse_pull(j.c[0], 7, NULL, 1, row, 0, &r), PS_EINVAL);
    CHECK_EQ_INT(ps_client_sparse_push(j.c[0], 7, &id, 1, NULL, 0, &r), PS_EINVAL);
    CHECK_EQ_INT(ps_client_sparse_pushpull(j.c[0], 7, &id, 1, row, &id, 1, NULL, 0, &r),
                 PS_EINVAL);
    CHECK_EQ_INT(ps_client_sparse_push(j.c[0], 7, &id, 1, row, -1, &r), PS_EINVAL);
    CHECK_EQ_INT(ps_client_server_parts(j.c[0], 0), 1);
    CHECK_OK(tj_stop(&j));
}

/* Local aggregation does not take tables yet: an exchange in a local group
 * whose client has a table refuses to start, saying so, before it opens
 * the group or says hello. */
PS_TEST(local_aggregation_with_a_table_is_refused_at_start)
{
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = "tcp://127.0.0.1:1";
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    ps_table_options t;
    ps_table_options_default(&t);
    t.dim = 4;
    CHECK_OK(ps_client_register_table(c, 3, &t));
    CHECK_EQ_INT(ps_client_num_tables(c), 1);
    ps_backend *b;
    CHECK_OK(ps_backend_host_create(&b));
    ps_exchange *x;
    CHECK_OK(ps_exchange_adopt(c, &o, b, &x));
    CHECK_OK(ps_exchange_set_local_group(x, "tables-test", 0, 2, 1000));
    CHECK_EQ_INT(ps_exchange_start(x), PS_EINVAL);
    ps_exchange_close(x);
    ps_backend_host_destroy(b);
}

/* Two workers that declare a table otherwise: the second is refused at
 * start, at its hello (the tables' fingerprints differ), naming this
 * server's declaration. */
PS_TEST(workers_that_declare_a_table_otherwise_are_refused_at_start)
{
    TJ_NEED_SERVER();
    tj_job j;
    CHECK_OK(tj_prepare(&j, 1, 2, "--mode async --optimizer sgd --lr 0.1", 4,
                        PS_TABLE_INIT_ZEROS));
    CHECK_OK(tj_client(&j, 0));
    ps_client_options o;
    ps_client_options_default(&o);
    o.servers = j.eps;
    o.rank = 1;
    o.num_workers = 2;
    o.mode = PS_MODE_ASYNC;
    o.max_staleness = -1;
    ps_client *c;
    CHECK_OK(ps_client_open(&o, &c));
    j.topt.init_scale = 0.5f; /* no matter for zeros */
    j.topt.dim = 6;
    CHECK_OK(ps_client_register_table(c, j.table, &j.topt));
    CHECK_EQ_INT(ps_client_start(c), PS_EMISMATCH);
    CHECK_MSG(strstr(ps_client_last_error(c), "tables: server has fingerprint ") &&
                  strstr(ps_client_last_error(c), "this server has table 7 (dim 4, sgd)"),
              "%s", ps_client_last_error(c));
    ps_client_close(c);
    CHECK_OK(tj_stop(&j));
}
