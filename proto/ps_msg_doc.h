/* The message table (proto/ps_msg_table.h) as docs/PROTOCOL.md lists it, in
 * "Message types" between two marker lines.  `make protocol-doc` writes that
 * section (proto/ps_msg_doc_main.c); tests/test_msg_table.c fails while the
 * document and the table differ.  No I/O here. */
#ifndef PS_MSG_DOC_H
#define PS_MSG_DOC_H

#include <stddef.h>

#include "ps_strbuf.h"

#define PS_MSG_DOC_BEGIN                                                                    \
    "<!-- the message table: `make protocol-doc` writes it from proto/ps_msg_table.h; "     \
    "edit the table, not these lines -->"
#define PS_MSG_DOC_END "<!-- end of the message table -->"

/* The section's lines (a markdown table, one row per type, each line ending
 * in a newline), appended to out.  0 or PS_ENOMEM. */
int ps_msg_doc_table(ps_strbuf *out);

/* doc (a whole docs/PROTOCOL.md) with the lines between its two marker
 * lines replaced by ps_msg_doc_table's, appended to out.  PS_EINVAL when a
 * marker line is missing or out of order (why says which), PS_ENOMEM. */
int ps_msg_doc_splice(const char *doc, ps_strbuf *out, char *why, size_t why_len);

#endif
