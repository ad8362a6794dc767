/* The training loop of ps_worker: one worker's view of data-parallel training
 * through the parameter servers (or alone, with servers = NULL, as the
 * compute-only baseline). */
#ifndef PS_TRAIN_H
#define PS_TRAIN_H

#include <stdint.h>

#include "ps_proto.h"
#include "ps_settings.h"

typedef struct ps_train_config {
    const char *servers;   /* comma-separated endpoints; NULL: compute only, local SGD */
    int rank, num_workers;
    int mode;              /* PS_MODE_SYNC / PS_MODE_ASYNC */
    int max_staleness;     /* async: -1 unbounded */
    const char *model;     /* "mlp:784-256-128-10", "cnn" */
    int batch, epochs;
    long long max_steps;   /* stop after this many iterations (0: no limit) */
    ps_opt_config expect;  /* what to check of the servers' optimizer: kind PS_OPT_NONE
                              and no hyper-parameter given checks nothing */
    float local_lr;        /* the local-SGD rate without servers */
    const char *device;    /* "cpu", "cuda:N" */
    int threads;           /* BLAS threads */
    uint64_t seed;
    const char *data;      /* directory with IDX files, or "synthetic:N" */
    int log_every, eval_every; /* iterations; eval_every 0: once per epoch */
    int warmup;            /* steps left out of the summary's time and samples/s */
    int eval_all;          /* every worker evaluates, not only rank 0 */
    const char *log_csv, *timeline, *save_path, *load_path;
    const char *curve_dir;
    size_t chunk_bytes;
    int request_timeout_ms; /* resend unanswered requests after this (0: never) */
    int hello_timeout_ms;   /* how long start waits for every server (0: 10 s) */
    int heartbeat_ms;       /* heartbeats to the servers (0: none) */
    int shm;                /* 1: offer a shared-memory arena to servers on this host */
    int wire_dtype;         /* enum ps_dtype of pushes and pulls on the network (f32) */
    int on_nonfinite;       /* enum ps_on_nonfinite: refuse (default) stops at the step whose
                               gradient holds NaN or Inf, before it is pushed */
    int server_timeout_ms;  /* give up on a server silent this long while we wait (0: never) */
    int local_size;         /* --local-aggregate: workers per host that sum their gradients
                               (ranks h*local_size.. of host h); 1: off */
    int metrics_port;       /* serve /metrics here (0: off) ... */
    const char *metrics_bind; /* ... on this address (default 127.0.0.1) */
} ps_train_config;

/* The settings table's defaults (common/ps_settings.h: sync, 1 worker,
 * mlp:784-256-128-10, batch 64, ...), the optimizer unchecked, local-SGD
 * rate 0.05. */
void ps_train_config_default(ps_train_config *c);

/* Where the settings table's worker rows live in ps_train_config (n of
 * them), for ps_settings_parse. */
const ps_setting_field *ps_train_config_fields(int *n);

/* Run training; returns 0 or a PS_E* code (message already logged).  The
 * output files (log_csv, timeline, and save_path on rank 0) are checked first,
 * before the data is read or a server is asked, and their directories made:
 * one that cannot be written is PS_EINVAL, a flag to fix like a bad value. */
int ps_train_run(const ps_train_config *c);

/* The signal (SIGINT, SIGTERM) that stopped the last ps_train_run early, or 0;
 * ps_train_run then returned PS_ECLOSED. */
int ps_train_stop_signal(void);

#endif
