#include "admin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ps_error.h"

#define TOKEN_MIN 16

struct ps_admin {
    int curve;
    int have_token;
    /* zero-padded to the full length, so the comparison never depends on
     * where the token ends */
    char token[PS_ADMIN_TOKEN_MAX + 1];
    char describe[1200];
};

/* Read the token: the file's first line, trailing whitespace cut. */
static int read_token(const char *path, char *out, char *why, size_t why_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        ps_errorf(why, why_len, "--admin-token-file %s: cannot open it: %s", path,
            strerror(errno));
        return PS_EINVAL;
    }
    struct stat st;
    char buf[4096];
    ssize_t n = -1;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ps_errorf(why, why_len, "--admin-token-file %s: not a regular file", path);
        rc = PS_EINVAL;
    } else if (st.st_mode & 077) {
        ps_errorf(why, why_len, "--admin-token-file %s: group or others may read or write it "
            "(mode %04o): a token others can read stops nobody; chmod 600 %s",
            path, (unsigned)(st.st_mode & 07777), path);
        rc = PS_EINVAL;
    } else if ((n = read(fd, buf, sizeof buf - 1)) < 0) {
        ps_errorf(why, why_len, "--admin-token-file %s: cannot read it: %s", path,
            strerror(errno));
        rc = PS_EINVAL;
    }
    close(fd);
    if (rc)
        return rc;
    buf[n] = 0;
    size_t len = strcspn(buf, "\n");
    while (len && (buf[len - 1] == ' ' || buf[len - 1] == '\t' || buf[len - 1] == '\r'))
        len--;
    int printable = 1;
    for (size_t i = 0; i < len; i++)
        printable &= buf[i] > 0x20 && buf[i] < 0x7f;
    if (len < TOKEN_MIN || len > PS_ADMIN_TOKEN_MAX || !printable)
        ps_errorf(why, why_len, "--admin-token-file %s: the first line must be %d to %d "
            "printable characters without spaces, e.g. from `openssl rand -hex 32`", path,
            TOKEN_MIN, PS_ADMIN_TOKEN_MAX);
    else
        memcpy(out, buf, len);
    explicit_bzero(buf, sizeof buf);
    return len < TOKEN_MIN || len > PS_ADMIN_TOKEN_MAX || !printable ? PS_EINVAL : 0;
}

int ps_admin_open(const char *token_file, int curve, ps_admin **out, char *why, size_t why_len)
{
    *out = NULL;
    ps_admin *a = calloc(1, sizeof *a);
    if (!a) {
        ps_errorf(why, why_len, "out of memory");
        return PS_ENOMEM;
    }
    a->curve = curve;
    if (token_file) {
        int rc = read_token(token_file, a->token, why, why_len);
        if (rc) {
            ps_admin_close(a);
            return rc;
        }
        a->have_token = 1;
    }
    if (a->have_token && curve)
        snprintf(a->describe, sizeof a->describe, "signals, or a shutdown message carrying "
                 "the token of %s or sent with a CURVE key of the key directory's admin/",
                 token_file);
    else if (a->have_token)
        snprintf(a->describe, sizeof a->describe,
                 "signals, or a shutdown message carrying the token of %s", token_file);
    else if (curve)
        snprintf(a->describe, sizeof a->describe, "signals, or a shutdown message sent with a "
                 "CURVE key of the key directory's admin/");
    else
        snprintf(a->describe, sizeof a->describe, "signals only (no --admin-token-file)");
    *out = a;
    return 0;
}

void ps_admin_close(ps_admin *a)
{
    if (!a)
        return;
    explicit_bzero(a->token, sizeof a->token);
    free(a);
}

/* Equal over the whole buffers, in a time that does not depend on where
 * they differ. */
static int same_token(const char *a, const char *b)
{
    unsigned char d = 0;
    for (size_t i = 0; i < PS_ADMIN_TOKEN_MAX + 1; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

int ps_admin_check(const ps_admin *a, const ps_header *h, const char *user_id, char *why,
                   size_t why_len)
{
    if (a->curve && user_id && strncmp(user_id, "admin/", 6) == 0)
        return 0;
    char given[PS_ADMIN_TOKEN_MAX + 1];
    memset(given, 0, sizeof given);
    memcpy(given, h->admin, strnlen(h->admin, PS_ADMIN_TOKEN_MAX));
    int ok = a->have_token && given[0] && same_token(given, a->token);
    explicit_bzero(given, sizeof given);
    if (ok)
        return 0;
    /* SHUTDOWN, SERVERS: the request's name in what is said */
    const char *what = h->type == PS_MSG_SHUTDOWN ? "shutdown" : ps_msg_type_name(h->type);
    if (!a->have_token && !a->curve)
        ps_errorf(why, why_len, "%s refused: this server takes no admin request (SIGTERM/SIGINT "
            "stop it; start it with --admin-token-file to allow a %s message)", what, what);
    else if (!a->have_token)
        ps_errorf(why, why_len, "%s refused: only a CURVE key of the key directory's admin/ may "
            "send it", what);
    else if (!h->admin[0])
        ps_errorf(why, why_len, "%s refused: no admin token in the request (give the token of "
            "the server's --admin-token-file)", what);
    else
        ps_errorf(why, why_len, "%s refused: wrong admin token", what);
    return PS_EAUTH;
}

const char *ps_admin_describe(const ps_admin *a) { return a->describe; }
