/* The layout of libps's public structs as this compiler lays them out, one
 * "struct.field offset size" line each (a struct's own line: its size), and
 * the optimizer table's rows in order.  python/ps mirrors these structs with
 * ctypes; tests/python/test_client.py runs this program and compares, so a
 * field added to include/ps_client.h or ps_types.h cannot silently shift the
 * Python side.  Built with -Iinclude alone, like any user of the headers. */
#include <stddef.h>
#include <stdio.h>

#include "ps_client.h"

#define STRUCT(s) printf(#s " %zu\n", sizeof(s))
#define FIELD(s, f) printf(#s "." #f " %zu %zu\n", offsetof(s, f), sizeof(((s *)0)->f))

int main(void)
{
    STRUCT(ps_request);
    FIELD(ps_request, status);
    FIELD(ps_request, version);
    FIELD(ps_request, done_ns);
    FIELD(ps_request, err);
    FIELD(ps_request, _priv);

    STRUCT(ps_opt_config);
    FIELD(ps_opt_config, kind);
#define OPT_FIELD_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help) FIELD(ps_opt_config, f);
    PS_OPT_PARAMS(OPT_FIELD_)
#undef OPT_FIELD_
    FIELD(ps_opt_config, given);

    STRUCT(ps_client_options);
    FIELD(ps_client_options, servers);
    FIELD(ps_client_options, rank);
    FIELD(ps_client_options, num_workers);
    FIELD(ps_client_options, mode);
    FIELD(ps_client_options, max_staleness);
    FIELD(ps_client_options, chunk_bytes);
    FIELD(ps_client_options, expect);
    FIELD(ps_client_options, hello_timeout_ms);
    FIELD(ps_client_options, request_timeout_ms);
    FIELD(ps_client_options, curve_dir);
    FIELD(ps_client_options, heartbeat_ms);
    FIELD(ps_client_options, shm);
    FIELD(ps_client_options, shm_bytes);
    FIELD(ps_client_options, server_timeout_ms);
    FIELD(ps_client_options, admin_token);
    FIELD(ps_client_options, on_nonfinite);
    FIELD(ps_client_options, metrics_port);
    FIELD(ps_client_options, metrics_bind);

    STRUCT(ps_table_options);
    FIELD(ps_table_options, dim);
    FIELD(ps_table_options, init);
    FIELD(ps_table_options, init_scale);
    FIELD(ps_table_options, seed);
    FIELD(ps_table_options, opt);
    FIELD(ps_table_options, ftrl_beta);
    FIELD(ps_table_options, ftrl_l1);
    FIELD(ps_table_options, ftrl_l2);
    FIELD(ps_table_options, max_rows);
    FIELD(ps_table_options, min_count);
    FIELD(ps_table_options, filter_cells);
    FIELD(ps_table_options, full);

    STRUCT(ps_barrier_info);
    FIELD(ps_barrier_info, id);
    FIELD(ps_barrier_info, missing);
    FIELD(ps_barrier_info, nranks);
    FIELD(ps_barrier_info, ranks);

    STRUCT(ps_stats);
#define STATS_FIELD_(f, key) FIELD(ps_stats, f);
    PS_STATS_COUNTERS(STATS_FIELD_)
#undef STATS_FIELD_
    FIELD(ps_stats, min_version);
    FIELD(ps_stats, max_version);

    /* the optimizer table: index, field, flag, default, whether an integer */
#define OPT_ROW_(f, t, key, flag, def, lo, lob, hi, hib, used, zu, help)                       \
    printf("opt_param %d %s %s %.9g %d\n", PS_OPT_P_##f, #f, flag, (double)(def),               \
           (int)((t)0.5 == 0));
    PS_OPT_PARAMS(OPT_ROW_)
#undef OPT_ROW_
    printf("opt_kinds %d %d %d %d %d %d %d %d %d\n", PS_OPT_NONE, PS_OPT_SGD, PS_OPT_MOMENTUM,
           PS_OPT_NESTEROV, PS_OPT_ADAGRAD, PS_OPT_ADAM, PS_OPT_AVERAGE, PS_OPT_ADD, PS_OPT_ADAMW);
    printf("modes %d %d\n", PS_MODE_SYNC, PS_MODE_ASYNC);
    printf("table_inits %d %d %d ftrl %d rowwise_adagrad %d\n", PS_TABLE_INIT_ZEROS,
           PS_TABLE_INIT_UNIFORM, PS_TABLE_INIT_NORMAL, PS_TABLE_OPT_FTRL,
           PS_TABLE_OPT_ROWWISE_ADAGRAD);
#define ERR_ROW_(name, value, text) printf("error %s %d\n", #name, value);
    PS_ERRORS(ERR_ROW_)
#undef ERR_ROW_
    printf("err_text_max %d\n", PS_ERR_TEXT_MAX);
    return 0;
}
