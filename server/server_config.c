/* The pure functions of server.h: the configuration's defaults and checks,
 * and which update thread owns a chunk.  No state, no threads. */
#include "server.h"

#include <stdio.h>
#include <string.h>

#include "ps_error.h"
#include "ps_shm.h"
#include "ps_smap.h"

int ps_server_owner(uint64_t key, uint32_t chunk, int threads)
{
    uint64_t x = key * 0x9e3779b97f4a7c15ull ^ ((uint64_t)chunk + 0x632be59bd9b4e019ull);
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return threads > 1 ? (int)(x % (uint64_t)threads) : 0;
}

int ps_server_away_owner(int home, uint32_t part, int threads)
{
    return threads > 1 ? (int)(((uint64_t)(uint32_t)home + part) % (uint64_t)threads) : 0;
}

/* Where each of ps_server's settings (common/ps_settings.h) lives. */
static const ps_setting_field fields[] = {PS_SETTING_FIELDS(SERVER)};

const ps_setting_field *ps_server_config_fields(int *n)
{
    *n = (int)(sizeof fields / sizeof fields[0]);
    return fields;
}

uint64_t ps_server_auto_memory(uint64_t *avail)
{
    *avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kb;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            *avail = (uint64_t)kb * 1024;
            break;
        }
    if (f)
        fclose(f);
    if (!*avail)
        return PS_SERVER_DEFAULT_MAX_MEMORY;
    return *avail / 2 > (64ull << 20) ? *avail / 2 : 64ull << 20;
}

uint64_t ps_server_worker_share(const ps_server_config *c)
{
    if (c->table_memory_per_worker)
        return c->table_memory_per_worker;
    uint64_t w = c->num_workers > 0 ? (uint64_t)c->num_workers : 1;
    uint64_t share = c->max_memory / w + c->max_memory / w / 4;
    return share > c->max_memory ? c->max_memory : share;
}

void ps_server_config_default(ps_server_config *c)
{
    memset(c, 0, sizeof *c);
    ps_settings_defaults(PS_PROG_SERVER, fields, (int)(sizeof fields / sizeof fields[0]), c);
    uint64_t avail;
    c->max_memory = ps_server_auto_memory(&avail);
    if (c->mode == PS_MODE_SYNC) /* sync is staleness 0 */
        c->max_staleness = 0;
    ps_opt_default(&c->opt);
}

int ps_server_config_check(const ps_server_config *c, char *why, size_t why_len)
{
#define BAD(...) do { ps_errorf(why, why_len, __VA_ARGS__); return PS_EINVAL; } while (0)
    if (!c->bind || !*c->bind || strlen(c->bind) >= 256)
        BAD("bind endpoint is missing or longer than 255 characters");
    if (c->num_servers < 1 || c->num_servers > PS_MAX_SERVERS)
        BAD("num-servers must be in [1, %d], got %d", PS_MAX_SERVERS, c->num_servers);
    if (!c->added && (c->rank < 0 || c->rank >= c->num_servers))
        BAD("rank must be in [0, num-servers - 1 = %d], got %d", c->num_servers - 1, c->rank);
    if (c->added && (c->rank < c->num_servers || c->rank >= PS_SMAP_MAX_SLOTS))
        BAD("an added server's rank is its slot in the job: one no server of the job has had, "
            "in [num-servers = %d, %d], got %d", c->num_servers, PS_SMAP_MAX_SLOTS - 1, c->rank);
    if (c->num_workers < 1 || c->num_workers > PS_MAX_WORKERS)
        BAD("num-workers must be in [1, %d], got %d", PS_MAX_WORKERS, c->num_workers);
    if (c->num_workers_min < 0 || c->num_workers_min > c->num_workers)
        BAD("num-workers MIN:MAX needs 1 <= MIN <= MAX, got %d:%d", c->num_workers_min,
            c->num_workers);
    if (c->mode != PS_MODE_SYNC && c->mode != PS_MODE_ASYNC)
        BAD("mode must be sync or async");
    if (c->mode == PS_MODE_SYNC && c->max_staleness != 0)
        BAD("max-staleness must be 0 in sync mode, got %d", c->max_staleness);
    if (c->max_staleness < -1 || c->max_staleness > PS_MAX_STALENESS)
        BAD("max-staleness must be in [-1, %d], got %d", PS_MAX_STALENESS, c->max_staleness);
    ps_opt_config full = c->opt;
    full.given = PS_OPT_GIVEN_ALL; /* a server's settings are complete: check them all */
    if (ps_opt_check(&full, 0, why, why_len))
        return PS_EINVAL;
    if (c->opt.kind == PS_OPT_AVERAGE && c->mode != PS_MODE_SYNC)
        BAD("optimizer average needs --mode sync (it averages a round's pushes); async "
            "workers that step their own optimizers push weight deltas: --optimizer add");
    if (c->threads < 1 || c->threads > PS_SERVER_MAX_THREADS)
        BAD("threads must be in [1, %d], got %d", PS_SERVER_MAX_THREADS, c->threads);
    if (c->max_memory < 1)
        BAD("max-memory must be at least 1 byte");
    if (c->max_tables < 1)
        BAD("max-tables must be at least 1, got %d", c->max_tables);
    if (c->max_peer_replies < 1)
        BAD("max-peer-replies must be at least 1");
    if (c->checkpoint_every < 0 || c->checkpoint_every_ms < 0)
        BAD("checkpoint-every must be positive");
    if ((c->checkpoint_every || c->checkpoint_every_ms || c->restore) &&
        (!c->checkpoint_dir || !*c->checkpoint_dir))
        BAD("checkpoint-every and restore need a checkpoint directory (--checkpoint-dir)");
    if (c->import_dir && c->restore)
        BAD("import and restore together: a restarted server restores its checkpoint (drop "
            "--import), a new job starts from the export (drop --restore)");
    if (c->import_state != PS_IMPORT_KEEP && c->import_state != PS_IMPORT_RESET)
        BAD("import-state must be keep or reset");
    if (c->worker_timeout_ms < 0)
        BAD("worker-timeout must be >= 0, got %d ms", c->worker_timeout_ms);
    if (c->on_worker_loss != PS_LOSS_WAIT && c->on_worker_loss != PS_LOSS_DROP)
        BAD("on-worker-loss must be wait or drop");
    if (ps_dtype_size(c->wire_dtype) == 0)
        BAD("wire-dtype must be f32, bf16 or f16");
    if (c->shm != PS_SHM_OFF && c->shm != PS_SHM_AUTO)
        BAD("shm must be auto or off");
    uint32_t users[PS_SHM_MAX_USERS];
    int nusers;
    char uwhy[160];
    if (ps_shm_parse_users(c->shm_users, users, &nusers, uwhy, sizeof uwhy))
        BAD("%s", uwhy);
    if (c->on_checkpoint_failure < PS_CKPT_FAIL_STALL ||
        c->on_checkpoint_failure > PS_CKPT_FAIL_EXIT)
        BAD("on-checkpoint-failure must be stall, continue or exit");
    if (c->on_worker_loss == PS_LOSS_DROP && c->worker_timeout_ms == 0)
        BAD("on-worker-loss drop needs a worker timeout (--worker-timeout)");
    if (c->group && !c->coord)
        BAD("--group needs --coord: the etcd endpoints through which the group's members "
            "decide who is its primary");
    if (c->group && (c->member < 0 || c->member > 2))
        BAD("member must be 0, 1 or 2, got %d", c->member);
    if (c->failure_timeout_ms < 0)
        BAD("failure-timeout must be >= 0");
    return 0;
#undef BAD
}
