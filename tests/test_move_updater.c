/* Objects moved between servers, on the update thread (server/updater.h,
 * updater_move.c): update threads driven over their inproc PAIR as the I/O
 * thread drives them, with PS_CMD_TAKE and PS_CMD_LOAD_MOVED; no ROUTER,
 * no network.  A sync TAKE waits for the thread's quiet point, what waited
 * on a taken chunk is answered PS_EMOVED naming the destination, and the
 * destination serves the moved chunk and the moved table partition (with
 * PS_FLAG_AWAY, its ids checked against its home). */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <zmq.h>

#include "ps_dtype.h"
#include "ps_error.h"
#include "ps_opt_table.h"
#include "ps_proto.h"
#include "ps_table_row.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "ps_client.h"
#include "table_part.h"
#include "updater.h"
#include "updater_frames.h"

enum { W = 2, N = 4, DIM = 3, S = 2, TABLE = 40 };

typedef struct rig {
    void *io;
    ps_updater *u;
    _Atomic uint64_t mem, copies;
} rig;

static void *ctx(void)
{
    static void *c;
    if (!c)
        c = zmq_ctx_new();
    return c;
}

static int rig_open(rig *g, const char *name, int rank)
{
    memset(g, 0, sizeof *g);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://move-%s", name);
    g->io = zmq_socket(ctx(), ZMQ_PAIR);
    void *th = zmq_socket(ctx(), ZMQ_PAIR);
    if (!g->io || !th || zmq_bind(g->io, ep) || zmq_connect(th, ep))
        return -1;
    ps_updater_config uc;
    memset(&uc, 0, sizeof uc);
    uc.mode = PS_MODE_SYNC;
    uc.wire_dtype = PS_DTYPE_F32;
    uc.num_workers = W;
    uc.server_rank = rank;
    uc.num_servers = S;
    uc.nparts = 1;
    uc.copies = &g->copies;
    ps_shard_config sc;
    memset(&sc, 0, sizeof sc);
    sc.mode = PS_MODE_SYNC;
    sc.num_workers = W;
    ps_opt_default(&sc.opt);
    sc.opt.kind = PS_OPT_SGD;
    sc.opt.lr = 0.5f;
    sc.opt.given = PS_OPT_GIVEN_ALL;
    sc.max_memory = 1 << 24;
    sc.mem_used = &g->mem;
    if (ps_updater_create(&uc, &sc, th, &g->u) || ps_updater_start(g->u))
        return -1;
    return 0;
}

static void send_cmd(rig *g, const ps_cmd_frame *cf, int more)
{
    zmq_send(g->io, cf, sizeof *cf, more ? ZMQ_SNDMORE : 0);
}

/* A request h (its frames after the identity: n of them). */
static void req(rig *g, const ps_header *h, const void *const *fr, const size_t *len, int n)
{
    ps_cmd_frame cf;
    memset(&cf, 0, sizeof cf);
    cf.cmd = PS_CMD_REQ;
    cf.h = *h;
    send_cmd(g, &cf, 1);
    zmq_send(g->io, "id", 2, n ? ZMQ_SNDMORE : 0);
    for (int i = 0; i < n; i++)
        zmq_send(g->io, fr[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0);
}

/* The next message from the thread within ms: its tag, and a reply's
 * decoded header and payload (out, cap bytes; *got), or a move frame.
 * 0, or 1 when nothing came. */
static int recv_out(rig *g, int ms, char *tag, ps_header *h, void *out, size_t cap, size_t *got,
                    ps_move_frame *mf)
{
    zmq_pollitem_t it = {g->io, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0)
        return 1;
    zmq_msg_t f[5];
    int n = 0, more = 1;
    while (more && n < 5) {
        zmq_msg_init(&f[n]);
        zmq_msg_recv(&f[n], g->io, 0);
        more = zmq_msg_more(&f[n]);
        n++;
    }
    *tag = *(char *)zmq_msg_data(&f[0]);
    if (got)
        *got = 0;
    char why[128];
    if (*tag == PS_OUT_REPLY && n >= 3 && h)
        ps_proto_decode(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), h, why, sizeof why);
    if (*tag == PS_OUT_REPLY && n >= 4 && out && zmq_msg_size(&f[3]) <= cap) {
        memcpy(out, zmq_msg_data(&f[3]), zmq_msg_size(&f[3]));
        if (got)
            *got = zmq_msg_size(&f[3]);
    }
    if ((*tag == PS_OUT_TAKEN || *tag == PS_OUT_MOVED_IN) && mf && n >= 2 &&
        zmq_msg_size(&f[1]) == sizeof *mf)
        memcpy(mf, zmq_msg_data(&f[1]), sizeof *mf);
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
    return 0;
}

/* A reply to a request: its header (error or not). */
static int reply(rig *g, ps_header *h, void *out, size_t cap, size_t *got)
{
    char tag;
    for (;;) {
        if (recv_out(g, PS_TEST_RPC_MS, &tag, h, out, cap, got, NULL))
            return -1;
        if (tag == PS_OUT_REPLY)
            return 0;
        /* progress and the like: not what this waits for */
    }
}

static int move_reply(rig *g, char want, ps_move_frame *mf)
{
    char tag;
    ps_header h;
    for (;;) {
        if (recv_out(g, PS_TEST_RPC_MS, &tag, &h, NULL, 0, NULL, mf))
            return -1;
        if (tag == want)
            return 0;
    }
}

static void rig_close(rig *g)
{
    if (!g->u)
        return;
    ps_cmd_frame cf;
    memset(&cf, 0, sizeof cf);
    cf.cmd = PS_CMD_STOP;
    send_cmd(g, &cf, 0);
    char tag = 0;
    ps_header h;
    while (tag != PS_OUT_STOPPED && !recv_out(g, PS_TEST_RPC_MS, &tag, &h, NULL, 0, NULL, NULL))
        ;
    ps_updater_join(g->u);
    ps_updater_destroy(g->u);
    zmq_close(g->io);
    g->u = NULL;
}

static int init(rig *g, uint64_t key, const float *w)
{
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, key, 0, 0), r;
    h.count = N;
    h.total = N;
    h.dtype = PS_DTYPE_F32;
    const void *fr[1] = {w};
    size_t len[1] = {N * sizeof(float)};
    req(g, &h, fr, len, 1);
    return reply(g, &r, NULL, 0, NULL) || r.type == PS_MSG_ERROR ? -1 : 0;
}

static void push(rig *g, uint64_t key, int rank, int64_t step, float x)
{
    ps_header h = ps_test_header(PS_MSG_PUSH, rank, 10 + (uint64_t)step, key, 0, step);
    h.count = N;
    h.dtype = PS_DTYPE_F32;
    float gr[N];
    for (int i = 0; i < N; i++)
        gr[i] = x * (float)(i + 1);
    const void *fr[1] = {gr};
    size_t len[1] = {sizeof gr};
    req(g, &h, fr, len, 1);
}

static void pull(rig *g, uint64_t key, int rank, int64_t want)
{
    ps_header h = ps_test_header(PS_MSG_PULL, rank, 99, key, 0, want);
    req(g, &h, NULL, NULL, 0);
}

static void take(rig *g, ps_move_obj o, uint64_t token)
{
    ps_cmd_frame cf;
    memset(&cf, 0, sizeof cf);
    cf.cmd = PS_CMD_TAKE;
    cf.move_token = token;
    cf.move_objs = malloc(sizeof o);
    *cf.move_objs = o;
    cf.move_nobjs = 1;
    ps_header_init(&cf.h, PS_MSG_PULL);
    cf.h.slot = 3;
    snprintf(cf.h.owner_ep, sizeof cf.h.owner_ep, "tcp://10.0.0.3:7000");
    send_cmd(g, &cf, 0);
}

static void load(rig *g, void *block, size_t len, uint64_t token)
{
    ps_cmd_frame cf;
    memset(&cf, 0, sizeof cf);
    cf.cmd = PS_CMD_LOAD_MOVED;
    cf.move_token = token;
    cf.move_block = block;
    cf.move_len = len;
    send_cmd(g, &cf, 0);
}

PS_TEST(sync_take_waits_for_the_quiet_point_and_the_destination_serves_the_chunk)
{
    rig a, b;
    CHECK_OK(rig_open(&a, "a1", 0));
    CHECK_OK(rig_open(&b, "b1", 1));
    float w0[N] = {1, 2, 3, 4};
    CHECK_OK(init(&a, 7, w0));
    CHECK_OK(init(&a, 8, w0));
    ps_header r;
    for (uint64_t key = 7; key <= 8; key++)
        for (int k = 0; k < W; k++) {
            push(&a, key, k, 0, 0.25f * (float)(k + 1));
            CHECK_OK(reply(&a, &r, NULL, 0, NULL));
            CHECK(r.type != PS_MSG_ERROR);
        }
    float before[N], after[N];
    size_t got;
    pull(&a, 7, 0, 1);
    CHECK_OK(reply(&a, &r, before, sizeof before, &got));
    CHECK(got == sizeof before && r.chunk_version == 1);
    push(&a, 8, 0, 1, 1.0f); /* key 8's round 1 holds a push: not quiet */
    CHECK_OK(reply(&a, &r, NULL, 0, NULL));
    pull(&a, 7, 1, 2); /* waits for key 7's round 1 */
    take(&a, (ps_move_obj){PS_MOVE_CHUNK, 0, 7, 0}, 55);
    char tag;
    ps_move_frame mf;
    CHECK_MSG(recv_out(&a, 300, &tag, &r, NULL, 0, NULL, &mf) == 1,
              "the take did not wait for the quiet point (tag %c)", tag);
    push(&a, 8, 1, 1, 1.0f); /* round 1 of key 8 complete: quiet */
    CHECK_OK(reply(&a, &r, NULL, 0, NULL)); /* its acknowledgement */
    CHECK(r.type != PS_MSG_ERROR);
    CHECK_OK(reply(&a, &r, NULL, 0, NULL)); /* the pull that waited on key 7 */
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_EQ_INT(r.err_code, PS_EMOVED);
    CHECK_EQ_INT(r.slot, 3);
    CHECK_STR(r.owner_ep, "tcp://10.0.0.3:7000");
    CHECK_OK(move_reply(&a, PS_OUT_TAKEN, &mf));
    CHECK_EQ_INT(mf.rc, 0);
    CHECK(mf.token == 55 && mf.nchunks == 1 && mf.nparts == 0 && mf.block && mf.len == mf.bytes);
    pull(&a, 7, 0, 1); /* gone from a: a request sent before the I/O thread knew is told where */
    CHECK_OK(reply(&a, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.err_code, PS_EMOVED);
    CHECK_EQ_INT(r.slot, 3);
    CHECK_STR(r.owner_ep, "tcp://10.0.0.3:7000");
    load(&b, mf.block, mf.len, 56);
    ps_move_frame lf;
    CHECK_OK(move_reply(&b, PS_OUT_MOVED_IN, &lf));
    CHECK_MSG(lf.rc == 0, "%s", lf.why);
    CHECK(lf.token == 56 && lf.nchunks == 1 && lf.block == NULL);
    pull(&b, 7, 0, 1);
    CHECK_OK(reply(&b, &r, after, sizeof after, &got));
    CHECK(got == sizeof after && r.chunk_version == 1);
    CHECK(memcmp(before, after, sizeof after) == 0);
    /* and its rounds go on there: round 1 with both ranks */
    push(&b, 7, 0, 1, 0.5f);
    CHECK_OK(reply(&b, &r, NULL, 0, NULL));
    push(&b, 7, 1, 1, 0.5f);
    CHECK_OK(reply(&b, &r, NULL, 0, NULL));
    pull(&b, 7, 0, 2);
    CHECK_OK(reply(&b, &r, after, sizeof after, &got));
    CHECK_EQ_INT(r.chunk_version, 2);
    rig_close(&a);
    rig_close(&b);
}

/* A sparse pull of ids from table TABLE, with PS_FLAG_AWAY for home's part 0. */
static void spull(rig *g, const uint64_t *ids, size_t n, int away, int home)
{
    ps_header h = ps_test_header(PS_MSG_SPULL, 0, 77, TABLE, 0, 0);
    h.count = n;
    h.dim = DIM;
    if (away) {
        h.flags |= PS_FLAG_AWAY;
        h.home = home;
    }
    const void *fr[3] = {ids, "", ""};
    size_t len[3] = {n * 8, 0, 0};
    req(g, &h, fr, len, 3);
}

PS_TEST(a_partition_moved_is_served_away_from_home_and_checks_ids_against_it)
{
    rig a, b;
    CHECK_OK(rig_open(&a, "a2", 0));
    CHECK_OK(rig_open(&b, "b2", 1));
    ps_table_options o;
    ps_table_options_default(&o);
    o.dim = DIM;
    o.init = PS_TABLE_INIT_UNIFORM;
    o.init_scale = 0.5f;
    ps_table *store;
    char why[256];
    CHECK_OK(ps_tparts_make_store(ps_tparts_cfg(ps_updater_tparts(a.u)), TABLE, &o, &store, why,
                                  sizeof why));
    ps_cmd_frame cf;
    memset(&cf, 0, sizeof cf);
    cf.cmd = PS_CMD_TABLE;
    ps_header_init(&cf.h, PS_MSG_PULL);
    cf.h.key = TABLE;
    cf.h.table = o;
    cf.store = store;
    send_cmd(&a, &cf, 0);
    uint64_t mine = 1, other = 1; /* a row of server 0 (partition 0 of 1), one of server 1 */
    while (ps_table_row_misplaced(TABLE, &mine, 1, 0, S, 0, 1) == 0)
        mine++;
    while (ps_table_row_misplaced(TABLE, &other, 1, 1, S, 0, 1) == 0)
        other++;
    float rows_a[DIM], rows_b[DIM];
    size_t got;
    ps_header r;
    spull(&a, &mine, 1, 0, 0);
    CHECK_OK(reply(&a, &r, rows_a, sizeof rows_a, &got));
    CHECK(r.type != PS_MSG_ERROR && got == sizeof rows_a);
    /* b holds no partition of server 0 yet */
    spull(&b, &mine, 1, 1, 0);
    CHECK_OK(reply(&b, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.err_code, PS_ENOTFOUND);
    CHECK(strstr(r.err_text, "partition 0 of server 0") != NULL);
    take(&a, (ps_move_obj){PS_MOVE_PART, 0, TABLE, 0}, 60);
    ps_move_frame mf, lf;
    CHECK_OK(move_reply(&a, PS_OUT_TAKEN, &mf));
    CHECK_MSG(mf.rc == 0, "%s", mf.why);
    CHECK(mf.nparts == 1);
    load(&b, mf.block, mf.len, 61);
    CHECK_OK(move_reply(&b, PS_OUT_MOVED_IN, &lf));
    CHECK_MSG(lf.rc == 0, "%s", lf.why);
    spull(&b, &mine, 1, 1, 0);
    CHECK_OK(reply(&b, &r, rows_b, sizeof rows_b, &got));
    CHECK_MSG(r.type != PS_MSG_ERROR, "%s", r.err_text);
    CHECK(got == sizeof rows_b && memcmp(rows_a, rows_b, sizeof rows_b) == 0);
    /* an id of b's own partition sent to the moved one: refused, naming the home */
    spull(&b, &other, 1, 1, 0);
    CHECK_OK(reply(&b, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.err_code, PS_EPROTO);
    CHECK_MSG(strstr(r.err_text, "partition 0 of server 0") != NULL, "%s", r.err_text);
    /* without PS_FLAG_AWAY the request is for b's own partition, where the id is not */
    spull(&b, &mine, 1, 0, 0);
    CHECK_OK(reply(&b, &r, NULL, 0, NULL));
    CHECK(r.type == PS_MSG_ERROR);
    rig_close(&a);
    rig_close(&b);
}
