/* ps_servers: add a server to a running job, remove one, or print the map
 * of which server holds what (docs/OPERATIONS.md "Servers added and
 * removed").  It sends one SERVERS request to the job's server 0, which
 * coordinates the move (server/move.h), and prints its answer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ps_endpoint.h"
#include "ps_error.h"
#include "ps_proto.h"
#include "ps_smap.h"

#define P "ps_servers"

static const char usage[] =
    "usage: ps_servers [--servers LIST] [--admin-token-file FILE] [--timeout S] COMMAND\n"
    "\n"
    "Change the servers of a running job; server 0 (the first of LIST) moves the\n"
    "objects (dense chunks, table partitions) while training goes on.\n"
    "\n"
    "commands:\n"
    "  add ENDPOINT   a server started with the job's settings and --added --rank N\n"
    "                 (N: the job's next slot, `ps_servers map` says it) takes its\n"
    "                 share (about 1/(S+1) of the state) from the others\n"
    "  remove SLOT    the server of that slot moves everything it holds to the others,\n"
    "                 then leaves the job (it exits once no worker asks it anything)\n"
    "  map            which slots the job has and what moved (one line per slot)\n"
    "\n"
    "flags:\n"
    "  --servers LIST          the job's servers as its workers have them\n"
    "                          (tcp://HOST:PORT,...; default: $PS_SERVERS)\n"
    "  --admin-token-file FILE the token server 0 was started with (--admin-token-file);\n"
    "                          without one the request is refused (docs/SECURITY.md)\n"
    "  --timeout S             wait this long for the answer (default 600)\n"
    "\n"
    "Exit status: 0 done; 1 the server refused or did not answer (it says why); 2 bad\n"
    "usage.\n";

static int read_token(const char *path, char *out, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, P ": cannot read --admin-token-file %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!fgets(out, (int)len, f))
        out[0] = 0;
    fclose(f);
    size_t n = strlen(out);
    while (n && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' ' ||
                 out[n - 1] == '\t'))
        out[--n] = 0;
    if (!n) {
        fprintf(stderr, P ": --admin-token-file %s is empty\n", path);
        return -1;
    }
    return 0;
}

static void print_map(const unsigned char *p, size_t len)
{
    ps_smap m;
    char why[256];
    if (ps_smap_decode(p, len, &m, why, sizeof why) != 0) {
        fprintf(stderr, P ": the map server 0 sent does not read: %s\n", why);
        return;
    }
    printf("epoch %llu, %d slots (%d live), %zu objects away from home\n",
           (unsigned long long)m.epoch, m.nslots, m.nlive, m.nover);
    for (int i = 0; i < m.nslots; i++) {
        size_t held = ps_smap_held(&m, i, NULL, 0);
        printf("slot %d  %-8s %s  %zu objects moved in\n", i,
               m.slots[i].state == PS_SMAP_LIVE ? "live" : "removed", m.slots[i].endpoint, held);
    }
    printf("next slot: %d\n", m.nslots);
    ps_smap_free(&m);
}

int main(int argc, char **argv)
{
    const char *servers = getenv("PS_SERVERS"), *token_file = NULL;
    long timeout_s = 600;
    int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, P ": %s needs a value\n%s", a, usage);
            return 2;
        }
        if (!strcmp(a, "--servers"))
            servers = v;
        else if (!strcmp(a, "--admin-token-file"))
            token_file = v;
        else if (!strcmp(a, "--timeout")) {
            char *end;
            timeout_s = strtol(v, &end, 10);
            if (*end || timeout_s < 1 || timeout_s > 86400) {
                fprintf(stderr, P ": --timeout must be 1..86400 seconds, got '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, P ": unknown flag %s\n%s", a, usage);
            return 2;
        }
        i++;
    }
    if (!servers || !*servers) {
        fprintf(stderr, P ": no --servers (nor $PS_SERVERS): give the job's server list\n");
        return 2;
    }
    if (i >= argc) {
        fprintf(stderr, P ": no command\n%s", usage);
        return 2;
    }
    const char *cmd = argv[i];
    ps_header h;
    ps_header_init(&h, PS_MSG_SERVERS);
    h.seq = 1;
    char why[256], zep[PS_ENDPOINT_MAX];
    if (!strcmp(cmd, "add") && i + 1 < argc) {
        h.chunk = 1;
        if (ps_endpoint_check(argv[i + 1], 0, zep, sizeof zep, why, sizeof why)) {
            fprintf(stderr, P ": add: %s\n", why);
            return 2;
        }
        snprintf(h.owner_ep, sizeof h.owner_ep, "%s", argv[i + 1]);
    } else if (!strcmp(cmd, "remove") && i + 1 < argc) {
        char *end;
        long slot = strtol(argv[i + 1], &end, 10);
        if (*end || slot < 1 || slot >= PS_SMAP_MAX_SLOTS) {
            fprintf(stderr, P ": remove: SLOT must be 1..%d (server 0 coordinates and "
                    "stays), got '%s'\n", PS_SMAP_MAX_SLOTS - 1, argv[i + 1]);
            return 2;
        }
        h.chunk = 2;
        h.slot = (int32_t)slot;
    } else if (!strcmp(cmd, "map")) {
        h.chunk = 3;
    } else {
        fprintf(stderr, P ": unknown command '%s' (or its argument is missing)\n%s", cmd,
                usage);
        return 2;
    }
    if (token_file && read_token(token_file, h.admin, sizeof h.admin))
        return 2;
    /* server 0: the first of the list */
    char first[PS_ENDPOINT_MAX];
    size_t fl = strcspn(servers, ",");
    if (fl >= sizeof first) {
        fprintf(stderr, P ": the first server endpoint is too long\n");
        return 2;
    }
    memcpy(first, servers, fl);
    first[fl] = 0;
    if (ps_endpoint_check(first, 0, zep, sizeof zep, why, sizeof why)) {
        fprintf(stderr, P ": --servers: %s\n", why);
        return 2;
    }
    void *ctx = zmq_ctx_new(), *d = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
    int linger = 0, tmo = (int)(timeout_s * 1000);
    if (!d || zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo) || zmq_connect(d, zep)) {
        fprintf(stderr, P ": cannot connect to %s: %s\n", first, zmq_strerror(errno));
        return 1;
    }
    char buf[PS_HEADER_MAX];
    size_t len;
    h.count = strlen(servers);
    if (ps_proto_encode(&h, buf, sizeof buf, &len) || zmq_send(d, buf, len, ZMQ_SNDMORE) < 0 ||
        zmq_send(d, servers, strlen(servers), 0) < 0) {
        fprintf(stderr, P ": cannot send the request to %s\n", first);
        return 1;
    }
    int rc = 1;
    zmq_msg_t f[2];
    zmq_msg_init(&f[0]);
    zmq_msg_init(&f[1]);
    if (zmq_msg_recv(&f[0], d, 0) < 0) {
        fprintf(stderr, P ": no answer from %s in %ld s\n", first, timeout_s);
    } else {
        int more = zmq_msg_more(&f[0]);
        if (more)
            zmq_msg_recv(&f[1], d, 0);
        ps_header r;
        if (ps_proto_decode(zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), &r, why, sizeof why)) {
            fprintf(stderr, P ": the answer does not read: %s\n", why);
        } else if (r.type == PS_MSG_ERROR) {
            fprintf(stderr, P ": %s refused: %s: %s\n", cmd, ps_strerror(r.err_code), r.err_text);
        } else if (h.chunk == 3) {
            print_map(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]));
            rc = 0;
        } else {
            printf("%.*s\n", (int)zmq_msg_size(&f[1]), (const char *)zmq_msg_data(&f[1]));
            rc = 0;
        }
    }
    zmq_msg_close(&f[0]);
    zmq_msg_close(&f[1]);
    zmq_close(d);
    zmq_ctx_term(ctx);
    return rc;
}
