/* What each fuzz target checks on one input.  Included by the libFuzzer
 * targets (tests/fuzz/fuzz_*.c, built by `make fuzz`) and by
 * tests/test_fuzz_regress.c, which replays the committed corpus and every
 * crash ever found through these same functions under `make test`.
 *
 * Each check returns NULL when the input passed (being refused with a proper
 * error code counts as passing) and otherwise a sentence naming the property
 * that broke (written into msg).  Memory errors and leaks are the sanitizers'
 * job; these catch wrong answers.
 *
 * Input formats:
 *   fuzz_proto: a header frame, optionally followed by payload bytes.  The
 *     whole input is decoded as a header (and, when it decodes, encoded and
 *     decoded again: the round trip must give the same header and the same
 *     bytes).  The input is also split after its first msgpack value into
 *     header + payload, and ps_proto_check_payload must accept exactly the
 *     payloads the protocol allows for that header; a table message's
 *     frames (ids, rows, ids to pull), sized from its header, must be
 *     accepted exactly within the protocol's limits and refused one byte
 *     off.
 *   fuzz_idx: one IDX file (plain or gzip).  It is loaded as the image file
 *     (with a made-up label file of the count its header claims) and as the
 *     label file (with a made-up image file of that count).
 *   fuzz_smap: an encoded server map (a MAP reply's payload,
 *     common/ps_smap.h).  A refused one gets PS_EPROTO and a reason; an
 *     accepted one encodes back to the same bytes, its lookups give every
 *     override's owner, a live slot, and it holds what its head claims. */
#ifndef PS_FUZZ_CHECKS_H
#define PS_FUZZ_CHECKS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data.h"
#include "ps_error.h"
#include "ps_opt_table.h"
#include "ps_proto.h"
#include "ps_smap.h"

/* Each includer uses some of these helpers only. */
#define FUZZ_FN static __attribute__((unused))

FUZZ_FN const char *fuzz_fail(char *msg, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
FUZZ_FN const char *fuzz_fail(char *msg, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, len, fmt, ap);
    va_end(ap);
    return msg;
}

/* ---- proto ---------------------------------------------------------------- */

/* Length of the first msgpack value in p[0..n), 0 when it is not complete or
 * nests deeper than 8.  Never allocates (declared counts are only walked). */
FUZZ_FN size_t fuzz_msgpack_len(const uint8_t *p, size_t n, size_t pos, int depth)
{
    if (depth > 8 || pos >= n)
        return 0;
    uint8_t b = p[pos++];
    uint64_t items = 0, skip = 0;
    size_t need = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return pos;
    if ((b & 0xe0) == 0xa0)
        skip = b & 0x1f;
    else if ((b & 0xf0) == 0x90)
        items = b & 0x0f;
    else if ((b & 0xf0) == 0x80)
        items = 2u * (b & 0x0f);
    else {
        static const struct { uint8_t b, len, kind; uint8_t extra; } t[] = {
            /* kind 0: fixed skip len; 1: length field of len bytes then that many
             * bytes (+extra); 2: array count; 3: map count */
            {0xcc, 1, 0, 0}, {0xd0, 1, 0, 0}, {0xcd, 2, 0, 0}, {0xd1, 2, 0, 0},
            {0xce, 4, 0, 0}, {0xd2, 4, 0, 0}, {0xca, 4, 0, 0}, {0xcf, 8, 0, 0},
            {0xd3, 8, 0, 0}, {0xcb, 8, 0, 0}, {0xd4, 2, 0, 0}, {0xd5, 3, 0, 0},
            {0xd6, 5, 0, 0}, {0xd7, 9, 0, 0}, {0xd8, 17, 0, 0}, {0xd9, 1, 1, 0},
            {0xc4, 1, 1, 0}, {0xda, 2, 1, 0}, {0xc5, 2, 1, 0}, {0xdb, 4, 1, 0},
            {0xc6, 4, 1, 0}, {0xc7, 1, 1, 1}, {0xc8, 2, 1, 1}, {0xc9, 4, 1, 1},
            {0xdc, 2, 2, 0}, {0xdd, 4, 2, 0}, {0xde, 2, 3, 0}, {0xdf, 4, 3, 0}};
        size_t i = 0;
        while (i < sizeof t / sizeof t[0] && t[i].b != b)
            i++;
        if (i == sizeof t / sizeof t[0])
            return 0;
        if (t[i].kind == 0) {
            skip = t[i].len;
        } else {
            need = t[i].len;
            if (n - pos < need)
                return 0;
            uint64_t v = 0;
            for (size_t k = 0; k < need; k++)
                v = v << 8 | p[pos + k];
            pos += need;
            if (t[i].kind == 1)
                skip = v + t[i].extra;
            else
                items = t[i].kind == 3 ? 2 * v : v;
        }
    }
    if (skip > n - pos)
        return 0;
    pos += (size_t)skip;
    if (items > n - pos) /* every item takes at least one byte */
        return 0;
    for (uint64_t i = 0; i < items; i++)
        if (!(pos = fuzz_msgpack_len(p, n, pos, depth + 1)))
            return 0;
    return pos;
}

/* Where in a ps_header byte `off` is, for the message of a failed check. */
FUZZ_FN const char *fuzz_field_at(size_t off)
{
#define FUZZ_AT_(f) {offsetof(ps_header, f), sizeof(((ps_header *)0)->f), #f}
    static const struct { size_t off, size; const char *name; } f[] = {
        FUZZ_AT_(version), FUZZ_AT_(type), FUZZ_AT_(flags), FUZZ_AT_(seq),
        FUZZ_AT_(seq_negative), FUZZ_AT_(rank), FUZZ_AT_(key), FUZZ_AT_(chunk),
        FUZZ_AT_(push_step), FUZZ_AT_(want_version), FUZZ_AT_(chunk_version),
        FUZZ_AT_(barrier_id), FUZZ_AT_(count), FUZZ_AT_(dtype), FUZZ_AT_(total),
        FUZZ_AT_(shm_off), FUZZ_AT_(shm_dst), FUZZ_AT_(npush), FUZZ_AT_(dim),
        FUZZ_AT_(npull), FUZZ_AT_(table), FUZZ_AT_(err_code),
        FUZZ_AT_(err_text), FUZZ_AT_(hello.mode), FUZZ_AT_(hello.max_staleness),
        FUZZ_AT_(hello.num_workers), FUZZ_AT_(hello.num_servers), FUZZ_AT_(hello.server_rank),
        FUZZ_AT_(hello.model_fp), FUZZ_AT_(hello.opt), FUZZ_AT_(hello.shm_name),
        FUZZ_AT_(hello.shm_nonce), FUZZ_AT_(hello.shm_size), FUZZ_AT_(hello.shm),
        FUZZ_AT_(hello.shm_why), FUZZ_AT_(hello.wire_dtype), FUZZ_AT_(hello.token),
        FUZZ_AT_(hello.threads), FUZZ_AT_(hello.tables_fp),
        FUZZ_AT_(hello), FUZZ_AT_(stats), FUZZ_AT_(barrier), FUZZ_AT_(admin)};
#undef FUZZ_AT_
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (off >= f[i].off && off < f[i].off + f[i].size)
            return f[i].name;
    return "(padding)";
}

/* A decoded header and the decoding of its encoding must be the same in
 * every byte: both start from ps_header_init (all zero, padding included)
 * and the decoder only sets fields, so this covers every field there is,
 * also one added later.  A field the decoder accepts but the encoder does
 * not write (a key that does not apply to the message) shows up here: the
 * decoder must refuse it or leave the field as init made it. */
FUZZ_FN const char *fuzz_same_header(const ps_header *a, const ps_header *b, char *msg,
                                    size_t len)
{
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (size_t i = 0; i < sizeof *a; i++)
        if (x[i] != y[i])
            return fuzz_fail(msg, len, "round trip changed field %s of a %s%s (byte %zu)",
                             fuzz_field_at(i), ps_msg_type_name(a->type),
                             a->flags & PS_FLAG_REPLY ? " reply" : " request", i);
    return NULL;
}

/* Every field of a decoded header is within the ranges of docs/PROTOCOL.md. */
FUZZ_FN const char *fuzz_header_in_range(const ps_header *h, char *msg, size_t len)
{
    if (h->version != PS_PROTO_VERSION || h->type < 1 || h->type > PS_MSG_TYPE_MAX ||
        (h->flags & ~PS_FLAG_MASK) || h->seq_negative || h->rank < -1 ||
        h->rank > PS_MAX_RANK || h->chunk >= PS_MAX_CHUNK || ps_header_get_s(h) < -1 ||
        ps_header_get_s(h) > INT64_MAX / 2 || h->dtype > PS_DTYPE_MAX ||
        h->count * (h->dtype ? ps_dtype_size(h->dtype) : 1) > PS_MAX_PAYLOAD_BYTES ||
        h->total > UINT64_MAX / 8 || h->shm_off > UINT64_MAX / 8 ||
        h->shm_dst > UINT64_MAX / 8 || h->npush > 1u << 30 || h->err_code < 0 ||
        h->err_code > 1000 || memchr(h->err_text, 0, sizeof h->err_text) == NULL ||
        memchr(h->admin, 0, sizeof h->admin) == NULL)
        return fuzz_fail(msg, len, "decode accepted an out-of-range header (type %u rank %d)",
                         h->type, h->rank);
    for (const char *a = h->admin; *a; a++)
        if (*a <= 0x20 || *a >= 0x7f)
            return fuzz_fail(msg, len, "decode accepted an admin token with byte 0x%02x",
                             (unsigned char)*a);
    const ps_hello *o = &h->hello;
    char why[256];
    if (h->type == PS_MSG_HELLO &&
        (o->mode < PS_MODE_SYNC || o->mode > PS_MODE_ASYNC || o->num_workers < 1 ||
         o->num_servers < 1 || o->server_rank < -1 || o->server_rank > PS_MAX_RANK ||
         o->max_staleness < -1 || o->opt.kind < 0 || o->opt.kind > PS_OPT_KIND_LAST ||
         o->shm < 0 || o->shm > 1 || o->wire_dtype > PS_DTYPE_MAX ||
         !memchr(o->shm_name, 0, sizeof o->shm_name) ||
         !memchr(o->shm_why, 0, sizeof o->shm_why) ||
         (!o->shm_name[0] && (o->shm_nonce || o->shm_size))))
        return fuzz_fail(msg, len, "decode accepted an out-of-range hello");
    if (h->type == PS_MSG_HELLO && ps_opt_check(&o->opt, 1, why, sizeof why))
        return fuzz_fail(msg, len, "decode accepted a hello whose optimizer is out of range: %s",
                         why);
    /* a declaration: every number of `tb` a number, a kind in the decoder's
     * range (the server's ps_table_decl_check refuses the dense-only kinds
     * inside it, 7 to 9, by name) */
    const ps_table_options *t = &h->table;
    if (h->type == PS_MSG_TABLE && !(h->flags & PS_FLAG_REPLY) &&
        (t->opt.kind < 0 || t->opt.kind > PS_TABLE_OPT_ROWWISE_ADAGRAD || t->init_scale != t->init_scale ||
         t->ftrl_beta != t->ftrl_beta || t->ftrl_l1 != t->ftrl_l1 || t->ftrl_l2 != t->ftrl_l2))
        return fuzz_fail(msg, len, "decode accepted a table declaration of optimizer %d or with "
                         "a NaN", t->opt.kind);
    for (int p = 0; h->type == PS_MSG_TABLE && p < PS_OPT_NPARAMS; p++) {
        double v = ps_opt_get(&t->opt, p);
        if (v != v)
            return fuzz_fail(msg, len, "decode accepted tb.%s = NaN", ps_opt_param_at(p)->key);
    }
    /* a message that is not a declaration carries none */
    static const ps_table_options none;
    if ((h->type != PS_MSG_TABLE || (h->flags & PS_FLAG_REPLY)) && memcmp(t, &none, sizeof none))
        return fuzz_fail(msg, len, "decode filled a table declaration into a %s",
                         ps_msg_type_name(h->type));
    const ps_barrier_info *b = &h->barrier;
    if (b->id < -1 || b->nranks > PS_BARRIER_RANKS_MAX || b->missing > PS_MAX_RANK + 1u)
        return fuzz_fail(msg, len, "decode accepted an out-of-range barrier");
    for (uint32_t i = 0; i < b->nranks; i++)
        if (b->ranks[i] < 0 || b->ranks[i] > PS_MAX_RANK)
            return fuzz_fail(msg, len, "decode accepted barrier rank %d", (int)b->ranks[i]);
    return NULL;
}

FUZZ_FN const char *fuzz_decode_ok_rc(int rc, const char *why, char *msg, size_t len)
{
    if (rc != PS_EPROTO && rc != PS_EVERSION && rc != PS_ETOOBIG)
        return fuzz_fail(msg, len, "decode returned %d", rc);
    if (!memchr(why, 0, 256) || !why[0])
        return fuzz_fail(msg, len, "decode failed (%d) without a reason", rc);
    return NULL;
}

/* A table message (spull, spush, spushpull and their replies): frames of
 * ids and rows whose sizes follow n, np and dim (tests/test_proto.c checks
 * those combinations).  Here, whatever the header: a refusal is PS_EPROTO or
 * PS_ETOOBIG with a reason, and nothing is accepted with the wrong number of
 * frames for its layout (none in shared memory), or, where the layout has
 * ids or rows, a dim outside [1, PS_MAX_TABLE_DIM] or rows in shared memory
 * that are not float32. */
FUZZ_FN const char *fuzz_sparse_payload_oracle(const ps_header *h, size_t plen, char *msg,
                                               size_t len)
{
    char why[256];
    int reply = (h->flags & PS_FLAG_REPLY) != 0;
    int layout = reply ? ps_msg_reply_layout(h->type) : ps_msg_request_layout(h->type);
    int shm = (h->flags & PS_FLAG_SHM) != 0;
    const ps_msg_info *m = ps_msg_info_of(h->type);
    for (int nframes = 0; nframes <= 3; nframes++) {
        why[0] = 0;
        int rc = ps_proto_check_payload(h, nframes, plen, why, sizeof why);
        if (rc && ((rc != PS_EPROTO && rc != PS_ETOOBIG) || !why[0]))
            return fuzz_fail(msg, len, "check_payload(%s) failed with %d and reason '%s'",
                             ps_msg_type_name(h->type), rc, why);
        if (rc)
            continue;
        const char *bad =
            shm && !(m && m->shm)                                   ? "shared memory"
            : nframes != (shm ? 0 : ps_payload_frames(layout))      ? "frame count"
            : !ps_payload_frames(layout)                            ? NULL /* a bare ack */
            : h->dim < 1 || h->dim > PS_MAX_TABLE_DIM               ? "dim"
            : shm && h->dtype != PS_DTYPE_F32                       ? "dtype in shared memory"
                                                                    : NULL;
        if (bad)
            return fuzz_fail(msg, len, "check_payload(%s%s%s, %d frames, dim %u, d %u) accepted "
                             "a wrong %s", ps_msg_type_name(h->type), reply ? " reply" : "",
                             shm ? " in shared memory" : "", nframes, h->dim, h->dtype, bad);
    }
    return NULL;
}

/* A table message's frames over the network, sized as docs/PROTOCOL.md
 * says (ids: 8 x n; rows: n x dim x the size of d; ids to pull: 8 x np):
 * ps_proto_check_frames accepts them exactly when the header is within the
 * limits (dim in [1, PS_MAX_TABLE_DIM], n and np at most
 * PS_MAX_SPARSE_IDS, rows of a known d and at most PS_MAX_PAYLOAD_BYTES),
 * and refuses every frame one byte too long or too short. */
FUZZ_FN const char *fuzz_sparse_frames_oracle(const ps_header *h, char *msg, size_t len)
{
    int reply = (h->flags & PS_FLAG_REPLY) != 0;
    int layout = reply ? ps_msg_reply_layout(h->type) : ps_msg_request_layout(h->type);
    int nf = ps_payload_frames(layout);
    if ((h->flags & PS_FLAG_SHM) || nf == 0)
        return NULL;
    int has_ids = layout != PS_PL_ROWS, has_rows = layout != PS_PL_IDS;
    size_t es = ps_dtype_size(h->dtype);
    int ok = h->dim >= 1 && h->dim <= PS_MAX_TABLE_DIM && h->count <= PS_MAX_SPARSE_IDS &&
             (layout != PS_PL_IDS_ROWS_IDS || h->npull <= PS_MAX_SPARSE_IDS) &&
             (!has_rows || (es && h->count * h->dim * es <= PS_MAX_PAYLOAD_BYTES));
    if (h->count > PS_MAX_SPARSE_IDS || h->npull > PS_MAX_SPARSE_IDS)
        return NULL; /* sizes past size_t's reach on 32 bits; refused, checked above */
    size_t b[3];
    int k = 0;
    if (has_ids)
        b[k++] = (size_t)(8 * h->count);
    if (has_rows)
        b[k++] = (size_t)(h->count * h->dim * (es ? es : 1));
    if (layout == PS_PL_IDS_ROWS_IDS)
        b[k++] = (size_t)(8 * h->npull);
    char why[256];
    why[0] = 0;
    int rc = ps_proto_check_frames(h, nf, b, why, sizeof why);
    if ((rc == 0) != ok)
        return fuzz_fail(msg, len, "check_frames(%s%s, n %llu, np %llu, dim %u, d %u) with the "
                         "frames the protocol sizes = %d (%s), expected %s",
                         ps_msg_type_name(h->type), reply ? " reply" : "",
                         (unsigned long long)h->count, (unsigned long long)h->npull, h->dim,
                         h->dtype, rc, why, ok ? "ok" : "an error");
    if (rc && ((rc != PS_EPROTO && rc != PS_ETOOBIG) || !why[0]))
        return fuzz_fail(msg, len, "check_frames(%s) failed with %d and reason '%s'",
                         ps_msg_type_name(h->type), rc, why);
    for (int i = 0; ok && i < nf; i++)
        for (int d = -1; d <= 1; d += 2) {
            size_t c[3] = {b[0], b[1], b[2]};
            if (d < 0 && c[i] == 0)
                continue;
            c[i] += (size_t)d;
            if (ps_proto_check_frames(h, nf, c, why, sizeof why) != PS_EPROTO)
                return fuzz_fail(msg, len, "check_frames(%s%s) took frame %d of %zu bytes, "
                                 "not %zu", ps_msg_type_name(h->type), reply ? " reply" : "",
                                 i + 1, c[i], b[i]);
        }
    return NULL;
}

/* A reader's or an export's frames (a lookup's tables and ids, a
 * snapshot's bytes): never in shared memory; a lookup request exactly with
 * its two frames, the first 1 to PS_MAX_LOOKUP_TABLES entries of 16 bytes
 * and the second 8 x n bytes (n at most PS_MAX_SPARSE_IDS); a frame of
 * bytes exactly with one frame of n bytes, n at most a page.  A refusal is
 * PS_EPROTO or PS_ETOOBIG with a reason. */
FUZZ_FN const char *fuzz_read_payload_oracle(const ps_header *h, int layout, size_t plen,
                                             char *msg, size_t len)
{
    char why[256];
    int shm = (h->flags & PS_FLAG_SHM) != 0;
    for (int nframes = 0; nframes <= 3; nframes++) {
        size_t sizes[3] = {plen, (size_t)h->count, 16};
        for (int s = 0; s < 3; s++) {
            size_t bytes = sizes[s];
            /* check_payload gives frame 1 `bytes` and any later frame 0 */
            int want = !shm &&
                       (layout == PS_PL_BYTES
                            ? nframes == 1 && h->count <= ps_msg_bytes_limit(h->type) && bytes == h->count
                            : nframes == 2 && bytes >= PS_LOOKUP_ENTRY_BYTES &&
                                  bytes % PS_LOOKUP_ENTRY_BYTES == 0 &&
                                  bytes / PS_LOOKUP_ENTRY_BYTES <= PS_MAX_LOOKUP_TABLES &&
                                  h->count == 0);
            why[0] = 0;
            int rc = ps_proto_check_payload(h, nframes, bytes, why, sizeof why);
            if ((rc == 0) != want)
                return fuzz_fail(msg, len, "check_payload(%s%s%s, %d frames, %zu bytes, n %llu) "
                                 "= %d, expected %s", ps_msg_type_name(h->type),
                                 (h->flags & PS_FLAG_REPLY) ? " reply" : "",
                                 shm ? " in shared memory" : "", nframes, bytes,
                                 (unsigned long long)h->count, rc, want ? "ok" : "an error");
            if (rc && ((rc != PS_EPROTO && rc != PS_ETOOBIG) || !why[0]))
                return fuzz_fail(msg, len, "check_payload failed with %d and reason '%s'", rc,
                                 why);
        }
    }
    return NULL;
}

/* ps_proto_check_payload must accept exactly: with the shared-memory flag,
 * no frame, for the types whose row takes shared memory, with a count and a
 * known dtype where a payload (or a request's reply payload) lives in the
 * arena; without it, no frame for types without a payload and one frame of
 * count x dtype-size bytes (count > 0, known dtype) for types with one. */
FUZZ_FN const char *fuzz_payload_oracle(const ps_header *h, size_t plen, char *msg, size_t len)
{
    if (ps_msg_is_sparse(h->type)) {
        const char *bad = fuzz_sparse_payload_oracle(h, plen, msg, len);
        return bad ? bad : fuzz_sparse_frames_oracle(h, msg, len);
    }
    char why[256];
    int reply = (h->flags & PS_FLAG_REPLY) != 0;
    int layout = reply ? ps_msg_reply_layout(h->type) : ps_msg_request_layout(h->type);
    if (layout == PS_PL_LOOKUP || layout == PS_PL_BYTES)
        return fuzz_read_payload_oracle(h, layout, plen, msg, len);
    int needs = reply ? ps_msg_reply_has_payload(h->type) : ps_msg_request_has_payload(h->type);
    const ps_msg_info *m = ps_msg_info_of(h->type);
    int shm = (h->flags & PS_FLAG_SHM) != 0;
    int in_arena = needs || (!reply && ps_msg_reply_has_payload(h->type));
    size_t es = ps_dtype_size(h->dtype);
    for (int nframes = 0; nframes <= 2; nframes++) {
        size_t sizes[3] = {plen, (size_t)h->count * es, (size_t)h->count * es + 1};
        for (int s = 0; s < 3; s++) {
            size_t bytes = nframes ? sizes[s] : 0;
            int want = shm ? m && m->shm && nframes == 0 && (!in_arena || (h->count && es))
                     : needs ? nframes == 1 && es && h->count && bytes == h->count * es
                             : nframes == 0;
            why[0] = 0;
            int rc = ps_proto_check_payload(h, nframes, bytes, why, sizeof why);
            if ((rc == 0) != want)
                return fuzz_fail(msg, len,
                                 "check_payload(%s%s%s, %d frames, %zu bytes) = %d, expected %s",
                                 ps_msg_type_name(h->type), reply ? " reply" : "",
                                 shm ? " in shared memory" : "", nframes, bytes, rc,
                                 want ? "ok" : "an error");
            if (rc && (rc != PS_EPROTO || !why[0]))
                return fuzz_fail(msg, len, "check_payload failed with %d and reason '%s'", rc,
                                 why);
        }
    }
    return NULL;
}

FUZZ_FN const char *fuzz_check_proto(const uint8_t *data, size_t size, char *msg, size_t len)
{
    ps_header h1, h2, h3;
    char why[256];
    const char *bad;
    memset(why, 0x55, sizeof why);
    why[sizeof why - 1] = 0;
    int rc = ps_proto_decode(data, size, &h1, why, sizeof why);
    int rc_quiet = ps_proto_decode(data, size, &h3, NULL, 0);
    if (rc != rc_quiet)
        return fuzz_fail(msg, len, "decode gave %d with a reason buffer, %d without", rc,
                         rc_quiet);
    if (rc) {
        if ((bad = fuzz_decode_ok_rc(rc, why, msg, len)))
            return bad;
    } else {
        if ((bad = fuzz_header_in_range(&h1, msg, len)))
            return bad;
        uint8_t e1[PS_HEADER_MAX], e2[PS_HEADER_MAX];
        size_t n1 = 0, n2 = 0;
        if ((rc = ps_proto_encode(&h1, e1, sizeof e1, &n1)))
            return fuzz_fail(msg, len, "re-encoding a decoded header failed: %d", rc);
        if ((rc = ps_proto_decode(e1, n1, &h2, why, sizeof why)))
            return fuzz_fail(msg, len, "decoding our own encoding failed: %d %s", rc, why);
        if ((bad = fuzz_same_header(&h1, &h2, msg, len)))
            return bad;
        if ((rc = ps_proto_encode(&h2, e2, sizeof e2, &n2)) || n1 != n2 || memcmp(e1, e2, n1))
            return fuzz_fail(msg, len, "encode(decode(encode(h))) differs from encode(h)");
        /* a too-small buffer is refused, never overrun */
        if (n1 > 1 && ps_proto_encode(&h1, e2, n1 - 1, &n2) != PS_ETOOBIG)
            return fuzz_fail(msg, len, "encode into %zu bytes of a %zu-byte header did not "
                             "fail with PS_ETOOBIG", n1 - 1, n1);
        if ((bad = fuzz_payload_oracle(&h1, 0, msg, len)))
            return bad;
    }
    /* header + payload split after the first msgpack value */
    size_t hl = fuzz_msgpack_len(data, size, 0, 0);
    if (hl > 0 && hl < size) {
        rc = ps_proto_decode(data, hl, &h1, why, sizeof why);
        if (rc)
            return fuzz_decode_ok_rc(rc, why, msg, len);
        if ((bad = fuzz_header_in_range(&h1, msg, len)))
            return bad;
        return fuzz_payload_oracle(&h1, size - hl, msg, len);
    }
    return NULL;
}

/* ---- idx ------------------------------------------------------------------ */

/* A file holding data: a memfd named by its /proc/self/fd path, or (where
 * memfd_create is missing) an unlinked-on-close temp file.  Returns the fd. */
FUZZ_FN int fuzz_file(const void *data, size_t size, char *path, size_t path_len)
{
    int fd = memfd_create("fuzz-idx", MFD_CLOEXEC);
    if (fd >= 0) {
        snprintf(path, path_len, "/proc/self/fd/%d", fd);
    } else {
        snprintf(path, path_len, "/tmp/ps_fuzz_idx.XXXXXX");
        if ((fd = mkstemp(path)) < 0)
            return -1;
    }
    const uint8_t *p = data;
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, p + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    return fd;
}

FUZZ_FN void fuzz_file_close(int fd, const char *path)
{
    if (strncmp(path, "/proc/", 6) != 0)
        unlink(path);
    close(fd);
}

FUZZ_FN uint32_t fuzz_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

FUZZ_FN void fuzz_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Load (images, labels) and check what comes back. */
FUZZ_FN const char *fuzz_load_pair(const uint8_t *img, size_t img_len, const uint8_t *lab,
                                  size_t lab_len, char *msg, size_t len)
{
    char ipath[64], lpath[64], why[512];
    const char *bad = NULL;
    int ifd = fuzz_file(img, img_len, ipath, sizeof ipath);
    int lfd = fuzz_file(lab, lab_len, lpath, sizeof lpath);
    if (ifd < 0 || lfd < 0) {
        if (ifd >= 0)
            fuzz_file_close(ifd, ipath);
        if (lfd >= 0)
            fuzz_file_close(lfd, lpath);
        return NULL; /* no scratch file: nothing to check */
    }
    ps_dataset *ds = (ps_dataset *)1;
    why[0] = 0;
    int rc = ps_dataset_load_idx(ipath, lpath, &ds, why, sizeof why);
    if (rc) {
        if (ds)
            bad = fuzz_fail(msg, len, "load failed (%d) but *out is not NULL", rc);
        else if ((rc != PS_EDATA && rc != PS_ENOMEM) || !why[0] || !memchr(why, 0, sizeof why))
            bad = fuzz_fail(msg, len, "load failed with %d and reason '%s'", rc, why);
    } else if (!ds) {
        bad = fuzz_fail(msg, len, "load succeeded without a dataset");
    } else {
        size_t ss = ps_dataset_sample_size(ds);
        if (ds->count == 0 || ds->channels != 1 || ds->height < 1 || ds->width < 1 ||
            ds->num_classes < 10 || ds->num_classes > 256 ||
            img_len < 16 + ds->count * ss || lab_len < 8 + ds->count)
            bad = fuzz_fail(msg, len, "loaded an impossible dataset: %zu x %dx%dx%d, %d classes",
                            ds->count, ds->channels, ds->height, ds->width, ds->num_classes);
        for (size_t i = 0; !bad && i < ds->count * ss; i++)
            if (!(ds->images[i] >= 0.0f && ds->images[i] <= 1.0f))
                bad = fuzz_fail(msg, len, "pixel %zu is %g, outside [0, 1]", i,
                                (double)ds->images[i]);
        for (size_t i = 0; !bad && i < ds->count; i++)
            if (ds->labels[i] < 0 || ds->labels[i] >= ds->num_classes)
                bad = fuzz_fail(msg, len, "label %zu is %d with %d classes", i,
                                (int)ds->labels[i], ds->num_classes);
        ps_dataset_free(ds);
    }
    fuzz_file_close(ifd, ipath);
    fuzz_file_close(lfd, lpath);
    return bad;
}

/* Largest made-up companion file (samples); beyond it a 1-sample file is used,
 * which the loader must refuse as a count mismatch. */
#define FUZZ_IDX_MAX_MADE 65536u

FUZZ_FN const char *fuzz_check_idx(const uint8_t *data, size_t size, char *msg, size_t len)
{
    uint32_t n = size >= 8 ? fuzz_be32(data + 4) : 1;
    if (n == 0 || n > FUZZ_IDX_MAX_MADE)
        n = 1;
    const char *bad;
    /* the input as the image file; labels 0..11 so some go past 10 classes */
    uint8_t *other = malloc(16 + (size_t)n);
    if (!other)
        return NULL;
    fuzz_put_be32(other, 0x00000801u);
    fuzz_put_be32(other + 4, n);
    for (uint32_t i = 0; i < n; i++)
        other[8 + i] = (uint8_t)(i % 12);
    bad = fuzz_load_pair(data, size, other, 8 + (size_t)n, msg, len);
    /* the input as the label file; images of 1x1 pixels */
    if (!bad) {
        fuzz_put_be32(other, 0x00000803u);
        fuzz_put_be32(other + 4, n);
        fuzz_put_be32(other + 8, 1);
        fuzz_put_be32(other + 12, 1);
        for (uint32_t i = 0; i < n; i++)
            other[16 + i] = (uint8_t)(i * 37);
        bad = fuzz_load_pair(other, 16 + (size_t)n, data, size, msg, len);
    }
    free(other);
    return bad;
}

/* ---- smap ----------------------------------------------------------------- */

FUZZ_FN const char *fuzz_check_smap(const uint8_t *data, size_t size, char *msg, size_t len)
{
    ps_smap m;
    char why[512];
    why[0] = '\0';
    int rc = ps_smap_decode(data, size, &m, why, sizeof why);
    if (rc == PS_ENOMEM)
        return NULL;
    if (rc)
        return rc == PS_EPROTO && why[0] && !m.slots && !m.over
                   ? NULL
                   : fuzz_fail(msg, len, "refused with rc %d, reason '%s', map not emptied", rc,
                               why);
    const char *bad = NULL;
    size_t n = ps_smap_encoded_bytes(&m);
    uint8_t *again = n == size ? malloc(n ? n : 1) : NULL;
    if (n != size)
        bad = fuzz_fail(msg, len, "accepted %zu bytes that encode back to %zu", size, n);
    else if (again) {
        ps_smap_encode(&m, again);
        if (memcmp(again, data, n))
            bad = fuzz_fail(msg, len, "accepted bytes that encode back differently");
    }
    free(again);
    int live = 0;
    for (int s = 0; !bad && s < m.nslots; s++)
        live += m.slots[s].state == PS_SMAP_LIVE;
    if (!bad && (live != m.nlive || live < 1))
        bad = fuzz_fail(msg, len, "%d live slots counted, the map says %d", live, m.nlive);
    for (size_t i = 0; !bad && i < m.nover; i++) {
        const ps_smap_override *o = &m.over[i];
        /* the home passed is not the owner, so only the override can answer */
        int home = o->owner == 0 ? 1 : 0;
        if (ps_smap_owner(&m, &o->id, home) != o->owner || o->owner < 0 ||
            o->owner >= m.nslots || m.slots[o->owner].state != PS_SMAP_LIVE)
            bad = fuzz_fail(msg, len, "override %zu: lookup %d, owner %d", i,
                            ps_smap_owner(&m, &o->id, home), o->owner);
    }
    char line[1024];
    ps_smap_describe(&m, line, sizeof line);
    ps_smap_free(&m);
    return bad;
}

#endif
