/* What ps_launch's plan files share (launch/plan.h has the contract):
 *   opts.c  ps_launch's flags and the worker flags it forwards, checked;
 *           this host's GPUs and program directory
 *   plan.c  the plan built from them: argv and environment per process,
 *           quoted for ssh; what it prints
 * Only these two include it. */
#ifndef PS_LAUNCH_PLAN_INTERNAL_H
#define PS_LAUNCH_PLAN_INTERNAL_H

#include "plan.h"

#define P "ps_launch"

/* A worker flag as ps_worker takes it: "--flag value" or "--flag=value". */
typedef struct wflag {
    int id;           /* its row of the settings table, or -1 */
    int opt;          /* one of the optimizer's flags */
    char name[64];    /* the flag, without "=value" */
    const char *val;  /* its value, or NULL */
    int words;        /* how many arguments it takes: 1 or 2 */
} wflag;

/* opts.c */
void wflag_at(char *const *v, int n, int k, wflag *w);
int wflag_shared(const wflag *w);
int wflag_output(const wflag *w);
const char *wflag_value(const ps_launch_opts *o, const char *flag);
void push_words(ps_strvec *a, const char *s);
const char *own_shared(const ps_launch_opts *o, const char *flag);

#endif
