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
#include "ps_settings.h"

#define P "ps_keygen"

static const char usage_head[] =
    "usage: ps_keygen --dir DIR --servers S --workers W [--force]\n"
    "\n"
    "Makes CURVE key pairs (Z85 text, one key per file) for S servers and W workers:\n"
    "  DIR/server-i.key, DIR/worker-j.key   secret keys (mode 0600)\n"
    "  DIR/server-i.pub, DIR/worker-j.pub   public keys\n"
    "  DIR/authorized/worker-j.pub          the worker keys the servers accept;\n"
    "                                       delete one to revoke that worker\n"
    "Then start every ps_server and ps_worker with --curve-keys DIR (ps_launch passes\n"
    "it through).  See docs/SECURITY.md.\n"
    "\n"
    "flags (--flag VALUE or --flag=VALUE):\n";

static const char usage_tail[] =
    "\n"
    "Exit status: 0 done; 1 keys exist (without --force) or a file could not be\n"
    "written; 2 bad flags.\n"
    "\n"
    "example:\n"
    "  ps_keygen --dir keys --servers 2 --workers 4\n";

/* ps_keygen's settings (the KEYGEN rows of common/ps_settings.h). */
typedef struct ps_keygen_opts {
    const char *dir;
    int servers, workers;
    int force;
} ps_keygen_opts;

static const ps_setting_field fields[] = {PS_SETTING_FIELDS(KEYGEN)};

int main(int argc, char **argv)
{
    ps_keygen_opts o = {0};
    char why[1024];
    ps_settings_cmd cmd = {.prog = P, .program = PS_PROG_KEYGEN, .cfg = &o, .fields = fields,
                           .nfields = (int)(sizeof fields / sizeof fields[0])};
    ps_settings_defaults(PS_PROG_KEYGEN, fields, cmd.nfields, &o);
    if (ps_settings_parse(&cmd, argc, argv, why, sizeof why))
        return ps_flag_error(why);
    if (cmd.help) {
        ps_settings_print_help(P, PS_PROG_KEYGEN, cmd.help, usage_head, usage_tail);
        return 0;
    }
    if (!o.dir)
        return ps_flag_error(P ": --dir is required (see --help)");
    if (!o.servers)
        return ps_flag_error(P ": --servers is required (see --help)");
    if (!o.workers)
        return ps_flag_error(P ": --workers is required (see --help)");
    int rc = ps_curve_keygen(o.dir, o.servers, o.workers, o.force, why, sizeof why);
    if (rc) {
        fprintf(stderr, P ": %s\n", why);
        return 1;
    }
    struct stat st;
    if (stat(o.dir, &st) == 0 && (st.st_mode & 077))
        fprintf(stderr,
                P ": note: %s is accessible to other users (mode %03o); the secret keys in it "
                "are 0600, but chmod 700 %s keeps even their names private\n",
                o.dir, (unsigned)(st.st_mode & 0777), o.dir);
    printf(P ": wrote %d server and %d worker key pairs to %s (authorized: %s/authorized)\n",
           o.servers, o.workers, o.dir, o.dir);
    return 0;
}
