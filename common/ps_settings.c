/* The run-settings table's functions: values, defaults, the command-line
 * parser every program shares, --help and the README sections
 * (common/ps_settings.h). */
#include "ps_settings.h"

#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_flags.h"

#ifndef PS_VERSION
#define PS_VERSION "unknown"
#endif

static const ps_setting rows[PS_SET_N] = {
#define ROW_(id, progs, flag, arg, env, type, field, def, choices, lo, hi, hello, props, help) \
    {flag, arg, env, PS_SETTING_##type, PS_SET_PROGS progs, props, def, choices, lo, hi,       \
     PS_SET_HELLO_KEY_##hello, help},
    PS_SETTINGS(ROW_)
#undef ROW_
};

const ps_setting *ps_setting_at(int id)
{
    return id >= 0 && id < PS_SET_N ? &rows[id] : NULL;
}

const char *ps_setting_name(const ps_setting *r)
{
    return strncmp(r->flag, "--", 2) == 0 ? r->flag + 2 : r->flag;
}

/* A row with a flag that a user gives (not a heading or a block). */
static int has_flag(const ps_setting *r)
{
    return r->flag[0] == '-';
}

/* Is `flag` (up to '=' or its end) the row's flag? */
static int flag_is(const ps_setting *r, const char *flag)
{
    size_t n = strcspn(flag, "=");
    return has_flag(r) && strlen(r->flag) == n && strncmp(r->flag, flag, n) == 0;
}

int ps_setting_find(unsigned prog, const char *flag)
{
    for (int i = 0; i < PS_SET_N; i++)
        if ((rows[i].progs & prog) && flag_is(&rows[i], flag))
            return i;
    return -1;
}

/* The next "name=value" of an ENUM's choices after *p: its name (n bytes)
 * and value; 0 at the end. */
static int next_choice(const char **p, const char **name, size_t *n, long long *v)
{
    const char *s = *p + strspn(*p, " ");
    if (!*s)
        return 0;
    size_t w = strcspn(s, " ");
    const char *eq = memchr(s, '=', w);
    *name = s;
    *n = eq ? (size_t)(eq - s) : w;
    *v = eq ? strtoll(eq + 1, NULL, 10) : 0;
    *p = s + w;
    return 1;
}

const char *ps_setting_choice_name(const ps_setting *r, long long v)
{
    /* static: one buffer per row is enough for a name of a few letters */
    static _Thread_local char names[PS_SET_N][16];
    const char *p = r->choices, *name;
    size_t n;
    long long cv;
    while (p && next_choice(&p, &name, &n, &cv))
        if (cv == v && n < sizeof names[0]) {
            char *out = names[r - rows];
            memcpy(out, name, n);
            out[n] = 0;
            return out;
        }
    return NULL;
}

void ps_setting_range(const ps_setting *r, long long *lo, long long *hi)
{
    *lo = r->lo;
    *hi = r->hi;
    if (r->type != PS_SETTING_ENUM)
        return;
    const char *p = r->choices, *name;
    size_t n;
    long long v;
    for (int first = 1; next_choice(&p, &name, &n, &v); first = 0) {
        *lo = first || v < *lo ? v : *lo;
        *hi = first || v > *hi ? v : *hi;
    }
}

long long ps_setting_default(const ps_setting *r)
{
    char why[256];
    long long v = 0;
    if (r->def && ps_setting_parse_value("default", r->flag, r, r->def, &v, why, sizeof why))
        v = 0;
    return v;
}

/* "sync|async" -> "sync or async", "f32|bf16|f16" -> "f32, bf16 or f16". */
static void choice_list(const char *arg, char *out, size_t len)
{
    size_t o = 0;
    int total = 1, k = 0;
    for (const char *p = arg; *p; p++)
        total += *p == '|';
    for (const char *p = arg; *p && o + 1 < len; k++) {
        size_t n = strcspn(p, "|");
        const char *sep = k == 0 ? "" : k == total - 1 ? " or " : ", ";
        o += (size_t)snprintf(out + o, len - o, "%s%.*s", sep, (int)n, p);
        p += n + (p[n] == '|');
    }
}

int ps_setting_parse_value(const char *prog, const char *what, const ps_setting *r,
                           const char *text, long long *v, char *why, size_t len)
{
    switch (r->type) {
    case PS_SETTING_INT:
        return ps_parse_int(prog, what, text, r->lo, r->hi, v, why, len);
    case PS_SETTING_SIZE: {
        uint64_t u = 0;
        int rc = ps_parse_size(prog, what, text, (uint64_t)r->lo, (uint64_t)r->hi, &u, why, len);
        *v = (long long)u;
        return rc;
    }
    case PS_SETTING_SECS: {
        double s = 0;
        if (ps_parse_float(prog, what, text, (double)r->lo, (double)r->hi, &s, why, len))
            return PS_EINVAL;
        *v = (long long)(s * 1000.0 + 0.5);
        if (s > 0 && *v == 0) /* a positive time stays on */
            *v = 1;
        return 0;
    }
    case PS_SETTING_ENUM: {
        const char *p = r->choices, *name;
        size_t n;
        long long cv;
        while (text && next_choice(&p, &name, &n, &cv))
            if (strlen(text) == n && strncmp(text, name, n) == 0) {
                *v = cv;
                return 0;
            }
        char list[128];
        choice_list(r->arg, list, sizeof list);
        ps_errorf(why, len, "%s: %s must be %s, got '%s'", prog, what, list, text ? text : "");
        return PS_EINVAL;
    }
    case PS_SETTING_STR: {
        size_t n = text ? strlen(text) : 0;
        if (!text || n < (size_t)r->lo || n > (size_t)r->hi) {
            ps_errorf(why, len, "%s: %s needs a value of %lld..%lld characters, got '%.64s%s'",
                prog, what, r->lo, r->hi, text ? text : "", n > 64 ? "..." : "");
            return PS_EINVAL;
        }
        *v = 1;
        return 0;
    }
    default:
        ps_errorf(why, len, "%s: %s is not a value setting", prog, what);
        return PS_EINVAL;
    }
}

/* ------------------------------------------------------------ fields */

void ps_setting_field_set(const ps_setting_field *f, void *cfg, long long v)
{
    char *p = (char *)cfg + f->off;
    if (f->size == sizeof(int32_t)) {
        int32_t x = (int32_t)v;
        memcpy(p, &x, sizeof x);
    } else if (f->size == sizeof(int64_t)) {
        int64_t x = v;
        memcpy(p, &x, sizeof x);
    }
}

static void field_set_str(const ps_setting_field *f, void *cfg, const char *s)
{
    if (f->size == sizeof s)
        memcpy((char *)cfg + f->off, &s, sizeof s);
}

long long ps_setting_field_get(const ps_setting_field *f, const void *cfg)
{
    const char *p = (const char *)cfg + f->off;
    if (rows[f->id].type == PS_SETTING_STR) {
        const char *s;
        memcpy(&s, p, sizeof s);
        return s != NULL;
    }
    if (f->size == sizeof(int32_t)) {
        int32_t x;
        memcpy(&x, p, sizeof x);
        return x;
    }
    int64_t x = 0;
    if (f->size == sizeof x)
        memcpy(&x, p, sizeof x);
    return x;
}

static const ps_setting_field *field_of(const ps_setting_field *fields, int n, int id)
{
    for (int i = 0; i < n; i++)
        if (fields[i].id == id)
            return &fields[i];
    return NULL;
}

/* Put the value text (checked) of row id into its field. */
static void store(const ps_setting_field *f, void *cfg, const char *text, long long v)
{
    const ps_setting *r = &rows[f->id];
    if (r->type == PS_SETTING_STR)
        field_set_str(f, cfg, text);
    else
        ps_setting_field_set(f, cfg, r->type == PS_SETTING_BOOL ? 1 : v);
}

void ps_settings_defaults(unsigned prog, const ps_setting_field *fields, int n, void *cfg)
{
    char why[256];
    for (int i = 0; i < n; i++) {
        const ps_setting *r = &rows[fields[i].id];
        long long v = 0;
        if (!(r->progs & prog) || !r->def)
            continue;
        /* a default the row refuses is a bug the table's tests catch */
        if (r->type == PS_SETTING_BOOL ||
            ps_setting_parse_value("default", r->flag, r, r->def, &v, why, sizeof why) == 0)
            store(&fields[i], cfg, r->def, v);
    }
}

/* ------------------------------------------------------------ parsing */

/* Does prog's command line take row r (with cmd->shared, as text)? */
static int takes(const ps_settings_cmd *c, const ps_setting *r)
{
    return has_flag(r) && ((r->progs & c->program) || (c->shared && (r->props & PS_SET_SHARED)));
}

int ps_settings_opt_index(const char *flag)
{
    size_t n = strcspn(flag, "=");
    const char *const *f = ps_opt_flag_names();
    for (int i = 0; f[i]; i++)
        if (strlen(f[i]) == n && strncmp(f[i], flag, n) == 0)
            return i;
    return -1;
}

/* Row id, or with id -1 the optimizer's `flag`, takes val. */
static int apply(ps_settings_cmd *c, int id, const char *flag, const char *val, char *why,
                 size_t len)
{
    const ps_setting *r = id >= 0 ? &rows[id] : NULL;
    int own = r ? r->type == PS_SETTING_OWN || !(r->progs & c->program) : c->shared;
    if (own && !c->own) {
        ps_errorf(why, len, "%s: %s is not taken here", c->prog, flag);
        return PS_EINVAL;
    }
    if (own)
        return c->own(c->ctx, id, flag, val, why, len);
    if (!r) {
        int handled = 0;
        return ps_opt_flag(c->prog, flag, val, c->opt, &handled, why, len);
    }
    if (r->type == PS_SETTING_LOG) {
        c->log_level = (int)r->hi;
        return 0;
    }
    long long v = 0;
    if (r->type != PS_SETTING_BOOL && ps_setting_parse_value(c->prog, flag, r, val, &v, why, len))
        return PS_EINVAL;
    const ps_setting_field *f = field_of(c->fields, c->nfields, id);
    if (f)
        store(f, c->cfg, val, v);
    return 0;
}

/* The first variable of the space-separated list env that is set: its name
 * into name, its value; NULL when none is. */
static const char *first_env(const char *env, char *name, size_t cap)
{
    for (const char *p = env; p && *p;) {
        size_t n = strcspn(p, " ");
        snprintf(name, cap, "%.*s", (int)n, p);
        p += n + (p[n] == ' ');
        const char *v = getenv(name);
        if (v && *v)
            return v;
    }
    return NULL;
}

/* A value from variable `var` was refused: say where it came from. */
static int from_env_error(const char *var, char *why, size_t len)
{
    size_t n = strlen(why);
    if (n < len)
        snprintf(why + n, len - n, " (from %s)", var);
    return PS_EINVAL;
}

/* The rows (and optimizer flags) not given take their variables' value. */
static int read_env(ps_settings_cmd *c, char *why, size_t len)
{
    for (int id = 0; id < PS_SET_N; id++) {
        const ps_setting *r = &rows[id];
        const char *val;
        if (!r->env || !(r->progs & c->program) || c->from[id] ||
            !(val = first_env(r->env, c->vars[id], sizeof c->vars[id])))
            continue;
        if (apply(c, id, r->flag, val, why, len))
            return from_env_error(c->vars[id], why, len);
        c->from[id] = c->vars[id];
    }
    const char *const *f = ps_opt_flag_names();
    for (int i = 0; c->opt && f[i]; i++) {
        char var[64];
        ps_settings_opt_env(f[i], var, sizeof var);
        const char *val = getenv(var);
        if (c->opt_from >> i & 1u || !val || !*val)
            continue;
        if (apply(c, -1, f[i], val, why, len))
            return from_env_error(var, why, len);
        c->opt_from |= 1u << i;
    }
    return 0;
}

int ps_settings_parse(ps_settings_cmd *c, int argc, char **argv, char *why, size_t len)
{
    c->next = argc;
    c->rest = 0;
    c->help = 0;
    c->log_level = PS_LOG_INFO;
    c->opt_from = 0;
    memset(c->from, 0, sizeof c->from);
    if (len)
        why[0] = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (c->dashdash && !strcmp(a, "--")) {
            c->next = i + 1;
            break;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            c->help = 1;
            return 0;
        }
        if (!strcmp(a, "--version") || !strcmp(a, "--help-markdown")) {
            c->help = a[2] == 'v' ? 2 : 3;
            return 0;
        }
        int id = -1, oi = -1;
        for (int k = 0; k < PS_SET_N && id < 0; k++)
            if (takes(c, &rows[k]) && flag_is(&rows[k], a))
                id = k;
        if (id < 0 && (c->opt || c->shared))
            oi = ps_settings_opt_index(a);
        if (id < 0 && oi < 0) {
            ps_errorf(why, len, "%s: %s '%s' (see --help%s)", c->prog,
                a[0] == '-' ? "unknown flag" : "unexpected argument", a, c->hint ? c->hint : "");
            return PS_EINVAL;
        }
        const ps_setting *r = id >= 0 ? &rows[id] : NULL;
        const char *flag = r ? r->flag : ps_opt_flag_names()[oi];
        const char *eq = strchr(a, '=');
        const char *val = NULL;
        if (r && r->type == PS_SETTING_REST) {
            /* the rest of the command line is its own */
            if (eq) {
                ps_errorf(why, len, "%s: %s takes the rest of the command line, not '%s'",
                    c->prog, flag, a);
                return PS_EINVAL;
            }
            c->from[id] = r->flag;
            c->rest = i + 1;
            return 0;
        }
        if (r && !r->arg[0]) {
            if (eq) {
                ps_errorf(why, len, "%s: %s takes no value, got '%s'", c->prog, flag, a);
                return PS_EINVAL;
            }
        } else if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            ps_errorf(why, len, "%s: %s needs a value (see --help)", c->prog, flag);
            return PS_EINVAL;
        }
        if (apply(c, id, flag, val, why, len))
            return PS_EINVAL;
        if (r)
            c->from[id] = r->flag;
        else
            c->opt_from |= 1u << oi;
    }
    return c->env ? read_env(c, why, len) : 0;
}

void ps_settings_opt_env(const char *flag, char *out, size_t len)
{
    size_t n = 0;
    while (*flag == '-')
        flag++;
    for (const char *p = "PS_"; *p && n + 1 < len; p++)
        out[n++] = *p;
    for (; *flag && n + 1 < len; flag++)
        out[n++] = *flag == '-' ? '_' : (char)(*flag >= 'a' && *flag <= 'z' ? *flag - 32 : *flag);
    if (len)
        out[n < len ? n : len - 1] = 0;
}

const char *ps_settings_shared_flag(int i)
{
    if (i < 0)
        return NULL;
    for (int id = 0; id < PS_SET_N; id++)
        if ((rows[id].props & PS_SET_SHARED) && i-- == 0)
            return rows[id].flag;
    const char *const *f = ps_opt_flag_names();
    for (int k = 0; f[k]; k++)
        if (k == i)
            return f[k];
    return NULL;
}

/* ------------------------------------------------------------ help */

#define HELP_WIDTH 80
#define HELP_COL 25 /* where the text of a flag starts */

/* Write text from column *col on, wrapping at HELP_WIDTH to `indent`;
 * spaces between words are kept (two after a sentence), not at a break.
 * NBSP (a byte 1) is a space that does not break. */
#define NBSP '\1'

static void wrap(FILE *f, const char *text, int *col, int indent)
{
    const char *p = text;
    while (*p) {
        size_t sp = strspn(p, " ");
        size_t n = strcspn(p + sp, " ");
        if (!n)
            break;
        if (*col > indent && *col + (int)(sp + n) > HELP_WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            *col = indent;
        } else if (*col > indent || (*col == indent && p != text)) {
            fprintf(f, "%*s", (int)sp, "");
            *col += (int)sp;
        }
        for (size_t k = 0; k < n; k++)
            fputc(p[sp + k] == NBSP ? ' ' : p[sp + k], f);
        *col += (int)n;
        p += sp + n;
    }
}

/* "2^40" for large powers of two, else the number. */
static void num_text(long long v, char *out, size_t len)
{
    int k = 0;
    while (k < 63 && (1ll << k) < v)
        k++;
    if (v >= 1ll << 20 && v == 1ll << k)
        snprintf(out, len, "2^%d", k);
    else
        snprintf(out, len, "%lld", v);
}

/* The parenthesis after a row's help: range (--help only), default, and
 * for a worker its variables; "" when there is nothing to say.  md: for
 * the README (names in backquotes). */
static void tail_text(const ps_setting *r, unsigned prog, int md, char *out, size_t len)
{
    size_t o = 0;
    const char *sep = "";
    out[0] = 0;
#define ADD_(...) (o += (size_t)snprintf(out + o, o < len ? len - o : 0, __VA_ARGS__))
    if (!md && (r->type == PS_SETTING_INT || r->type == PS_SETTING_SECS)) {
        char lo[24], hi[24];
        num_text(r->lo, lo, sizeof lo);
        num_text(r->hi, hi, sizeof hi);
        ADD_("%s..%s", lo, hi);
        sep = ", ";
    }
    if (r->def) {
        ADD_("%s%s%s", sep, md ? "" : "default ", r->def);
        sep = "; ";
    }
    if (r->env && prog == PS_PROG_WORKER) {
        ADD_("%senv ", *sep ? "; " : "");
        for (const char *p = r->env; *p;) {
            size_t n = strcspn(p, " ");
            ADD_(md ? "%s`%.*s`" : "%s%.*s", p == r->env ? "" : ", ", (int)n, p);
            p += n + (p[n] == ' ');
        }
    }
#undef ADD_
}

/* "--flag ARG" */
static void head_text(const char *flag, const char *arg, char *out, size_t len)
{
    snprintf(out, len, "%s%s%s", flag, *arg ? " " : "", arg);
}

/* The flags of an OPT or SHARED row with their arguments, ", " between
 * them and NBSP between a flag and its argument. */
static void block_flags(int type, char *out, size_t len)
{
    size_t o = 0;
    out[0] = 0;
    for (int id = 0; type == PS_SETTING_SHARED && id < PS_SET_N; id++)
        if (rows[id].props & PS_SET_SHARED)
            o += (size_t)snprintf(out + o, o < len ? len - o : 0, "%s%s%c%s", o ? ", " : "",
                                  rows[id].flag, NBSP, rows[id].arg);
    const char *const *f = ps_opt_flag_names();
    for (int i = 0; f[i]; i++)
        o += (size_t)snprintf(out + o, o < len ? len - o : 0, "%s%s%c%s", o ? ", " : "", f[i],
                              NBSP,
                              i == 0 ? "NAME" : ps_opt_param_at(i - 1)->is_int ? "N" : "X");
}

static void usage_row(FILE *f, const ps_setting *r, unsigned prog)
{
    char head[1024], tail[256];
    int col = 0;
    if (r->type == PS_SETTING_HEAD) {
        fprintf(f, "%s\n", r->help);
        return;
    }
    if (r->type == PS_SETTING_OPT && prog == PS_PROG_SERVER) {
        /* the servers run it: every hyper-parameter with its range and default */
        wrap(f, r->help, &col, 0);
        fprintf(f, ":\n");
        ps_opt_usage(f, 2);
        return;
    }
    if (r->type == PS_SETTING_OPT || r->type == PS_SETTING_SHARED) {
        block_flags(r->type, head, sizeof head);
        fprintf(f, "  ");
        col = 2;
        wrap(f, head, &col, 2);
        fprintf(f, "\n%*s", HELP_COL, "");
        col = HELP_COL;
        wrap(f, r->help, &col, HELP_COL);
        fprintf(f, "\n");
        return;
    }
    head_text(r->flag, r->arg, head, sizeof head);
    if (strlen(head) + 3 <= HELP_COL) {
        fprintf(f, "  %-*s", HELP_COL - 2, head);
    } else {
        fprintf(f, "  %s\n%*s", head, HELP_COL, "");
    }
    col = HELP_COL;
    wrap(f, r->help, &col, HELP_COL);
    tail_text(r, prog, 0, tail, sizeof tail);
    if (*tail) {
        char t[300];
        snprintf(t, sizeof t, " (%s)", tail);
        wrap(f, t, &col, HELP_COL);
    }
    fprintf(f, "\n");
}

void ps_settings_usage(FILE *f, unsigned prog)
{
    for (int id = 0; id < PS_SET_N; id++)
        if (rows[id].progs & prog)
            usage_row(f, &rows[id], prog);
    fprintf(f, "  %-*s%s\n", HELP_COL - 2, "--help, --version", "print this, or the version, and exit");
}

/* ------------------------------------------------------------ README */

/* text for a table cell: | escaped, *, < and > kept from markdown, and
 * docs/NAME.md a link */
static void md_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        size_t n = 0;
        if (!strncmp(s, "docs/", 5)) {
            n = 5 + strspn(s + 5, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_");
            n = !strncmp(s + n, ".md", 3) ? n + 3 : 0;
        }
        if (n) {
            fprintf(f, "[%.*s](%.*s)", (int)n, s, (int)n, s);
            s += n - 1;
        } else if (*s == '|' || *s == '*') {
            fprintf(f, "\\%c", *s);
        } else if (*s == '<') {
            fputs("&lt;", f);
        } else if (*s == '>') {
            fputs("&gt;", f);
        } else {
            fputc(*s, f);
        }
    }
}

/* a flag cell: `--flag ARG` with | escaped */
static void md_flag(FILE *f, const char *flag, const char *arg)
{
    char h[256];
    head_text(flag, arg, h, sizeof h);
    fputc('`', f);
    for (const char *s = h; *s; s++)
        fprintf(f, *s == '|' ? "\\|" : "%c", *s);
    fputc('`', f);
}

static void md_row(FILE *f, const ps_setting *r, unsigned prog)
{
    char tail[256];
    if (r->type == PS_SETTING_HEAD)
        return;
    if (r->type == PS_SETTING_OPT && prog == PS_PROG_SERVER) {
        /* the servers run it: a row per hyper-parameter, with its default */
        fprintf(f, "| ");
        md_flag(f, "--optimizer", "NAME");
        fprintf(f, " | ");
        md_text(f, r->help);
        fprintf(f, ": sgd, momentum, nesterov, adagrad, adam or adamw (sgd); average (sync) or add: "
                   "the workers step their own optimizers ([docs/TORCH.md](docs/TORCH.md)) |\n");
        for (int p = 0; p < PS_OPT_NPARAMS; p++) {
            const ps_opt_param *o = ps_opt_param_at(p);
            fprintf(f, "| ");
            md_flag(f, o->flag, o->is_int ? "N" : "X");
            fprintf(f, " | ");
            md_text(f, o->help);
            fprintf(f, " (%g) |\n", o->def);
        }
        return;
    }
    fprintf(f, "| ");
    if (r->type == PS_SETTING_OPT || r->type == PS_SETTING_SHARED) {
        char flags[1024];
        block_flags(r->type, flags, sizeof flags);
        for (const char *p = flags; *p;) {
            size_t n = strcspn(p, ",");
            char one[128];
            snprintf(one, sizeof one, "%.*s", (int)n, p);
            *strchr(one, NBSP) = ' ';
            md_flag(f, one, "");
            p += n;
            if (*p) {
                fprintf(f, ", ");
                p += 2;
            }
        }
    } else {
        md_flag(f, r->flag, r->arg);
    }
    fprintf(f, " | ");
    md_text(f, r->help);
    tail_text(r, prog, 1, tail, sizeof tail);
    if (*tail)
        fprintf(f, " (%s)", tail);
    fprintf(f, " |\n");
}

void ps_settings_markdown(FILE *f, unsigned prog)
{
    fprintf(f, "| flag | meaning (default) |\n| --- | --- |\n");
    for (int id = 0; id < PS_SET_N; id++)
        if (rows[id].progs & prog)
            md_row(f, &rows[id], prog);
}

void ps_settings_print_help(const char *name, unsigned prog, int help, const char *head,
                            const char *tail)
{
    if (help == 2) {
        printf("%s %s\n", name, PS_VERSION);
    } else if (help == 3) {
        ps_settings_markdown(stdout, prog);
    } else {
        fputs(head, stdout);
        ps_settings_usage(stdout, prog);
        fputs(tail, stdout);
    }
}
