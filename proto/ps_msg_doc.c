#include "ps_msg_doc.h"

#include <string.h>

#include "ps_error.h"
#include "ps_proto.h"

static const char *from_doc(int from)
{
    switch (from) {
    case PS_FROM_ANY: return "any rank, before hello too";
    case PS_FROM_LIVE: return "a worker after hello, or rank -1";
    case PS_FROM_WORKER: return "a worker after hello";
    case PS_FROM_ADMIN: return "a worker after hello, or rank -1, with authority (SECURITY.md)";
    case PS_FROM_PEER: return "a server of the shard group (rank -1)";
    case PS_FROM_SERVER: return "a server of the job (rank -1)";
    default: return "nobody: a reply only";
    }
}

/* "`k`, `c`, `s` (the step of the gradient)", or "-" */
static void keys_doc(ps_strbuf *out, uint32_t keys, int s_meaning)
{
    static const char *const names[] = {
#define KEY_NAME_(name, key) key,
        PS_HDR_KEYS(KEY_NAME_)
#undef KEY_NAME_
    };
    int n = 0;
    for (int k = 0; k < PS_HK_COUNT; k++) {
        if (!(keys & (1u << k)))
            continue;
        ps_strbuf_addf(out, "%s`%s`", n++ ? ", " : "", names[k]);
        if (k == PS_HK_S)
            ps_strbuf_addf(out, " (%s)", ps_s_meaning_doc(s_meaning));
    }
    if (!n)
        ps_strbuf_add(out, "-");
}

/* A table's frames, in words: "ids, rows" */
static const char *frames_doc(int layout)
{
    switch (layout) {
    case PS_PL_IDS: return "ids";
    case PS_PL_ROWS: return "rows";
    case PS_PL_IDS_ROWS: return "ids, rows";
    case PS_PL_IDS_ROWS_IDS: return "ids, rows, ids";
    case PS_PL_LOOKUP: return "tables, ids";
    case PS_PL_BYTES: return "bytes";
    default: return "values";
    }
}

/* The payload column: which of request and reply carry frames, and for a
 * table's messages what they are. */
static void payload_doc(ps_strbuf *out, const ps_msg_info *m)
{
    int rq = m->req_payload, rp = m->rep_payload;
    if (rq > PS_PL_VALUES || rp > PS_PL_VALUES) { /* "values" where one is VALUES */
        if (rq)
            ps_strbuf_addf(out, "request: %s", frames_doc(rq));
        if (rp)
            ps_strbuf_addf(out, "%sreply: %s", rq ? "; " : "", frames_doc(rp));
        return;
    }
    ps_strbuf_add(out, rq && rp ? "request and reply" : rq ? "request" : rp ? "reply" : "-");
}

int ps_msg_doc_table(ps_strbuf *out)
{
    ps_strbuf_add(out, "| t | name | sent by | request | request needs | reply | reply needs | "
                       "payload | shared memory |\n"
                       "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (uint32_t t = 1; t <= PS_MSG_TYPE_MAX; t++) {
        const ps_msg_info *m = ps_msg_info_of(t);
        if (!m)
            continue;
        ps_strbuf_addf(out, "| %u | %s | %s | %s | ", m->type, m->name, from_doc(m->from),
                       m->req_doc);
        keys_doc(out, m->from == PS_FROM_NOBODY ? 0 : m->req_keys, m->s_req);
        ps_strbuf_addf(out, " | %s | ", m->rep_doc);
        keys_doc(out, m->rep_keys, m->s_rep);
        ps_strbuf_add(out, " | ");
        payload_doc(out, m);
        ps_strbuf_addf(out, " | %s |\n", m->shm ? "yes" : "-");
    }
    return out->failed ? PS_ENOMEM : 0;
}

/* The line of doc that is exactly `line`, from `from` on; NULL: none. */
static const char *find_line(const char *from, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = from; (p = strstr(p, line)) != NULL; p += n)
        if ((p == from || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0))
            return p;
    return NULL;
}

int ps_msg_doc_splice(const char *doc, ps_strbuf *out, char *why, size_t why_len)
{
    const char *begin = find_line(doc, PS_MSG_DOC_BEGIN);
    const char *end = begin ? find_line(begin, PS_MSG_DOC_END) : NULL;
    if (!begin || !end) {
        ps_errorf(why, why_len, "no line \"%s\"%s", begin ? PS_MSG_DOC_END : PS_MSG_DOC_BEGIN,
            begin ? " after the table's first line" : "");
        return PS_EINVAL;
    }
    const char *body = begin + strlen(PS_MSG_DOC_BEGIN) + 1;
    ps_strbuf_addn(out, doc, (size_t)(body - doc));
    ps_msg_doc_table(out);
    ps_strbuf_add(out, end);
    return out->failed ? PS_ENOMEM : 0;
}
