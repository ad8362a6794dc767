/* ps_msg_doc FILE: write the message table (proto/ps_msg_table.h) into the
 * section of FILE (docs/PROTOCOL.md) between its marker lines.  Run by
 * `make protocol-doc`; not installed.  Exit status: 0 written or already
 * equal; 1 FILE cannot be read or written, or has no such section; 2 usage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_msg_doc.h"

#define P "ps_msg_doc"

/* FILE's bytes, NUL-terminated; NULL with errno set. */
static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    ps_strbuf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        ps_strbuf_addn(&b, chunk, n);
    int bad = ferror(f) || b.failed;
    fclose(f);
    if (bad) {
        ps_strbuf_free(&b);
        errno = errno ? errno : ENOMEM;
        return NULL;
    }
    return ps_strbuf_take(&b);
}

/* path.tmp written and renamed over path: a crash leaves the old file or the new. */
static int write_all(const char *path, const char *s, size_t n)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return -1;
    int bad = fwrite(s, 1, n, f) != n;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: " P " FILE   (FILE: docs/PROTOCOL.md)\n");
        return 2;
    }
    const char *path = argv[1];
    char *doc = read_all(path);
    if (!doc) {
        fprintf(stderr, P ": cannot read %s: %s\n", path, strerror(errno));
        return 1;
    }
    ps_strbuf out = {0};
    char why[256];
    int rc = ps_msg_doc_splice(doc, &out, why, sizeof why);
    if (rc) {
        fprintf(stderr, P ": %s: %s\n", path, rc == PS_EINVAL ? why : ps_strerror(rc));
        free(doc);
        ps_strbuf_free(&out);
        return 1;
    }
    int same = strcmp(doc, ps_strbuf_str(&out)) == 0;
    free(doc);
    if (!same && write_all(path, out.p, out.n) != 0) {
        fprintf(stderr, P ": cannot write %s: %s\n", path, strerror(errno));
        ps_strbuf_free(&out);
        return 1;
    }
    ps_strbuf_free(&out);
    printf("%s: the message table %s\n", path, same ? "was up to date" : "written");
    return 0;
}
