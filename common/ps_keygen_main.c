/* ps_keygen: make the CURVE key directory that ps_server and ps_worker read
 * with --curve-keys DIR.  The work is ps_curve_keygen (common/ps_curve.c);
 * this file is flags and messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ps_curve.h"
#include "ps_error.h"
#include "ps_flags.h"

#define P "ps_keygen"

static const char usage[] =
    "usage: ps_keygen --dir DIR --servers S --workers W [--force]\n"
    "\n"
    "Makes CURVE key pairs (Z85 text, one key per file) for S servers and W workers:\n"
    "  DIR/server-i.key, DIR/worker-j.key   secret keys (mode 0600)\n"
    "  DIR/server-i.pub, DIR/worker-j.pub   public keys\n"
    "  DIR/authorized/worker-j.pub          the worker keys the servers accept;\n"
    "                                       delete one to revoke that worker\n"
    "DIR is created with mode 0700.  Then start every ps_server and ps_worker with\n"
    "--curve-keys DIR (ps_launch passes it through).  See docs/SECURITY.md.\n"
    "\n"
    "flags:\n"
    "  --dir DIR       key directory (created)             e.g. --dir keys\n"
    "  --servers S     server key pairs, 1..65536          e.g. --servers 2\n"
    "  --workers W     worker key pairs, 1..65536          e.g. --workers 4\n"
    "  --force         replace the keys already in DIR (all of them: keys of the\n"
    "                  earlier set, authorized/*.pub included, are removed)\n"
    "  --help, --version\n"
    "\n"
    "Exit status: 0 done; 1 keys exist (without --force) or a file could not be\n"
    "written; 2 bad flags.\n"
    "\n"
    "example:\n"
    "  ps_keygen --dir keys --servers 2 --workers 4\n";

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long long servers = 0, workers = 0;
    int force = 0;
    char why[1024];

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (ps_flag_help_version(P, usage, a))
            return 0;
        if (!strcmp(a, "--force")) {
            force = 1;
            continue;
        }
        static const char *const valued[] = {"--dir", "--servers", "--workers", NULL};
        const char *val, *name = ps_flag_value(argc, argv, &i, valued, &val);
        if (!name) {
            snprintf(why, sizeof why, P ": unknown %s '%s' (see --help)",
                     a[0] == '-' ? "flag" : "argument", a);
            return ps_flag_error(why);
        }
        if (!val) {
            snprintf(why, sizeof why, P ": %s needs a value (see --help)", name);
            return ps_flag_error(why);
        }
        if (!strcmp(name, "--dir")) {
            if (!*val)
                return ps_flag_error(P ": --dir needs a non-empty path");
            dir = val;
        } else if (ps_parse_int(P, name, val, 1, PS_CURVE_MAX_KEYS,
                                !strcmp(name, "--servers") ? &servers : &workers, why,
                                sizeof why)) {
            return ps_flag_error(why);
        }
    }
    if (!dir)
        return ps_flag_error(P ": --dir is required (see --help)");
    if (!servers)
        return ps_flag_error(P ": --servers is required (see --help)");
    if (!workers)
        return ps_flag_error(P ": --workers is required (see --help)");

    int rc = ps_curve_keygen(dir, (int)servers, (int)workers, force, why, sizeof why);
    if (rc) {
        fprintf(stderr, P ": %s\n", why);
        return 1;
    }
    struct stat st;
    if (stat(dir, &st) == 0 && (st.st_mode & 077))
        fprintf(stderr,
                P ": note: %s is accessible to other users (mode %03o); the secret keys in it "
                "are 0600, but chmod 700 %s keeps even their names private\n",
                dir, (unsigned)(st.st_mode & 0777), dir);
    printf(P ": wrote %lld server and %lld worker key pairs to %s (authorized: %s/authorized)\n",
           servers, workers, dir, dir);
    return 0;
}
