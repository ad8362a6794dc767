/* The message table (proto/ps_msg_table.h): each row's rules hold in proto's
 * validation (keys a message needs, payloads, shared memory, where `s`
 * goes) and in the server's dispatch (who may send it, a handler for every
 * type), and docs/PROTOCOL.md lists exactly the table. */
#include <limits.h>
#include <msgpack.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_error.h"
#include "ps_msg_doc.h"
#include "ps_proto.h"
#include "ps_test.h"
#include "ps_test_server.h"

static const char *const key_names[] = {
#define KEY_NAME_(name, key) key,
    PS_HDR_KEYS(KEY_NAME_)
#undef KEY_NAME_
};

/* A header of type t (a reply when reply) as an encoder sends it: every
 * field a row may need given. */
static ps_header full(uint32_t t, int reply)
{
    ps_header h;
    ps_header_init(&h, t);
    h.flags = reply ? PS_FLAG_REPLY : 0;
    h.seq = 77;
    h.rank = 0;
    h.key = 5;
    h.chunk = 1;
    ps_header_set_s(&h, 3);
    if (reply ? ps_msg_reply_has_payload(t) : ps_msg_request_has_payload(t)) {
        h.count = 4;
        h.dtype = PS_DTYPE_F32;
    }
    if (ps_msg_is_sparse(t)) { /* one row of 4 floats (a pushpull's: pull one) */
        h.count = 1;
        h.dim = 4;
        h.dtype = PS_DTYPE_F32;
        h.npull = t == PS_MSG_SPUSHPULL && !reply ? 1 : 0;
    }
    if (t == PS_MSG_TABLE && !reply) {
        ps_table_options_default(&h.table);
        h.table.dim = 4;
    }
    if (t >= PS_MSG_REPL_HELLO) { /* the group's epoch, a member, a snapshot's place */
        h.epoch = 2;
        h.member = 1;
        h.total = 64;
        h.stream_pos = 9;
    }
    if (t == PS_MSG_HELLO || t == PS_MSG_HYPER ||
        ((t == PS_MSG_REPL_HELLO || t == PS_MSG_REPL_JOIN) && !reply)) {
        h.hello.mode = PS_MODE_SYNC;
        h.hello.num_workers = 1;
        h.hello.num_servers = 1;
    }
    if (t == PS_MSG_ERROR)
        h.err_code = PS_EPROTO;
    return h;
}

/* Encode h, then re-pack its map without `drop` (a header key; NULL: none)
 * into out.  The length, or 0. */
static size_t encode_without(const ps_header *h, const char *drop, char *out, size_t cap)
{
    char buf[PS_HEADER_MAX];
    size_t len;
    if (ps_proto_encode(h, buf, sizeof buf, &len) != 0)
        return 0;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&u);
        return 0;
    }
    const msgpack_object_map *m = &u.data.via.map;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    size_t n = 0;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object_str *k = &m->ptr[i].key.via.str;
        n += !(drop && k->size == strlen(drop) && memcmp(k->ptr, drop, k->size) == 0);
    }
    msgpack_pack_map(&pk, n);
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object_str *k = &m->ptr[i].key.via.str;
        if (drop && k->size == strlen(drop) && memcmp(k->ptr, drop, k->size) == 0)
            continue;
        msgpack_pack_object(&pk, m->ptr[i].key);
        msgpack_pack_object(&pk, m->ptr[i].val);
    }
    size_t got = sb.size <= cap ? sb.size : 0;
    memcpy(out, sb.data, got);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&u);
    return got;
}

PS_TEST(every_type_from_1_to_the_last_has_one_row_with_its_own_name)
{
    CHECK(ps_msg_info_of(0) == NULL);
    CHECK(ps_msg_info_of(PS_MSG_TYPE_MAX + 1) == NULL);
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        const ps_msg_info *m = ps_msg_info_of(t);
        CHECK_MSG(m && m->type == t, "type %u has no row", t);
        CHECK(strcmp(ps_msg_type_name(t), m->name) == 0);
        for (uint32_t u = 1; u < t; u++)
            CHECK_MSG(strcmp(ps_msg_info_of(u)->name, m->name) != 0, "types %u and %u are both "
                      "called %s", u, t, m->name);
        /* `s` is needed exactly where it means something */
        CHECK_EQ_INT(!!(m->req_keys & PS_HK(S)), m->s_req != PS_S_NONE);
        CHECK_EQ_INT(!!(m->rep_keys & PS_HK(S)), m->s_rep != PS_S_NONE);
    }
    CHECK_EQ_INT(PS_MSG_HELLO, 1);
    CHECK_EQ_INT(PS_MSG_ERROR, 9);
    CHECK_EQ_INT(PS_MSG_HEARTBEAT, 10);
}

/* Every key a row requires is refused when missing, naming it; every other
 * key may be left out, as before the table. */
PS_TEST(a_message_without_a_key_its_row_requires_is_refused_naming_the_key)
{
    char buf[PS_HEADER_MAX], why[256];
    int refused = 0;
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++)
        for (int reply = 0; reply <= 1; reply++) {
            const ps_msg_info *m = ps_msg_info_of(t);
            uint32_t need = reply ? m->rep_keys : m->req_keys;
            ps_header a = full(t, reply), b;
            size_t len = encode_without(&a, NULL, buf, sizeof buf);
            CHECK(len);
            CHECK_MSG(ps_proto_decode(buf, len, &b, why, sizeof why) == 0, "%s %s: %s", m->name,
                      reply ? "reply" : "request", why);
            for (int k = PS_HK_F; k < PS_HK_COUNT; k++) {
                /* a reply without `f` is a request: of the tables' types it
                 * lacks what their requests need and their replies do not
                 * carry (the declaration, the ids to pull) */
                if (reply && k == PS_HK_F && (m->req_keys & ~m->rep_keys & ~PS_HK(S) &
                                              ~(PS_HK(K) | PS_HK(C))))
                    continue;
                len = encode_without(&a, key_names[k], buf, sizeof buf);
                CHECK(len);
                why[0] = 0;
                int rc = ps_proto_decode(buf, len, &b, why, sizeof why);
                char quoted[16];
                snprintf(quoted, sizeof quoted, "'%s'", key_names[k]);
                if (need & (1u << k)) {
                    CHECK_MSG(rc == PS_EPROTO && strstr(why, quoted) && strstr(why, m->name),
                              "%s %s without %s: rc %d (%s)", m->name,
                              reply ? "reply" : "request", quoted, rc, why);
                    refused++;
                } else {
                    CHECK_MSG(rc == 0, "%s %s without %s refused: %s", m->name,
                              reply ? "reply" : "request", quoted, why);
                }
            }
        }
    /* hello h x2, init k c, push, pull, pushpull k c s, barrier s x2, stats st,
     * error ec, and s in the replies of init, push, pull, pushpull; table k tb,
     * spull, spush, spushpull k c dim s, and s in their replies, dim in the
     * replies of spull and spushpull; hyper h s and h, assign, state, clock k
     * c and s in the reply, setstate k c s and s, allreduce and broadcast s x2,
     * sassign k c dim and s in its reply; lookup c and s in the reply, snapshot
     * s x2, snapread k c; replhello h ep mb and ep, repllive k c s ep, repljoin
     * h ep mb k c, replsnap k c ep tot rs; join s; s in the reply of members;
     * servers c x2, moveplan c */
    CHECK_EQ_INT(refused, 2 + 2 + 3 * 3 + 2 + 1 + 1 + 4 + 2 + 3 * 4 + 3 + 2 + 3 + 3 * 3 + 4 +
                              2 * 2 + 4 + 2 + 2 + 2 + 4 + 4 + 5 + 5 + 1 + 1 + 2 + 1);
    /* the step of a push: named with what it is */
    ps_header a = full(PS_MSG_PUSH, 0), b;
    size_t len = encode_without(&a, "s", buf, sizeof buf);
    CHECK_EQ_INT(ps_proto_decode(buf, len, &b, why, sizeof why), PS_EPROTO);
    CHECK_MSG(strstr(why, "push request without field 's' (the step of the gradient)"), "%s",
              why);
}

/* The wire's `s` lands in the one field the row names, both ways; where it
 * means nothing it is sent as 0 and read as nothing. */
PS_TEST(s_goes_to_the_field_its_row_names_and_nowhere_else)
{
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++)
        for (int reply = 0; reply <= 1; reply++) {
            const ps_msg_info *m = ps_msg_info_of(t);
            int meaning = reply ? m->s_rep : m->s_req;
            ps_header a = full(t, reply), b;
            a.push_step = 11, a.want_version = 12, a.chunk_version = 13, a.barrier_id = 14;
            a.opt_step = 15, a.members_version = 16;
            char buf[PS_HEADER_MAX], why[256];
            size_t len;
            CHECK_OK(ps_proto_encode(&a, buf, sizeof buf, &len));
            CHECK_MSG(ps_proto_decode(buf, len, &b, why, sizeof why) == 0, "%s", why);
            int64_t want[] = {0, 0, 0, 0, 0, 0};
            if (meaning != PS_S_NONE)
                want[meaning - PS_S_PUSH_STEP] = 10 + meaning;
            CHECK_MSG(b.push_step == want[0] && b.want_version == want[1] &&
                          b.chunk_version == want[2] && b.barrier_id == want[3] &&
                          b.opt_step == want[4] && b.members_version == want[5],
                      "%s %s: s went to %lld %lld %lld %lld %lld %lld", m->name,
                      reply ? "reply" : "request", (long long)b.push_step,
                      (long long)b.want_version, (long long)b.chunk_version,
                      (long long)b.barrier_id, (long long)b.opt_step,
                      (long long)b.members_version);
            CHECK_EQ_INT(ps_header_get_s(&b), meaning == PS_S_NONE ? 0 : 10 + meaning);
        }
    CHECK_EQ_INT(PS_S_PUSH_STEP, 1); /* the arithmetic above: 11 .. 16 */
    CHECK_EQ_INT(PS_S_MEMBERS, 6);
}

/* The frames a layout has, each of the size full()'s header gives it. */
static int layout_frames(int layout, size_t *bytes)
{
    /* ... a lookup's one table (16 bytes) and its 4 ids, a page of 4 bytes */
    static const size_t sizes[8][3] = {{0}, {16}, {8}, {16}, {8, 16}, {8, 16, 8}, {16, 32},
                                       {4}};
    memcpy(bytes, sizes[layout], sizeof sizes[layout]);
    return ps_payload_frames(layout);
}

/* check_frames takes frames exactly where the row has a payload, and the
 * shared-memory flag exactly where the row allows it. */
PS_TEST(payload_and_shared_memory_follow_each_row)
{
    char why[256];
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++)
        for (int reply = 0; reply <= 1; reply++) {
            const ps_msg_info *m = ps_msg_info_of(t);
            int layout = reply ? m->rep_payload : m->req_payload, has = layout != PS_PL_NONE;
            ps_header h = full(t, reply);
            if (!ps_msg_is_sparse(t))
                h.count = 4;
            h.dtype = PS_DTYPE_F32;
            size_t bytes[3];
            int nf = layout_frames(has ? layout : PS_PL_VALUES, bytes);
            CHECK_MSG((ps_proto_check_frames(&h, nf, bytes, why, sizeof why) == 0) == has,
                      "%s %s with its frames: %s", m->name, reply ? "reply" : "request", why);
            CHECK_MSG((ps_proto_check_payload(&h, 0, 0, why, sizeof why) == 0) == !has,
                      "%s %s without a frame", m->name, reply ? "reply" : "request");
            h.flags |= PS_FLAG_SHM;
            int rc = ps_proto_check_payload(&h, 0, 0, why, sizeof why);
            CHECK_MSG((rc == 0) == m->shm, "%s %s in shared memory: %d (%s)", m->name,
                      reply ? "reply" : "request", rc, why);
            if (!m->shm)
                CHECK(strstr(why, "the shared-memory flag is for init, push, pull, pushpull, spull, spush, spushpull and sassign"));
            CHECK_EQ_INT(ps_msg_request_has_payload(t), m->req_payload == PS_PL_VALUES);
            CHECK_EQ_INT(ps_msg_reply_has_payload(t), m->rep_payload == PS_PL_VALUES);
        }
}

/* ---------- the server's dispatch ---------- */

/* Send a request of type t from `rank` on s, with what its row needs (an
 * init, push or pull of key 5 chunk 0 at step 0), without waiting. */
static int tell(void *s, uint32_t t, int rank, uint64_t seq)
{
    ps_header h = full(t, 0);
    h.rank = rank;
    h.seq = seq;
    h.key = 5;
    h.chunk = 0;
    h.total = 4;
    ps_header_set_s(&h, 0);
    if (t == PS_MSG_HELLO) { /* as ps_test_hello's */
        h.hello.mode = PS_MODE_ASYNC;
        h.hello.max_staleness = -1;
        h.hello.num_workers = 2;
    }
    float pay[4] = {1, 2, 3, 4};
    if (ps_msg_is_sparse(t)) { /* id 3: its row, and to pull */
        uint64_t id = 3;
        const void *frames[3] = {&id, pay, &id};
        size_t bytes[3];
        int nf = layout_frames(ps_msg_request_layout(t), bytes);
        if (t == PS_MSG_SPULL)
            frames[0] = &id;
        return ps_test_send_frames(s, &h, frames, bytes, nf);
    }
    if (t == PS_MSG_LOOKUP) { /* ids 3 .. 6 of table 5 (none here: the handler says) */
        uint64_t ids[4] = {3, 4, 5, 6};
        unsigned char ent[16] = {5, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0};
        const void *frames[2] = {ent, ids};
        size_t bytes[2] = {16, 32};
        h.count = 4;
        return ps_test_send_frames(s, &h, frames, bytes, 2);
    }
    if (t == PS_MSG_SNAPSHOT) { /* each item as it is; no keys of their own: an empty frame */
        const void *frames[1] = {pay};
        size_t bytes[1] = {0};
        h.count = 0;
        ps_header_set_s(&h, -1);
        return ps_test_send_frames(s, &h, frames, bytes, 1);
    }
    if (ps_msg_request_layout(t) == PS_PL_BYTES) { /* a replica's snapshot part: 4 bytes */
        h.count = 4;
        const void *frames[1] = {pay};
        size_t bytes[1] = {4};
        return ps_test_send_frames(s, &h, frames, bytes, 1);
    }
    int data = ps_msg_request_has_payload(t);
    return ps_test_send(s, &h, data ? pay : NULL, data ? 4 : 0);
}

/* r answers a t: its reply, or a refusal its handler (not the dispatch)
 * gave: what it asks for is not there (a pull of a chunk before its init),
 * or one that names the type first ("lookup: table 5 is not declared"). */
static int handled(const ps_header *r, uint32_t t)
{
    const char *name = ps_msg_type_name(t);
    return (r->type == t && (r->flags & PS_FLAG_REPLY)) ||
           (r->type == PS_MSG_ERROR && r->err_code == PS_ENOTFOUND) ||
           (r->type == PS_MSG_ERROR && !strncmp(r->err_text, name, strlen(name)) &&
            r->err_text[strlen(name)] == ':');
}

/* The same, and its reply into r.  0, or -1 when none came. */
static int ask(void *s, uint32_t t, int rank, uint64_t seq, ps_header *r)
{
    float out[4];
    if (tell(s, t, rank, seq) != 0)
        return -1;
    return ps_test_recv(s, PS_TEST_RPC_MS, r, out, 4, NULL) == 0 ? 0 : -1;
}

/* A request of every type gets its handler's answer (its own type with the
 * reply flag) or a clear error, from a worker before its hello, from rank
 * -1 and from a worker after hello, as the row's `from` says. */
PS_TEST(the_server_dispatches_every_type_as_its_row_says)
{
    ps_test_server sv;
    /* momentum: the state requests have state to read and load */
    CHECK_OK(ps_test_server_start(&sv, 1, "--num-workers 2 --mode async --optimizer momentum "
                                          "--quiet"));
    void *w0 = ps_test_dealer(sv.port), *w1 = ps_test_dealer(sv.port);
    void *tool = ps_test_dealer(sv.port);
    ps_header r;
    uint64_t seq = 1;
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        const ps_msg_info *m = ps_msg_info_of(t);
        /* worker 1 before its hello: anything but a hello is sent back to say it */
        if (t != PS_MSG_HELLO && m->from != PS_FROM_NOBODY) {
            CHECK_OK(ask(w1, t, 1, ++seq, &r));
            CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == PS_EHELLO &&
                          strstr(r.err_text, "before hello"),
                      "%s before hello: %s", m->name, r.err_text);
        }
        /* rank -1: a tool */
        CHECK_OK(ask(tool, t, -1, ++seq, &r));
        CHECK_EQ_INT(r.seq, seq);
        if (m->from == PS_FROM_WORKER)
            CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == PS_ESTATE &&
                          strstr(r.err_text, "rank -1 may send only hello, pull, stats, "
                                             "shutdown, heartbeat, lookup, snapshot, snapread "
                                             "and servers"),
                      "%s from rank -1: %s", m->name, r.err_text);
        else if (m->from == PS_FROM_ANY || m->from == PS_FROM_LIVE)
            CHECK_MSG(handled(&r, t), "%s from rank -1: %s", m->name, r.err_text);
        else if (m->from == PS_FROM_SERVER) /* answered: the servers' own checks */
            CHECK_MSG(r.type == t || r.type == PS_MSG_ERROR, "%s from rank -1: %s", m->name,
                      r.err_text);
        else if (m->from == PS_FROM_PEER) /* a server without replicas */
            CHECK_MSG(r.type == PS_MSG_ERROR && r.err_code == PS_ESTATE &&
                          strstr(r.err_text, "no replicas"),
                      "%s from rank -1: %s", m->name, r.err_text);
    }
    CHECK_OK(ps_test_hello(w0, 0, PS_MODE_ASYNC, 2, -1));
    CHECK_OK(ps_test_hello(w1, 1, PS_MODE_ASYNC, 2, -1));
    /* worker 0, in type order: the init comes before the push and the pulls
     * of its chunk */
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        const ps_msg_info *m = ps_msg_info_of(t);
        /* worker 1 is there already */
        int both = t == PS_MSG_BARRIER || t == PS_MSG_ALLREDUCE || t == PS_MSG_BROADCAST;
        if (both)
            CHECK_OK(tell(w1, t, 1, 999));
        CHECK_OK(ask(w0, t, 0, ++seq, &r));
        CHECK_EQ_INT(r.seq, seq);
        if (m->from == PS_FROM_NOBODY) {
            CHECK_EQ_INT(r.type, PS_MSG_ERROR);
            CHECK_EQ_INT(r.err_code, PS_EPROTO);
            CHECK_MSG(strstr(r.err_text, "error messages are replies only"), "%s",
                      r.err_text);
        } else if (m->from == PS_FROM_ADMIN) { /* this server takes no shutdown message */
            CHECK_EQ_INT(r.type, PS_MSG_ERROR);
            CHECK_EQ_INT(r.err_code, PS_EAUTH);
        } else if (m->from == PS_FROM_PEER || m->from == PS_FROM_SERVER) {
            /* servers send these, not workers */
            CHECK_EQ_INT(r.type, PS_MSG_ERROR);
            CHECK_MSG(r.err_code == PS_EPROTO && strstr(r.err_text, "as rank -1"), "%s: %s",
                      m->name, r.err_text);
        } else if (t == PS_MSG_JOIN) { /* its handler: this job is not elastic */
            CHECK_EQ_INT(r.type, PS_MSG_ERROR);
            CHECK_MSG(r.err_code == PS_ESTATE && strstr(r.err_text, "elastic job"), "%s: %s",
                      m->name, r.err_text);
        } else {
            CHECK_MSG(handled(&r, t), "%s: got %s %d (%s)", m->name, ps_msg_type_name(r.type),
                      r.err_code, r.err_text);
        }
        if (both) {
            float out[4];
            CHECK_OK(ps_test_recv(w1, PS_TEST_RPC_MS, &r, out, 4, NULL));
            CHECK_EQ_INT(r.type, t);
            CHECK_EQ_INT(r.seq, 999);
        }
    }
    CHECK_EQ_INT(ps_test_stop(sv.pid, PS_TEST_RPC_MS), 0);
    zmq_close(w0);
    zmq_close(w1);
    zmq_close(tool);
}

/* ---------- docs/PROTOCOL.md ---------- */

/* docs/PROTOCOL.md of this checkout: from the current directory (tests run
 * from the root) or above this program (build/tests/..). */
static char *read_protocol_doc(char *path, size_t cap)
{
    char base[PATH_MAX];
    snprintf(path, cap, "docs/PROTOCOL.md");
    char *doc = ps_test_read_file(path, NULL);
    ssize_t n = readlink("/proc/self/exe", base, sizeof base - 1);
    for (int up = 0; !doc && n > 0 && up < 4; up++) {
        base[n] = 0;
        char *slash = strrchr(base, '/');
        if (!slash)
            break;
        *slash = 0;
        n = slash - base;
        snprintf(path, cap, "%s/docs/PROTOCOL.md", base);
        doc = ps_test_read_file(path, NULL);
    }
    return doc;
}

PS_TEST(protocol_doc_lists_exactly_the_message_table)
{
    char path[PATH_MAX + 32], why[256];
    char *doc = read_protocol_doc(path, sizeof path);
    CHECK_MSG(doc, "docs/PROTOCOL.md not found");
    ps_strbuf want = {0};
    int rc = ps_msg_doc_splice(doc, &want, why, sizeof why);
    CHECK_MSG(rc == 0, "%s: %s", path, why);
    /* the first line that differs, for the message */
    const char *a = doc, *b = ps_strbuf_str(&want);
    int line = 1;
    while (*a && *a == *b) {
        line += *a == '\n';
        a++, b++;
    }
    int same = *a == *b;
    free(doc);
    ps_strbuf_free(&want);
    CHECK_MSG(same, "%s line %d differs from proto/ps_msg_table.h: run `make protocol-doc`",
              path, line);
}

PS_TEST(the_doc_table_has_a_row_for_every_type)
{
    ps_strbuf t = {0};
    CHECK_OK(ps_msg_doc_table(&t));
    for (uint32_t k = 1; k <= PS_MSG_TYPE_MAX; k++) {
        char row[64];
        snprintf(row, sizeof row, "\n| %u | %s | ", k, ps_msg_type_name(k));
        CHECK_MSG(strstr(ps_strbuf_str(&t), row), "no row for %s", ps_msg_type_name(k));
    }
    CHECK(strstr(ps_strbuf_str(&t), "| `k`, `c`, `s` (the step of the gradient) |"));
    ps_strbuf_free(&t);
    /* a document without its markers is refused, not rewritten */
    char why[256];
    ps_strbuf out = {0};
    CHECK_EQ_INT(ps_msg_doc_splice("# Wire protocol\n", &out, why, sizeof why), PS_EINVAL);
    CHECK(strstr(why, "message table"));
    CHECK_EQ_INT(ps_msg_doc_splice(PS_MSG_DOC_END "\n" PS_MSG_DOC_BEGIN "\n", &out, why,
                                   sizeof why),
                 PS_EINVAL);
    ps_strbuf_free(&out);
    /* the lines between the markers are replaced, the rest kept */
    CHECK_OK(ps_msg_doc_splice("a\n" PS_MSG_DOC_BEGIN "\nold\n" PS_MSG_DOC_END "\nb\n", &out,
                               why, sizeof why));
    CHECK(strstr(ps_strbuf_str(&out), "a\n" PS_MSG_DOC_BEGIN "\n| t | name |") ==
          ps_strbuf_str(&out));
    CHECK(!strstr(ps_strbuf_str(&out), "old"));
    size_t n = strlen(ps_strbuf_str(&out));
    CHECK(n > 8 && strcmp(ps_strbuf_str(&out) + n - strlen(PS_MSG_DOC_END "\nb\n"),
                          PS_MSG_DOC_END "\nb\n") == 0);
    ps_strbuf_free(&out);
}
