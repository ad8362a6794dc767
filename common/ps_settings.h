/* The run settings: one table, PS_SETTINGS below, that every program's
 * command line, --help and README section, the hello comparison, ps_launch's
 * forwarding and libps's defaults come from.  A new setting is one row here
 * (plus the code that uses its value, and a field of that name in the
 * config struct of each program that takes it).
 *
 * How values reach the programs: a row names the field of the program's own
 * config struct (ps_server_config, ps_train_config, ps_launch_opts,
 * ps_client_options, ps_keygen_opts) that holds it, and each program builds
 * the offsets of the fields of its rows with PS_SETTING_FIELDS.  So code
 * reads cfg->mode, typed, as before; the parser writes through the offset;
 * and a field that a row names but a struct lacks does not compile.  (One
 * struct of every setting, embedded in each config, would give the server a
 * worker's --batch and the worker a server's --max-memory, and rename every
 * field the server's modules read.)
 *
 * The optimizer keeps its own table (PS_OPT_PARAMS in include/ps_types.h,
 * common/ps_opt_table.h): rows of type OPT mark where its flags go in a
 * program's help, and the parser hands them to ps_opt_flag.
 *
 * Environment: a row's variables carry it to a worker program.  ps_launch
 * --exec sets them; ps_worker and ps.Client (python/ps/client.py, which asks
 * libps with ps_client_setting) read those of the rows they take when the
 * flag or argument is not given, the first one set winning.  Servers read
 * none. */
#ifndef PS_SETTINGS_H
#define PS_SETTINGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ps_curve.h"
#include "ps_limits.h"
#include "ps_opt_table.h"
#include "ps_types.h"

/* Which programs take a row (the progs column, (SERVER, WORKER, LAUNCH,
 * LIBPS, TOOL) with _ for one that does not; TOOL is one of the operator
 * programs: KEYGEN or TOP): */
#define PS_PROG_SERVER 1u /* ps_server: ps_server_config */
#define PS_PROG_WORKER 2u /* ps_worker: ps_train_config */
#define PS_PROG_LAUNCH 4u /* ps_launch: ps_launch_opts */
#define PS_PROG_LIBPS 8u  /* ps_client_options: ps_client_options_default takes the
                             default, and ps.Client reads the variables */
#define PS_PROG_KEYGEN 16u /* ps_keygen: ps_keygen_opts */
#define PS_PROG_TOP 32u    /* ps_top: ps_top_opts */

/* What a row is (the type column, without the prefix):
 *   INT     an integer in [lo, hi]
 *   SIZE    bytes in [lo, hi], "4M", "64KiB", "1G" (K, M, G: powers of 1024)
 *   SECS    seconds in [lo, hi], "2.5"; the field holds milliseconds (a
 *           positive value stays at least 1 ms)
 *   ENUM    one of the names in choices, "sync=1 async=2": the field holds
 *           the number; arg lists the names help shows, the others are aliases
 *   STR     text of lo..hi characters; the field points into argv (or environ)
 *   BOOL    no value: the field becomes 1
 *   OWN     the program parses it (ps_settings_cmd.own); a value when arg is
 *           not ""
 *   LOG     no value: the log level becomes hi (ps_settings_cmd.log_level)
 *   REST    the rest of the command line is its (ps_settings_cmd.rest)
 *   OPT     the optimizer's flags (PS_OPT_PARAMS) go here; help is their heading
 *   SHARED  ps_launch: the rows servers and workers share, and the optimizer's
 *   HEAD    a heading in --help (the help text), no flag
 *   RANGE   N or MIN:MAX, integers in [lo, hi], MIN <= MAX: the field holds MAX
 *           and the int field named like it with _min after it (num_workers_min)
 *           MIN (N alone: both N)
 * Rows of the first six types and RANGE have a field; the others name it _. */
enum {
    PS_SETTING_INT,
    PS_SETTING_SIZE,
    PS_SETTING_SECS,
    PS_SETTING_ENUM,
    PS_SETTING_STR,
    PS_SETTING_BOOL,
    PS_SETTING_OWN,
    PS_SETTING_LOG,
    PS_SETTING_REST,
    PS_SETTING_OPT,
    PS_SETTING_SHARED,
    PS_SETTING_HEAD,
    PS_SETTING_RANGE
};

/* The props column: */
#define PS_SET_SHARED 1u    /* servers and workers must be given the same: ps_launch
                               takes it (or finds it among the worker flags) and gives
                               it to both; an --exec worker gets it in its variable */
#define PS_SET_BY_LAUNCH 2u /* ps_launch sets it for every process itself; among the
                               worker flags it is refused */
#define PS_SET_OUTPUT 4u    /* a file a worker writes: under ps_launch, without {rank}
                               in its value only worker 0 gets it */

/* The hello column: HELLO("key") when servers and workers must agree on the
 * value, which the hello map then carries under that key (docs/PROTOCOL.md)
 * in the ps_hello field the row names, and ps_hello_compare compares; _ when
 * the hello does not carry it. */

/* The rows, in the order --help and the README list them:
 *   X(id, progs, flag, arg, env, type, field, default, choices, lo, hi, hello,
 *     props, help)
 * id names the row (PS_SET_<id>); two rows may share a flag when they are
 * different programs' (ps_server --threads, ps_worker --threads).  default
 * is text the row's parser takes (NULL: the field stays 0 / NULL).  help is
 * plain text: --help wraps it, the README section (make readme-flags) puts
 * it in a table cell, turning docs/NAME.md into a link. */
#define PS_SETTINGS(X)                                                                           \
    X(lch_servers, (_, _, LAUNCH, _, _), "--servers", "S", NULL, INT, servers, NULL, NULL, 1,    \
      PS_LAUNCH_MAX_SERVERS, _, 0, "ps_server processes (required without --hostfile)")          \
    X(lch_workers, (_, _, LAUNCH, _, _), "--workers", "W|MIN:MAX", NULL, RANGE, workers, NULL,   \
      NULL, 1, PS_LAUNCH_MAX_WORKERS, _, 0,                                                      \
      "ps_worker processes, or copies of the --exec program (required without --hostfile); "     \
      "MIN:MAX (torchrun's --nnodes): an elastic job of MAX workers that goes on while MIN are "  \
      "left, a lost one replaced (--restart-workers) and joining the running job "                \
      "(docs/LAUNCH.md \"Elastic jobs\")")                                                        \
    X(gpus, (_, _, LAUNCH, _, _), "--gpus", "auto|none|IDS", NULL, STR, gpus, "auto", NULL, 1,   \
      900, _, 0,                                                                                 \
      "auto: one worker per GPU found (the entries of CUDA_VISIBLE_DEVICES when a "              \
      "scheduler set it, else /proc/driver/nvidia/gpus or nvidia-smi -L), round-robin "          \
      "when there are more workers; each worker sees only its GPU (CUDA_VISIBLE_DEVICES) "       \
      "and gets --device cuda:0.  No GPU, or none: --device cpu.  IDS, e.g. 0,1: those "         \
      "GPUs (repeat an id to put two workers on it)")                                            \
    X(wrk_head_cluster, (_, WORKER, _, _, _), "", "", NULL, HEAD, _, NULL, NULL, 0, 0, _, 0,     \
      "cluster:")                                                                                \
    X(bind, (SERVER, _, _, _, _), "--bind", "ENDPOINT", NULL, OWN, _, NULL, NULL, 0, 0, _,       \
      PS_SET_BY_LAUNCH,                                                                          \
      "ZeroMQ endpoint to listen on (required): tcp://*:PORT (every interface), "                \
      "tcp://ADDRESS:PORT, tcp://HOST:PORT (the name is resolved) or ipc:///PATH")               \
    X(servers, (_, WORKER, _, LIBPS, _), "--servers", "LIST", "PS_SERVERS", STR, servers, NULL,  \
      NULL, 1, 65536, _, PS_SET_BY_LAUNCH,                                                       \
      "server endpoints in server-rank order, tcp://HOST:PORT[,...]; none: train alone "         \
      "with local SGD (the compute-only baseline)")                                              \
    X(srv_rank, (SERVER, _, _, _, _), "--rank", "R", NULL, INT, rank, "0", NULL, 0,              \
      PS_MAX_RANK, _, PS_SET_BY_LAUNCH, "this server's rank, 0..num-servers-1")                  \
    X(rank, (_, WORKER, _, LIBPS, _), "--rank", "R",                                             \
      "PS_RANK RANK SLURM_PROCID OMPI_COMM_WORLD_RANK PMI_RANK", INT, rank, "0", NULL, 0,        \
      PS_MAX_RANK, _, PS_SET_BY_LAUNCH, "this worker's rank, 0..num-workers-1")                  \
    X(num_servers, (SERVER, _, _, _, _), "--num-servers", "S", "PS_NUM_SERVERS", INT,            \
      num_servers, "1", NULL, 1, PS_MAX_SERVERS, HELLO("ns"), PS_SET_BY_LAUNCH,                  \
      "number of servers (a worker counts the endpoints it is given)")                           \
    X(num_workers, (SERVER, WORKER, _, LIBPS, _), "--num-workers", "W|MIN:MAX",                  \
      "PS_NUM_WORKERS WORLD_SIZE SLURM_NTASKS OMPI_COMM_WORLD_SIZE PMI_SIZE", RANGE,             \
      num_workers, "1", NULL, 1, PS_MAX_WORKERS, HELLO("nw"), PS_SET_BY_LAUNCH,                  \
      "number of workers: give the real count for a cluster (the servers refuse a worker "       \
      "whose count differs); MIN:MAX, an elastic job: ranks 0..MAX-1 (MAX is the count "         \
      "servers and workers agree on), workers join and leave while training goes on, and "      \
      "barriers wait for MIN members, so the job starts with MIN (docs/OPERATIONS.md "           \
      "\"Elastic jobs\")")                                                                       \
    X(mode, (SERVER, WORKER, LAUNCH, LIBPS, _), "--mode", "sync|async", "PS_MODE", ENUM, mode,   \
      "sync", "sync=1 async=2", 0, 0, HELLO("mode"), PS_SET_BY_LAUNCH,                           \
      "consistency: sync, every step waits for the gradients of all workers (summed in "         \
      "rank order: runs are bitwise repeatable); async, each gradient is applied on "            \
      "arrival.  Servers and workers must agree")                                                \
    X(max_staleness, (SERVER, WORKER, _, LIBPS, _), "--max-staleness", "K", "PS_MAX_STALENESS",  \
      INT, max_staleness, "-1", NULL, -1, PS_MAX_STALENESS, HELLO("stal"), PS_SET_SHARED,        \
      "async: a worker runs at most K steps ahead of the slowest one (its pulls wait); "         \
      "-1: unbounded.  Sync is staleness 0, the only value it takes.  Servers and "              \
      "workers must agree")                                                                      \
    X(srv_opt, (SERVER, _, _, _, _), "", "", NULL, OPT, _, NULL, NULL, 0, 0, _, 0,               \
      "the optimizer the servers run (workers check those of these they are given at "           \
      "hello)")                                                                                  \
    X(server_threads, (_, _, LAUNCH, _, _), "--server-threads", "T", NULL, INT, server_threads,  \
      "1", NULL, 1, PS_SERVER_MAX_THREADS, _, 0, "update threads per server (ps_server "         \
      "--threads)")                                                                              \
    X(srv_threads, (SERVER, _, _, _, _), "--threads", "T", NULL, INT, threads, "1", NULL, 1,     \
      PS_SERVER_MAX_THREADS, _, PS_SET_BY_LAUNCH,                                                \
      "update threads; each chunk is owned by one of them (by hash), so the hot path takes "     \
      "no lock")                                                                                 \
    X(max_memory, (SERVER, _, _, _, _), "--max-memory", "BYTES", NULL, SIZE, max_memory, NULL,   \
      NULL, 4096, 1ll << 50, _, 0,                                                               \
      "cap on weights + optimizer state, table rows and pull replies sent as copies and not "    \
      "yet read; inits, rows and copies beyond it are refused (default: half of the host's "     \
      "MemAvailable when the server starts, 8G when /proc/meminfo says none; "                   \
      "docs/OPERATIONS.md)")                                                                     \
    X(table_memory_per_worker, (SERVER, _, _, _, _), "--table-memory-per-worker", "BYTES", NULL, \
      SIZE, table_memory_per_worker, NULL, NULL, 4096, 1ll << 50, _, 0,                          \
      "table rows one worker's pulls and pushes may make on this server; beyond it that "        \
      "worker's requests that make rows are refused and the others go on (default: "            \
      "--max-memory x 1.25 / --num-workers, a quarter more than an even share)")                 \
    X(max_tables, (SERVER, _, _, _, _), "--max-tables", "N", NULL, INT, max_tables, "1024",       \
      NULL, 1, 1000000, _, 0, "embedding tables a job may declare; more are refused")           \
    X(max_peer_replies, (SERVER, _, _, _, _), "--max-peer-replies", "N", NULL, INT,              \
      max_peer_replies, "10000", NULL, 1, 1000000000, _, 0,                                      \
      "pull replies one connection may leave unread before its pulls are refused "               \
      "(docs/OPERATIONS.md \"Memory\")")                                                         \
    X(max_peer_bytes, (SERVER, _, _, _, _), "--max-peer-bytes", "BYTES", NULL, SIZE,             \
      max_peer_bytes, NULL, NULL, 4096, 1ll << 50, _, 0,                                         \
      "bytes of pull replies one connection may leave unread before its pulls are refused "      \
      "(default: 64M or twice the memory of this server's chunks, whichever is larger)")         \
    X(srv_timeline, (SERVER, _, _, _, _), "--timeline", "FILE", NULL, STR, timeline, NULL,       \
      NULL, 1, 900, _, 0,                                                                        \
      "Chrome trace-event JSON: an apply event per update and a pull event per served "          \
      "pull, one lane per update thread")                                                        \
    X(curve_keys, (SERVER, WORKER, _, LIBPS, _), "--curve-keys", "DIR", "PS_CURVE_KEYS", STR,    \
      curve_dir, NULL, NULL, 1, 900, _, PS_SET_SHARED,                                           \
      "CURVE keys from ps_keygen: all traffic is encrypted, servers serve only workers "         \
      "whose public keys are in DIR/authorized, and a key in DIR/admin may also stop a "         \
      "server with a message (docs/SECURITY.md)")                                                \
    X(admin_token_file, (SERVER, _, _, _, _), "--admin-token-file", "FILE", NULL, STR,           \
      admin_token_file, NULL, NULL, 1, 900, _, 0,                                                \
      "a shutdown message carrying the token in FILE (mode 0600, 16..128 characters) "           \
      "stops the server; without it (or a CURVE admin key) only SIGTERM and SIGINT do "          \
      "(docs/SECURITY.md)")                                                                      \
    X(admin_token, (_, _, _, LIBPS, _), "--admin-token", "TOKEN", "PS_ADMIN_TOKEN", STR,         \
      admin_token, NULL, NULL, 16, 128, _, 0,                                                    \
      "the token of the servers' --admin-token-file, sent with a shutdown request")              \
    X(chunk_size, (_, WORKER, _, LIBPS, _), "--chunk-size", "BYTES", "PS_CHUNK_SIZE", SIZE,      \
      chunk_bytes, "4M", NULL, PS_MIN_CHUNK_BYTES, PS_MAX_CHUNK_BYTES, _, 0,                     \
      "tensors are cut into chunks of at most this and spread over the servers")                 \
    X(shm, (SERVER, WORKER, _, LIBPS, _), "--shm", "auto|off", "PS_SHM", ENUM, shm, "auto",      \
      "auto=1 off=0", 0, 0, _, PS_SET_SHARED,                                                    \
      "auto: a worker keeps its weights and gradients in a shared-memory arena (a sealed "      \
      "memfd, mode 0600, allocated at start: not in /dev/shm) and offers it at hello; a server " \
      "on the same host and of the same user maps it and moves the payloads through it "        \
      "(always float32) while ZeroMQ carries the headers.  off, on either side: always over "   \
      "the network")                                                                             \
    X(shm_users, (SERVER, _, _, _, _), "--shm-users", "LIST", NULL, STR, shm_users, NULL, NULL, \
      1, 900, _, 0,                                                                              \
      "user names or uids whose workers' arenas this server maps besides its own user's "      \
      "(a root server, say, serving workers of another user); every arena must be a sealed "    \
      "memfd of mode 0600 (docs/SECURITY.md)")                                                   \
    X(wire_dtype, (SERVER, WORKER, _, _, _), "--wire-dtype", "f32|bf16|f16", "PS_WIRE_DTYPE",    \
      ENUM, wire_dtype, "f32", "f32=1 bf16=2 f16=3 float32=1 bfloat16=2 float16=3 fp16=3",       \
      0, 0, HELLO("dt"), PS_SET_SHARED,                                                          \
      "element type of pushed gradients and pulled weights on the network: bf16 and f16 "        \
      "halve the bytes (rounded to nearest even); servers keep float32 weights and "             \
      "optimizer state.  Servers and workers must agree (docs/BENCHMARKS.md \"Multi-host\")")    \
    X(on_nonfinite, (SERVER, WORKER, _, LIBPS, _), "--on-nonfinite", "refuse|skip|apply",      \
      "PS_ON_NONFINITE", ENUM, on_nonfinite, "refuse", "refuse=0 skip=1 apply=2", 0, 0, _,      \
      PS_SET_SHARED,                                                                             \
      "a pushed gradient holding NaN or Inf (counted in the stats and logged, "                   \
      "rate-limited): refuse, the push gets an error naming worker, key, chunk and step, and a " \
      "worker does not even send one (nor a value a float16 wire type would make Inf); "        \
      "skip, it counts as the worker's push and moves no weight (a sync round averages the "    \
      "others); apply, it is applied, the old behaviour (docs/OPERATIONS.md)")                   \
    X(local_aggregate, (_, WORKER, _, _, _), "--local-aggregate", "N", NULL, INT, local_size,    \
      "1", NULL, 1, 64, _, 0,                                                                    \
      "N workers of this host (ranks h*N .. h*N+N-1 of host h) sum their gradients in "          \
      "shared memory and the first of them alone talks to the servers, whose "                   \
      "--num-workers is then the number of hosts: one copy per host on the network "             \
      "(docs/PROTOCOL.md \"Local aggregation\").  ps_launch --hostfile turns it on in sync "     \
      "mode when every host runs the same N > 1 workers.  1: off")                               \
    X(request_timeout, (_, WORKER, _, _, _), "--request-timeout", "MS", "PS_REQUEST_TIMEOUT",    \
      INT, request_timeout_ms, "5000", NULL, 0, 3600000, _, 0,                                   \
      "resend an unanswered request after MS, then after 2x, 4x... up to 30 s; servers "         \
      "drop the duplicates, so a restarted server gets what it lost.  0: never")                 \
    X(hello_timeout, (_, WORKER, _, LIBPS, _), "--hello-timeout", "MS", "PS_HELLO_TIMEOUT",      \
      INT, hello_timeout_ms, "10000", NULL, 1, 3600000, _, 0,                                    \
      "give up when a server does not answer hello within MS")                                   \
    X(heartbeat, (_, WORKER, _, LIBPS, _), "--heartbeat", "MS", "PS_HEARTBEAT", INT,             \
      heartbeat_ms, "1000", NULL, 0, 3600000, _, 0,                                              \
      "tell every server this often that the worker is alive, for their "                        \
      "--worker-timeout.  0: never")                                                             \
    X(server_timeout, (_, WORKER, _, LIBPS, _), "--server-timeout", "S", "PS_SERVER_TIMEOUT",    \
      SECS, server_timeout_ms, "60", NULL, 0, 86400, _, 0,                                       \
      "exit 1 naming the server when one has sent nothing, not even a heartbeat's "              \
      "answer, for S seconds while the worker waits on it.  0: wait and resend forever")         \
    X(wrk_head_training, (_, WORKER, _, _, _), "", "", NULL, HEAD, _, NULL, NULL, 0, 0, _, 0,    \
      "model and training:")                                                                     \
    X(model, (_, WORKER, _, _, _), "--model", "SPEC", NULL, STR, model, "mlp:784-256-128-10",    \
      NULL, 1, 900, _, 0,                                                                        \
      "mlp:IN-H1-...-OUT (linear + ReLU), cnn (conv5x5x32-relu-pool, "                           \
      "conv5x5x64-relu-pool, fc1024-relu, fc10), or ctr[:KEY=VALUE,...], the click-through "     \
      "model: an embedding bag per categorical field joined with the dense features side by "    \
      "side (interact=cat) or by DLRM's pairwise dots after a bottom MLP (interact=dot, "         \
      "bot=H1-...-dim), then an MLP to one logit, binary cross-entropy and test AUC.  Keys "      \
      "(defaults): fields (26), dense (13), dim (16), rows: ids per field of synthetic data "     \
      "(1000000), pool=sum|mean (sum), mlp=H1-...-1 (512-256-1), the tables' "                  \
      "opt=sgd|adagrad|rowwise_adagrad and lr (adagrad, 0.05), cap: each table's max_rows "     \
      "(none) and full=evict|refuse, what a table at its cap does with a new id (evict).  "    \
      "The tables live on the servers (each batch's rows fetched "                             \
      "while the one before computes), with --servers none in the worker; on the CPU or a "      \
      "GPU (--device)")                                                                          \
    X(batch, (_, WORKER, _, _, _), "--batch", "B", NULL, INT, batch, "64", NULL, 1, 65536, _,    \
      0, "samples per step per worker")                                                          \
    X(epochs, (_, WORKER, _, _, _), "--epochs", "E", NULL, INT, epochs, "1", NULL, 1, 100000,    \
      _, 0, "passes over this worker's shard of the data")                                       \
    X(steps, (_, WORKER, _, _, _), "--steps", "N", NULL, INT, max_steps, "0", NULL, 0,           \
      1ll << 40, _, 0, "stop after N steps; 0: run every epoch")                                 \
    X(wrk_opt, (_, WORKER, _, _, _), "", "", NULL, OPT, _, NULL, NULL, 0, 0, _, 0,               \
      "the servers apply the optimizer: each of these that is given is checked against "         \
      "theirs at start (a mismatch exits 2 naming both values), the others are not "             \
      "(ranges as in ps_server --help).  --lr is also the local-SGD rate with --servers "        \
      "none (default 0.05)")                                                                     \
    X(seed, (_, WORKER, _, _, _), "--seed", "S", NULL, INT, seed, "1", NULL, 0, 1ll << 62, _,    \
      0, "weight init and data order, the same on every worker")                                 \
    X(device, (_, WORKER, _, _, _), "--device", "cpu|cuda:N", "PS_DEVICE", STR, device, "cpu",   \
      NULL, 1, 900, _, PS_SET_BY_LAUNCH, "compute device")                                       \
    X(wrk_threads, (_, WORKER, _, _, _), "--threads", "T", NULL, INT, threads, "1", NULL, 1,     \
      256, _, 0, "BLAS threads on the CPU")                                                      \
    X(data, (_, WORKER, _, _, _), "--data", "DIR|synthetic:N|...", NULL, STR, data, NULL, NULL,  \
      1, 900, _, 0,                                                                              \
      "directory of MNIST-format IDX files (default /usr/share/datasets/fashion-mnist), "        \
      "or synthetic:N, N random samples; for ctr: synthetic-ctr:N[,test=H][,zipf=S] "            \
      "(Zipf-distributed ids over rows per field, exponent 1.05, a planted logistic rule; the "  \
      "test set is the H samples after the N, N/10 by default; python/ps/data_ctr.py makes the " \
      "same samples in numpy) or criteo:PATH[,test=PATH2][,lines=N] (Criteo's tab-separated "    \
      "text, plain or gzip, held in memory; the test set is PATH2 or PATH's last tenth)")        \
    X(wrk_head_output, (_, WORKER, _, _, _), "", "", NULL, HEAD, _, NULL, NULL, 0, 0, _, 0,      \
      "output:")                                                                                 \
    X(log_every, (_, WORKER, _, _, _), "--log-every", "N", NULL, INT, log_every, "100", NULL,    \
      1, 1 << 30, _, 0, "progress line every N steps")                                           \
    X(warmup, (_, WORKER, _, _, _), "--warmup", "N", NULL, INT, warmup, "0", NULL, 0, 1 << 30,   \
      _, 0,                                                                                      \
      "leave the first N steps out of the summary's time and samples/s (cuDNN's plans, GPU "     \
      "kernels loaded on first use, the first pulls)")                                           \
    X(eval_every, (_, WORKER, _, _, _), "--eval-every", "N", NULL, INT, eval_every, "0", NULL,   \
      0, 1 << 30, _, 0, "test accuracy (AUC for ctr) every N steps; 0: after each epoch")        \
    X(eval_all, (_, WORKER, _, _, _), "--eval-all", "", NULL, BOOL, eval_all, NULL, NULL, 0, 0,  \
      _, 0, "every worker evaluates, not only worker 0")                                         \
    X(log_csv, (_, WORKER, _, _, _), "--log-csv", "FILE", NULL, STR, log_csv, NULL, NULL, 1,     \
      900, _, PS_SET_OUTPUT,                                                                     \
      "time_s,epoch,iter,loss,samples_per_s,comm_wait_pct per logged step")                      \
    X(wrk_timeline, (_, WORKER, _, _, _), "--timeline", "FILE", "PS_TIMELINE", STR, timeline,    \
      NULL, NULL, 1, 900, _, PS_SET_OUTPUT,                                                      \
      "Chrome trace-event JSON (Perfetto, chrome://tracing): forward, backward, push, "          \
      "pull and wait per step and layer")                                                        \
    X(metrics_port, (SERVER, WORKER, _, LIBPS, _), "--metrics-port", "P", "PS_METRICS_PORT",     \
      INT, metrics_port, "0", NULL, 0, 65535, _, PS_SET_BY_LAUNCH,                               \
      "serve Prometheus metrics at http://BIND:P/metrics (BIND: --metrics-bind; "                \
      "docs/OPERATIONS.md, Metrics).  0: off")                                                   \
    X(metrics_bind, (SERVER, WORKER, _, LIBPS, _), "--metrics-bind", "ADDR", "PS_METRICS_BIND",  \
      STR, metrics_bind, "127.0.0.1", NULL, 1, 255, _, PS_SET_SHARED,                            \
      "the address /metrics listens on: 127.0.0.1 (only this host), 0.0.0.0 or :: (every "       \
      "interface: for a Prometheus on another host), or one interface's address")                \
    X(save, (_, WORKER, _, _, _), "--save", "FILE", NULL, STR, save_path, NULL, NULL, 1, 900,    \
      _, PS_SET_OUTPUT, "write the final model (worker 0; a checksummed file)")                  \
    X(load, (_, WORKER, _, _, _), "--load", "FILE", NULL, STR, load_path, NULL, NULL, 1, 900,    \
      _, 0, "start from a model --save wrote")                                                   \
    X(srv_head_faults, (SERVER, _, _, _, _), "", "", NULL, HEAD, _, NULL, NULL, 0, 0, _, 0,      \
      "fault tolerance (docs/OPERATIONS.md):")                                                   \
    X(checkpoint_dir, (SERVER, _, _, _, _), "--checkpoint-dir", "DIR", NULL, STR,                \
      checkpoint_dir, NULL, NULL, 1, 900, _, 0,                                                  \
      "write atomic, checksummed checkpoints of this server's shard to DIR "                     \
      "(DIR/shard-RANK-SEQ.ckpt, the newest 2 are kept; with --group in DIR/member-M)")          \
    X(checkpoint_every, (SERVER, _, _, _, _), "--checkpoint-every", "N|Ts", NULL, OWN, _, NULL,  \
      NULL, 0, 0, _, 0,                                                                          \
      "sync: every N rounds; async: every N pushes received, and no push is acknowledged "       \
      "more than N past the last checkpoint written (a crash loses at most N); Ts, e.g. "        \
      "30s: every T seconds (default 60s with --checkpoint-dir).  Sync with N = 1: every "       \
      "round is on disk before any worker sees it (exact restarts)")                             \
    X(added, (SERVER, _, _, _, _), "--added", "", NULL, BOOL, added, NULL, NULL, 0, 0, _, 0,     \
      "join a running job as a new server (its --rank one no server of the job has had, "      \
      ">= --num-servers, the job's first count): it holds nothing until the job's server 0 "    \
      "moves objects to it (ps_servers add, docs/OPERATIONS.md \"Servers added and removed\")")   \
    X(restore, (SERVER, _, _, _, _), "--restore", "", NULL, BOOL, restore, NULL, NULL, 0, 0, _,  \
      0,                                                                                         \
      "start from the newest valid checkpoint in --checkpoint-dir (exit 2 when there is "        \
      "none or it has another configuration)")                                                   \
    X(import_dir, (SERVER, _, _, _, _), "--import", "DIR", NULL, STR, import_dir, NULL, NULL, 1,  \
      900, _, 0,                                                                                 \
      "start with the tables of export DIR (ps_export, opt.export): this server's share of "     \
      "their rows under any number of servers and --threads, each table at the export's step "   \
      "(docs/OPERATIONS.md \"Export and serve\"); not with --restore")                            \
    X(import_state, (SERVER, _, _, _, _), "--import-state", "keep|reset", NULL, ENUM,            \
      import_state, "keep", "keep=0 reset=1", 0, 0, _, 0,                                        \
      "--import: keep each row's optimizer state and each table's step (keep), or start them "   \
      "afresh (reset: state 0, step 0)")                                                         \
    X(on_checkpoint_failure, (SERVER, _, _, _, _), "--on-checkpoint-failure",                    \
      "stall[:S]|continue|exit[:S]", NULL, OWN, _, NULL, NULL, 0, 0, _, 0,                       \
      "while checkpoint writes fail: stall (default): what waits for a checkpoint (durable "     \
      "rounds, new chunks' inits, async acks past N) waits, and after S seconds (default "       \
      "30) its worker gets an error saying why; continue: go on without checkpoints; "           \
      "exit: stop (exit 1) when writes still fail S seconds (default 10) after the first "       \
      "failure")                                                                                 \
    X(worker_timeout, (SERVER, _, _, _, _), "--worker-timeout", "S", NULL, SECS,                 \
      worker_timeout_ms, "0", NULL, 0, 86400, _, 0,                                              \
      "a worker silent this many seconds (no message, no heartbeat) is lost, and so is one "    \
      "that never said hello this long after the first worker did; 0: never")                  \
    X(on_worker_loss, (SERVER, _, _, _, _), "--on-worker-loss", "wait|drop", NULL, ENUM,         \
      on_worker_loss, "wait", "wait=0 drop=1", 0, 0, _, 0,                                       \
      "wait: log a lost worker and keep waiting for it; drop: go on without it (rounds "         \
      "average the live workers, barriers count them) until it says hello again; needs "         \
      "--worker-timeout")                                                                        \
    X(exit_on_stdin_eof, (SERVER, _, _, _, _), "--exit-on-stdin-eof", "", NULL, OWN, _, NULL,    \
      NULL, 0, 0, _, 0,                                                                          \
      "stop as on SIGTERM (final checkpoint, stopped: line) when standard input ends: a "        \
      "server started over a connection ends with it (ps_launch over ssh gives it)")             \
    X(srv_head_repl, (SERVER, _, _, _, _), "", "", NULL, HEAD, _, NULL, NULL, 0, 0, _, 0,        \
      "replicas (docs/OPERATIONS.md \"Replicas\"):")                                            \
    X(group, (SERVER, _, _, _, _), "--group", "LIST", NULL, STR, group, NULL, NULL, 1, 4096, _,   \
      PS_SET_BY_LAUNCH,                                                                          \
      "this server's shard group when it has replicas: the endpoints of its members in "         \
      "member order, EP|EP[|EP] (member 0 starts as its primary); needs --coord")                \
    X(member, (SERVER, _, _, _, _), "--member", "M", NULL, INT, member, "0", NULL, 0, 2, _,       \
      PS_SET_BY_LAUNCH, "which member of --group this server is")                                \
    X(coord, (SERVER, _, LAUNCH, _, _), "--coord", "URLS", NULL, STR, coord, NULL, NULL, 1, 900,  \
      _, 0,                                                                                      \
      "etcd's client endpoints, http://HOST:PORT[,...]: the coordination service through "       \
      "which the servers of a shard group decide who is its primary (needed with replicas)")     \
    X(job, (SERVER, _, LAUNCH, _, _), "--job", "NAME", NULL, STR, job, NULL, NULL, 1, 100, _, 0,  \
      "the job's name in etcd (its keys are /ps/NAME/...), one per running job; ps_launch "      \
      "picks a new one by default")                                                              \
    X(replicas, (_, _, LAUNCH, _, _), "--replicas", "R", NULL, INT, replicas, "0", NULL, 0, 2,    \
      _, 0,                                                                                      \
      "backups of every server's shard (chunks and table partitions), each a ps_server of its "  \
      "own (on other hosts when the hostfile has them): a push is acknowledged once every live " \
      "one holds it, and when a primary is lost one of them takes over; needs --coord")          \
    X(restart_workers, (_, _, LAUNCH, _, _), "--restart-workers", "N", NULL, INT,                \
      restart_workers, "10", NULL, 0, 100000, _, 0,                                              \
      "an elastic job (--workers MIN:MAX): start a new worker for one that died, at most N "      \
      "times in the job; it joins the running job where it is")                                  \
    X(restart_servers, (_, _, LAUNCH, _, _), "--restart-servers", "N", NULL, INT,                \
      restart_servers, "-1", NULL, -1, 100000, _, 0,                                             \
      "start a new server for one that died, at most N times in the job: with --replicas it "    \
      "copies its group's state from the primary while training goes on and becomes a "          \
      "replica; without, it restarts from its checkpoint (--restore; give --server-arg "          \
      "--checkpoint-dir=DIR) and the workers wait for it within --server-timeout.  -1 (the "     \
      "default): 10 with --replicas, else 0 (a lost server ends the job)")                        \
    X(failure_timeout, (SERVER, WORKER, LAUNCH, LIBPS, _), "--failure-timeout", "S",             \
      "PS_FAILURE_TIMEOUT", SECS, failure_timeout_ms, "1", NULL, 0, 3600, _, 0,                  \
      "with replicas: a primary, replica or worker connection silent this long (a closed one "   \
      "at once) is taken as lost; the group's primary is then decided again and workers move "   \
      "to it")                                                                                   \
    X(timeline_dir, (_, _, LAUNCH, _, _), "--timeline-dir", "DIR", NULL, STR, timeline_dir,      \
      NULL, NULL, 1, 900, _, 0,                                                                  \
      "each process writes Chrome trace events to DIR/server-i.json or "                         \
      "DIR/worker-i.json (DIR is created first); processes on one host share the clock, "        \
      "so Perfetto shows them together")                                                         \
    X(elastic_servers, (_, _, LAUNCH, _, _), "--elastic-servers", "", NULL, BOOL,               \
      elastic_servers, NULL, NULL, 0, 0, _, 0,                                                   \
      "servers may be added and removed while training goes on: every server gets a private "   \
      "admin token (its path in ps_launch's log), SIGUSR2 to ps_launch starts one more server "  \
      "and moves its share to it (ps_servers add), ps_servers remove takes one out; a job on "   \
      "this host without --replicas or elastic workers (docs/LAUNCH.md \"Servers added and "    \
      "removed\")")                                                                              \
    X(lch_metrics_port, (_, _, LAUNCH, _, _), "--metrics-port", "auto|off|P", NULL, STR,         \
      metrics_port, "auto", NULL, 1, 16, _, 0,                                                   \
      "Prometheus metrics of every process: ps_launch serves its own at P, server i at P+1+i, "  \
      "worker j at P+1+S+j (S servers), and prints where; auto: free ports on this host (with "  \
      "--hostfile, P = 29400); off: none (docs/OPERATIONS.md, Metrics)")                         \
    X(job_file, (_, _, LAUNCH, _, _), "--job-file", "FILE", NULL, STR, job_file, NULL, NULL, 1,  \
      900, _, 0,                                                                                 \
      "write the job's processes to FILE as they start: each one's role, rank, endpoint and "    \
      "/metrics address (ps_top --job FILE reads it), and the CURVE keys")                       \
    X(metrics_targets, (_, _, LAUNCH, _, _), "--metrics-targets", "FILE", NULL, STR,             \
      metrics_targets, NULL, NULL, 1, 900, _, 0,                                                 \
      "write the /metrics addresses to FILE as Prometheus file_sd targets with labels ps_job, "  \
      "role and ps_rank (examples/prometheus/)")                                                 \
    X(bin_dir, (_, _, LAUNCH, _, _), "--bin-dir", "DIR", NULL, STR, bin_dir, NULL, NULL, 1,      \
      900, _, 0, "where ps_server and ps_worker are (default: the directory of ps_launch)")      \
    X(server_arg, (_, _, LAUNCH, _, _), "--server-arg", "ARG", NULL, OWN, _, NULL, NULL, 0, 0,   \
      _, 0, "one more argument for every server; repeat it: --server-arg --max-memory "          \
      "--server-arg 2G")                                                                         \
    X(hostfile, (_, _, LAUNCH, _, _), "--hostfile", "FILE", NULL, STR, hostfile, NULL, NULL, 1,  \
      900, _, 0,                                                                                 \
      "run over ssh on the hosts of FILE, lines 'host [servers=N] [workers=M] [gpus=G]' "        \
      "(# comments); --servers and --workers may then be left out (docs/LAUNCH.md)")             \
    X(base_port, (_, _, LAUNCH, _, _), "--base-port", "P", NULL, INT, base_port, "29500", NULL,  \
      1, 65535, _, 0, "with --hostfile: server i listens on P+i")                                \
    X(ssh_opt, (_, _, LAUNCH, _, _), "--ssh-opt", "OPTS", NULL, OWN, _, NULL, NULL, 0, 0, _, 0,  \
      "with --hostfile: options for every ssh, split at spaces (repeat it), e.g. "               \
      "--ssh-opt '-p 2222 -i ~/.ssh/key'; PS_SSH replaces the ssh command itself")               \
    X(lch_shared, (_, _, LAUNCH, _, _), "", "", NULL, SHARED, _, NULL, NULL, 0, 0, _, 0,         \
      "the settings servers and workers must agree on: given to ps_launch (before -- or "        \
      "--exec) or among the worker flags, once, they go to the servers and to every "            \
      "worker; ps_launch checks their values first")                                             \
    X(exec, (_, _, LAUNCH, _, _), "--exec", "PROGRAM ARGS...", NULL, REST, _, NULL, NULL, 0, 0,  \
      _, 0,                                                                                      \
      "run PROGRAM ARGS as each worker instead of ps_worker (the rest of the command "           \
      "line; {rank} in ARGS becomes the rank).  It finds its settings in its environment:"       \
      " PS_SERVERS, PS_NUM_SERVERS, PS_RANK, PS_NUM_WORKERS, PS_MODE, PS_MAX_STALENESS, "        \
      "PS_DEVICE, PS_TIMELINE (with --timeline-dir), PS_METRICS_PORT (with metrics: a "          \
      "ps.Client serves there), and PS_<NAME> for each shared flag "                             \
      "given (--lr-decay-every: PS_LR_DECAY_EVERY)")                                             \
    X(dry_run, (_, _, LAUNCH, _, _), "--dry-run", "", NULL, BOOL, dry_run, NULL, NULL, 0, 0, _,  \
      0, "print the commands (and their hosts) and start nothing")                               \
    X(keygen_dir, (_, _, _, _, KEYGEN), "--dir", "DIR", NULL, STR, dir, NULL, NULL, 1, 900, _,  \
      0, "the key directory (required; created, mode 0700)")                                    \
    X(keygen_servers, (_, _, _, _, KEYGEN), "--servers", "S", NULL, INT, servers, NULL, NULL, 1, \
      PS_CURVE_MAX_KEYS, _, 0, "server key pairs (required)")                                   \
    X(keygen_workers, (_, _, _, _, KEYGEN), "--workers", "W", NULL, INT, workers, NULL, NULL, 1, \
      PS_CURVE_MAX_KEYS, _, 0, "worker key pairs (required)")                                   \
    X(force, (_, _, _, _, KEYGEN), "--force", "", NULL, BOOL, force, NULL, NULL, 0, 0, _, 0,     \
      "replace the keys already in DIR (all of them: keys of the earlier set, "                 \
      "authorized/*.pub included, are removed)")                                                 \
    X(top_servers, (_, _, _, _, TOP), "--servers", "LIST", NULL, STR, servers, NULL, NULL, 1,    \
      65536, _, 0,                                                                               \
      "the job's server endpoints, tcp://HOST:PORT[,...]: their counters come by STATS "         \
      "requests (over CURVE with --curve-keys)")                                                 \
    X(top_job, (_, _, _, _, TOP), "--job", "FILE", NULL, STR, job, NULL, NULL, 1, 900, _, 0,     \
      "the job file of ps_launch --job-file: the servers, their CURVE keys, and every "          \
      "process' /metrics address")                                                               \
    X(top_metrics, (_, _, _, _, TOP), "--metrics", "LIST", NULL, STR, metrics, NULL, NULL, 1,    \
      65536, _, 0,                                                                               \
      "more /metrics addresses to read, HOST:PORT[,...]: each a worker's or a server's "         \
      "(ps_worker --metrics-port); the workers' lines come from these")                          \
    X(top_curve_keys, (_, _, _, _, TOP), "--curve-keys", "DIR", NULL, STR, curve_dir, NULL,      \
      NULL, 1, 900, _, 0,                                                                        \
      "CURVE keys: the servers' public keys and the key ps_top speaks with (--key)")             \
    X(top_key, (_, _, _, _, TOP), "--key", "NAME", NULL, STR, key, "worker-0", NULL, 1, 200, _,  \
      0,                                                                                         \
      "with --curve-keys: DIR/NAME.key and DIR/NAME.pub, a pair whose public key the servers "   \
      "accept (in their authorized/): any such key may read the counters")                       \
    X(top_interval, (_, _, _, _, TOP), "--interval", "S", NULL, SECS, interval_ms, "1", NULL, 0, \
      3600, _, 0, "refresh every S seconds (rates are over it)")                                 \
    X(top_timeout, (_, _, _, _, TOP), "--timeout", "S", NULL, SECS, timeout_ms, "2", NULL, 0,    \
      3600, _, 0,                                                                                \
      "how long to wait for a server's STATS reply or a /metrics page; a process that does "     \
      "not answer is shown as such")                                                             \
    X(top_once, (_, _, _, _, TOP), "--once", "", NULL, BOOL, once, NULL, NULL, 0, 0, _, 0,       \
      "print one table (rates over one --interval) and exit: for scripts and CI logs")           \
    X(verbose, (SERVER, WORKER, _, _, _), "--verbose", "", NULL, LOG, _, NULL, NULL, 0,          \
      PS_LOG_DEBUG, _, 0, "log debug lines too")                                                 \
    X(quiet, (SERVER, WORKER, _, _, _), "--quiet", "", NULL, LOG, _, NULL, NULL, 0, PS_LOG_WARN, \
      _, 0, "log warnings and errors only")

/* Index of each row: PS_SET_mode, ... */
enum {
#define PS_SET_INDEX_(id, progs, flag, arg, env, type, field, def, choices, lo, hi, hello,   \
                      props, help)                                                          \
    PS_SET_##id,
    PS_SETTINGS(PS_SET_INDEX_)
#undef PS_SET_INDEX_
    PS_SET_N
};

/* One row, for code that walks the table. */
typedef struct ps_setting {
    const char *flag, *arg; /* "--mode", "sync|async" ("" for a flag without a value) */
    const char *env;        /* "PS_RANK SLURM_PROCID ..." (first set wins), or NULL */
    int type;               /* PS_SETTING_* */
    unsigned progs, props;  /* PS_PROG_* bits, PS_SET_* bits */
    const char *def, *choices;
    long long lo, hi;
    const char *hello;      /* wire key in the hello map, or NULL */
    const char *help;
} ps_setting;

const ps_setting *ps_setting_at(int id); /* 0 <= id < PS_SET_N, else NULL */

/* The row's name in messages: its flag without "--" ("max-staleness"). */
const char *ps_setting_name(const ps_setting *r);

/* The row a program takes with this flag ("--mode"; "--mode=x" too), or -1. */
int ps_setting_find(unsigned prog, const char *flag);

/* An ENUM row's name for value v (its first: "f32" for 1), or NULL; in a
 * buffer of the calling thread's, valid until its next call for that row. */
const char *ps_setting_choice_name(const ps_setting *r, long long v);

/* The values row r takes: [lo, hi] of an INT, SIZE, SECS or STR (length);
 * an ENUM's smallest and largest. */
void ps_setting_range(const ps_setting *r, long long *lo, long long *hi);

/* The row's default as a number (as ps_setting_parse_value gives it; a
 * RANGE's MAX); 0 when it has none. */
long long ps_setting_default(const ps_setting *r);

/* Parse text as row r takes it (its type and range) into *v (a number; an
 * ENUM's value; SECS in ms) or, for STR, check it.  what names it in the
 * message: "<prog>: <what> must be ..., got '<text>'".  0 or PS_EINVAL. */
int ps_setting_parse_value(const char *prog, const char *what, const ps_setting *r,
                           const char *text, long long *v, char *why, size_t len);

/* ------------------------------------------------------------ fields */

/* Where a program keeps a row's value: a field of its config struct. */
typedef struct ps_setting_field {
    int id;
    size_t off, size;
    size_t off_min, size_min; /* RANGE: where MIN goes (size_min 0: elsewhere none) */
} ps_setting_field;

/* The fields of program P's rows (P: SERVER, WORKER, LAUNCH, LIBPS, KEYGEN
 * or TOP) in its config struct, as an initializer list, in the one file that
 * knows the struct:
 *   static const ps_setting_field fields[] = {PS_SETTING_FIELDS(SERVER)};
 * A row the struct has no field for does not compile. */
#define PS_SETTING_FIELDS(P) PS_SETTINGS(PS_SET_FIELD_##P)
#define PS_SET_FIELD_SERVER(id, progs, flag, arg, env, type, field, ...)                    \
    PS_SETTING_BIND(SERVER, ps_server_config, progs, type, id, field)
#define PS_SET_FIELD_WORKER(id, progs, flag, arg, env, type, field, ...)                    \
    PS_SETTING_BIND(WORKER, ps_train_config, progs, type, id, field)
#define PS_SET_FIELD_LAUNCH(id, progs, flag, arg, env, type, field, ...)                    \
    PS_SETTING_BIND(LAUNCH, ps_launch_opts, progs, type, id, field)
#define PS_SET_FIELD_LIBPS(id, progs, flag, arg, env, type, field, ...)                     \
    PS_SETTING_BIND(LIBPS, ps_client_options, progs, type, id, field)
#define PS_SET_FIELD_KEYGEN(id, progs, flag, arg, env, type, field, ...)                    \
    PS_SETTING_BIND(KEYGEN, ps_keygen_opts, progs, type, id, field)
#define PS_SET_FIELD_TOP(id, progs, flag, arg, env, type, field, ...)                       \
    PS_SETTING_BIND(TOP, ps_top_opts, progs, type, id, field)

/* The entry of a row for program P in struct T, followed by a comma;
 * nothing when P does not take the row or the row has no field. */
#define PS_SETTING_BIND(P, T, progs, type, id, field)                                      \
    PS_SET_IF_IN(P, progs)(PS_SET_IF_FIELD_##type(                                          \
        {PS_SET_##id, offsetof(T, field), sizeof(((T *)0)->field) PS_SET_MIN_##type(T, field)}, ))

/* Set every field of program prog's rows (fields[0..n)) in cfg to its
 * default; the rest of cfg is left alone. */
void ps_settings_defaults(unsigned prog, const ps_setting_field *fields, int n, void *cfg);

/* Read field f of cfg as a number (a STR's pointer as 0 / 1: set or not; a
 * RANGE's MAX); set a number field (a RANGE's from ps_setting_parse_value's
 * number: MIN and MAX, MIN only where f has a field for it). */
long long ps_setting_field_get(const ps_setting_field *f, const void *cfg);
void ps_setting_field_set(const ps_setting_field *f, void *cfg, long long v);

/* The same for the rows with a hello key, in ps_hello (proto/). */
#define PS_SETTING_HELLO_FIELDS PS_SETTINGS(PS_SET_FIELD_HELLO)
#define PS_SET_FIELD_HELLO(id, progs, flag, arg, env, type, field, def, choices, lo, hi, hello, \
                           ...)                                                             \
    PS_SET_IF_HELLO_##hello(                                                                \
        {PS_SET_##id, offsetof(ps_hello, field), sizeof(((ps_hello *)0)->field), 0, 0}, )

/* ------------------------------------------------------------ command lines */

typedef struct ps_settings_cmd {
    /* in */
    const char *prog;       /* "ps_server": messages start with it */
    unsigned program;       /* PS_PROG_SERVER, _WORKER or _LAUNCH */
    void *cfg;              /* the program's config, where fields point */
    const ps_setting_field *fields;
    int nfields;
    ps_opt_config *opt;     /* where the optimizer's flags go; NULL: not taken */
    int shared;             /* ps_launch: the PS_SET_SHARED rows and the optimizer's
                               flags are taken as text, to own() with id -1 */
    int dashdash;           /* "--" ends the flags (then next is after it) */
    int env;                /* rows not given take their variables' value */
    const char *hint;       /* after "unknown flag 'x' (see --help" */
    /* OWN rows, and with shared, the shared ones: 0 or PS_EINVAL with why set */
    int (*own)(void *ctx, int id, const char *flag, const char *val, char *why, size_t len);
    void *ctx;
    /* out */
    int next;               /* argv index after the flags taken */
    int rest;               /* a REST row: argv index of its first word; else 0 */
    int help;               /* 1 --help or -h, 2 --version, 3 --help-markdown: parsing
                               stopped there (ps_settings_print_help) */
    int log_level;          /* PS_LOG_INFO, or what --verbose / --quiet said */
    const char *from[PS_SET_N]; /* where a row's value came from: its flag, the
                                   variable (in vars), or NULL (the default) */
    unsigned opt_from;      /* the optimizer's flags given (flag or variable): bit i
                               for ps_opt_flag_names()[i] */
    char vars[PS_SET_N][32];
} ps_settings_cmd;

/* Parse argv[1..] as c->program takes it (the defaults must be in c->cfg
 * already): "--flag value" and "--flag=value", later flags winning; stops at
 * --help / -h / --version / --help-markdown, a REST row, or "--" with
 * dashdash.  PS_EINVAL with one line in why for an unknown flag or an
 * argument that is not one, a missing value, a value the row refuses (as
 * ps_setting_parse_value says it, naming the variable for a value from the
 * environment), or what own() refuses; then exit 2. */
int ps_settings_parse(ps_settings_cmd *c, int argc, char **argv, char *why, size_t len);

/* What --help prints between a program's head and tail text: every row of
 * the program in table order, "  --flag ARG  help (default D)" wrapped to 80
 * columns; a worker's rows name their variables. */
void ps_settings_usage(FILE *f, unsigned prog);

/* The program's section of README.md: a "| flag | meaning (default) |"
 * table of the same rows (make readme-flags writes it; tests compare). */
void ps_settings_markdown(FILE *f, unsigned prog);

/* After parsing, help as ps_settings_cmd.help says: 1 (--help) prints
 * head, the rows of prog and tail; 2 (--version) "<name> <version>"; 3
 * (--help-markdown) the README section. */
void ps_settings_print_help(const char *name, unsigned prog, int help, const char *head,
                            const char *tail);

/* Index of flag (up to '=') among ps_opt_flag_names(), or -1. */
int ps_settings_opt_index(const char *flag);

/* The rows ps_launch gives servers and workers alike (PS_SET_SHARED), then
 * the optimizer's flags: the i-th flag (i from 0), NULL past the last. */
const char *ps_settings_shared_flag(int i);

/* The variable a worker finds an optimizer flag in: "--lr-decay-every" ->
 * "PS_LR_DECAY_EVERY" (written to out, len bytes). */
void ps_settings_opt_env(const char *flag, char *out, size_t len);

/* ---- the preprocessor side of the columns (used by the macros above) ---- */
#define PS_SET_KEEP(...) __VA_ARGS__
#define PS_SET_DROP(...)
#define PS_SET_CAT_(a, b) a##b
#define PS_SET_CAT(a, b) PS_SET_CAT_(a, b)
#define PS_SET_PICK_SERVER(s, w, l, c, k) s
#define PS_SET_PICK_WORKER(s, w, l, c, k) w
#define PS_SET_PICK_LAUNCH(s, w, l, c, k) l
#define PS_SET_PICK_LIBPS(s, w, l, c, k) c
/* the last column is the tool's: KEYGEN or TOP (or _) */
#define PS_SET_PICK_KEYGEN(s, w, l, c, k) PS_SET_CAT(PS_SET_IS_KEYGEN_, k)
#define PS_SET_PICK_TOP(s, w, l, c, k) PS_SET_CAT(PS_SET_IS_TOP_, k)
#define PS_SET_IS_KEYGEN_KEYGEN KEYGEN
#define PS_SET_IS_KEYGEN_TOP _
#define PS_SET_IS_KEYGEN__ _
#define PS_SET_IS_TOP_TOP TOP
#define PS_SET_IS_TOP_KEYGEN _
#define PS_SET_IS_TOP__ _
#define PS_SET_IF_SERVER PS_SET_KEEP
#define PS_SET_IF_WORKER PS_SET_KEEP
#define PS_SET_IF_LAUNCH PS_SET_KEEP
#define PS_SET_IF_LIBPS PS_SET_KEEP
#define PS_SET_IF_KEYGEN PS_SET_KEEP
#define PS_SET_IF_TOP PS_SET_KEEP
#define PS_SET_IF__ PS_SET_DROP
/* PS_SET_IF_IN(P, progs)(x...): x when P is in progs */
#define PS_SET_IF_IN(P, progs) PS_SET_CAT(PS_SET_IF_, PS_SET_PICK_##P progs)
#define PS_SET_BIT_SERVER PS_PROG_SERVER
#define PS_SET_BIT_WORKER PS_PROG_WORKER
#define PS_SET_BIT_LAUNCH PS_PROG_LAUNCH
#define PS_SET_BIT_LIBPS PS_PROG_LIBPS
#define PS_SET_BIT_KEYGEN PS_PROG_KEYGEN
#define PS_SET_BIT_TOP PS_PROG_TOP
#define PS_SET_BIT__ 0u
#define PS_SET_PROGS(s, w, l, c, k)                                                         \
    (PS_SET_BIT_##s | PS_SET_BIT_##w | PS_SET_BIT_##l | PS_SET_BIT_##c | PS_SET_BIT_##k)
#define PS_SET_IF_FIELD_INT PS_SET_KEEP
#define PS_SET_IF_FIELD_SIZE PS_SET_KEEP
#define PS_SET_IF_FIELD_SECS PS_SET_KEEP
#define PS_SET_IF_FIELD_ENUM PS_SET_KEEP
#define PS_SET_IF_FIELD_STR PS_SET_KEEP
#define PS_SET_IF_FIELD_BOOL PS_SET_KEEP
#define PS_SET_IF_FIELD_OWN PS_SET_DROP
#define PS_SET_IF_FIELD_LOG PS_SET_DROP
#define PS_SET_IF_FIELD_REST PS_SET_DROP
#define PS_SET_IF_FIELD_OPT PS_SET_DROP
#define PS_SET_IF_FIELD_SHARED PS_SET_DROP
#define PS_SET_IF_FIELD_HEAD PS_SET_DROP
#define PS_SET_IF_FIELD_RANGE PS_SET_KEEP
/* a RANGE row's MIN field (field##_min) in the binding; nothing for the others */
#define PS_SET_MIN_RANGE(T, f) , offsetof(T, f##_min), sizeof(((T *)0)->f##_min)
#define PS_SET_MIN_INT(T, f) , 0, 0
#define PS_SET_MIN_SIZE(T, f) , 0, 0
#define PS_SET_MIN_SECS(T, f) , 0, 0
#define PS_SET_MIN_ENUM(T, f) , 0, 0
#define PS_SET_MIN_STR(T, f) , 0, 0
#define PS_SET_MIN_BOOL(T, f) , 0, 0
#define PS_SET_MIN_OWN(T, f) , 0, 0
#define PS_SET_MIN_LOG(T, f) , 0, 0
#define PS_SET_MIN_REST(T, f) , 0, 0
#define PS_SET_MIN_OPT(T, f) , 0, 0
#define PS_SET_MIN_SHARED(T, f) , 0, 0
#define PS_SET_MIN_HEAD(T, f) , 0, 0
/* the hello column: PS_SET_IF_HELLO_##hello(x...) is x for HELLO("key") rows,
 * PS_SET_HELLO_KEY_##hello their key (NULL for _) */
#define PS_SET_IF_HELLO_HELLO(key) PS_SET_KEEP
#define PS_SET_IF_HELLO__ PS_SET_DROP
#define PS_SET_HELLO_KEY_HELLO(key) key
#define PS_SET_HELLO_KEY__ NULL

#endif
