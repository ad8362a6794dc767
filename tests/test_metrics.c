/* Prometheus metrics: the registry's text format (metrics/ps_metrics.c), the
 * exporter (metrics/ps_metrics_http.c), ps_top's reading of a page
 * (tools/top_source.c), and a ps_server on a thread of this process with
 * --metrics-port: its counters, and that a scrape stopped in the middle
 * holds nothing the update path waits for. */
#include <curl/curl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_client.h"
#include "ps_error.h"
#include "ps_log.h"
#include "ps_metrics.h"
#include "ps_metrics_http.h"
#include "ps_test.h"
#include "ps_test_server.h"
#include "server.h"
#include "top_source.h"
#include "top_view.h"

/* ---------------------------------------------------------------- the format */

static void sample_families(void *user, ps_metrics_out *o)
{
    const ps_metrics_hist *h = user;
    char lab[128] = "";
    ps_metrics_label(lab, sizeof lab, "rank", "3");
    ps_metrics_label(lab, sizeof lab, "table", "a\"b\\c\nd");
    ps_metrics_family(o, "t_things_total", PS_METRIC_COUNTER, "Things.\nTwo lines \\ one.");
    ps_metrics_sample_u64(o, lab, 18446744073709551615ull);
    ps_metrics_family(o, "t_level", PS_METRIC_GAUGE, "A level.");
    ps_metrics_sample(o, "", 0.25);
    ps_metrics_sample(o, "k=\"nan\"", 0.0 / 0.0);
    ps_metrics_sample(o, "k=\"inf\"", 1.0 / 0.0);
    ps_metrics_family(o, "t_wait_seconds", PS_METRIC_HISTOGRAM, "Waits.");
    const ps_metrics_hist *hs[2] = {h, h};
    ps_metrics_sample_hist(o, "rank=\"3\"", hs, 2);
}

PS_TEST(exposition_is_prometheus_text_with_escaped_labels_and_cumulative_buckets)
{
    ps_metrics *m = ps_metrics_create();
    CHECK(m != NULL);
    ps_metrics_hist h;
    memset(&h, 0, sizeof h);
    ps_metrics_hist_observe(&h, 50000);         /* 50 us: the first bucket */
    ps_metrics_hist_observe(&h, 100000);        /* 100 us: on the bound, still the first */
    ps_metrics_hist_observe(&h, 3000000);       /* 3 ms: le 0.005 */
    ps_metrics_hist_observe(&h, 20000000000LL); /* 20 s: only +Inf */
    CHECK_OK(ps_metrics_add(m, sample_families, &h));
    ps_strbuf b = {0};
    CHECK_OK(ps_metrics_render(m, &b));
    const char *t = ps_strbuf_str(&b);
    /* the process' own families come first */
    CHECK(strncmp(t, "# HELP process_start_time_seconds ", 34) == 0);
    CHECK(strstr(t, "ps_build_info{version=\"" PS_VERSION "\"} 1\n") != NULL);
    const char *want =
        "# HELP t_things_total Things.\\nTwo lines \\\\ one.\n"
        "# TYPE t_things_total counter\n"
        "t_things_total{rank=\"3\",table=\"a\\\"b\\\\c\\nd\"} 18446744073709551615\n"
        "# HELP t_level A level.\n"
        "# TYPE t_level gauge\n"
        "t_level 0.25\n"
        "t_level{k=\"nan\"} NaN\n"
        "t_level{k=\"inf\"} +Inf\n"
        "# HELP t_wait_seconds Waits.\n"
        "# TYPE t_wait_seconds histogram\n"
        "t_wait_seconds_bucket{rank=\"3\",le=\"0.0001\"} 4\n"
        "t_wait_seconds_bucket{rank=\"3\",le=\"0.00025\"} 4\n"
        "t_wait_seconds_bucket{rank=\"3\",le=\"0.0005\"} 4\n"
        "t_wait_seconds_bucket{rank=\"3\",le=\"0.001\"} 4\n"
        "t_wait_seconds_bucket{rank=\"3\",le=\"0.0025\"} 4\n"
        "t_wait_seconds_bucket{rank=\"3\",le=\"0.005\"} 6\n";
    const char *at = strstr(t, "# HELP t_things_total");
    CHECK_MSG(at && strncmp(at, want, strlen(want)) == 0, "got:\n%s", t);
    CHECK(strstr(t, "t_wait_seconds_bucket{rank=\"3\",le=\"10.0\"} 6\n"
                    "t_wait_seconds_bucket{rank=\"3\",le=\"+Inf\"} 8\n"
                    "t_wait_seconds_sum{rank=\"3\"} 40.0063\n"
                    "t_wait_seconds_count{rank=\"3\"} 8\n") != NULL);
    /* a removed collector is not called again */
    ps_metrics_remove(m, &h);
    ps_strbuf_reset(&b);
    CHECK_OK(ps_metrics_render(m, &b));
    CHECK(strstr(ps_strbuf_str(&b), "t_level") == NULL);
    ps_strbuf_free(&b);
    ps_metrics_destroy(m);
}

PS_TEST(a_label_set_that_does_not_fit_is_left_out_whole)
{
    char lab[24] = "";
    ps_metrics_label(lab, sizeof lab, "rank", "12");
    CHECK_STR(lab, "rank=\"12\"");
    ps_metrics_label(lab, sizeof lab, "table", "a-long-name");
    CHECK_STR(lab, "rank=\"12\"");
}

/* ---------------------------------------------------------------- the exporter */

static long http_status(const char *url)
{
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    long code = -1;
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    return code;
}

PS_TEST(exporter_serves_metrics_on_loopback_and_says_why_a_port_is_taken)
{
    ps_metrics *m = ps_metrics_create();
    ps_metrics_http *h = NULL, *h2 = NULL;
    char why[512] = "", target[64], url[128];
    CHECK_OK(ps_metrics_http_start(m, NULL, 0, &h, why, sizeof why));
    int port = ps_metrics_http_port(h);
    CHECK(port > 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
    CHECK_STR(ps_metrics_http_url(h), url);
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    ps_strbuf page = {0};
    CHECK_OK(ps_top_scrape(target, 5000, &page, why, sizeof why));
    CHECK(strstr(ps_strbuf_str(&page), "# TYPE process_start_time_seconds gauge\n") != NULL);
    CHECK_EQ_INT((int)ps_metrics_http_scrapes(h), 1);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/other", port);
    CHECK_EQ_INT((int)http_status(url), 404);
    /* a second exporter on the port: refused, naming the address */
    CHECK_EQ_INT(ps_metrics_http_start(m, "127.0.0.1", port, &h2, why, sizeof why), PS_EIO);
    CHECK(h2 == NULL);
    CHECK_MSG(strstr(why, "cannot listen on 127.0.0.1:") && strstr(why, "in use"), "%s", why);
    CHECK_EQ_INT(ps_metrics_http_start(m, "no.such.host.invalid", 0, &h2, why, sizeof why),
                 PS_EINVAL);
    CHECK_MSG(strstr(why, "--metrics-bind no.such.host.invalid") != NULL, "%s", why);
    ps_metrics_http_stop(h);
    /* stopped: nothing listens there any more */
    CHECK(ps_top_scrape(target, 2000, &page, why, sizeof why) == PS_EIO);
    ps_strbuf_free(&page);
    ps_metrics_destroy(m);
}

PS_TEST(a_page_is_read_by_name_summing_series_and_labels_with_braces)
{
    const char *page = "# HELP x_total X.\n"
                       "# TYPE x_total counter\n"
                       "x_total{rank=\"0\",t=\"a}b\\\"c\"} 3\n"
                       "x_total{rank=\"1\"} 4.5\n"
                       "x_total_more 100\n"
                       "x 7\n"
                       "y{rank=\"7\",mode=\"sync\"} +Inf\n";
    int n;
    CHECK(ps_top_metric(page, "x_total", &n) == 7.5 && n == 2);
    CHECK(ps_top_metric(page, "x", &n) == 7 && n == 1);
    CHECK(ps_top_metric(page, "z", &n) == 0 && n == 0);
    char buf[32];
    CHECK_STR(ps_top_metric_label(page, "x_total", "t", buf, sizeof buf), "a}b\"c");
    CHECK_STR(ps_top_metric_label(page, "y", "mode", buf, sizeof buf), "sync");
    CHECK_STR(ps_top_metric_label(page, "y", "none", buf, sizeof buf), "");
}

PS_TEST(top_lines_are_sorted_slowest_first_with_rates_over_the_interval)
{
    ps_top_proc p[3];
    memset(p, 0, sizeof p);
    for (int i = 0; i < 3; i++) {
        p[i].role = PS_TOP_WORKER;
        p[i].rank = i;
        snprintf(p[i].target, sizeof p[i].target, "h:%d", 9000 + i);
        for (int k = 0; k < 2; k++) {
            ps_top_sample s;
            memset(&s, 0, sizeof s);
            s.t = 10.0 + 2.0 * k;
            s.metrics_ok = 1;
            /* worker 1 the slowest: 100 samples/s; 0: 400; 2 does not answer */
            s.m[PS_TOP_M_samples] = (i == 1 ? 100.0 : 400.0) * 2.0 * k;
            s.m[PS_TOP_M_steps] = 10.0 * k;
            s.m[PS_TOP_M_wait] = 0.5 * k;
            for (int j = 0; j < PS_TOP_NM; j++)
                s.has[j] = 1;
            ps_top_push_sample(&p[i], &s);
        }
    }
    snprintf(p[2].err, sizeof p[2].err, "h:9002: Couldn't connect to server");
    ps_strbuf b = {0};
    ps_top_render(p, 3, "title", &b);
    const char *t = ps_strbuf_str(&b);
    const char *w2 = strstr(t, "worker 2"), *w1 = strstr(t, "worker 1"),
               *w0 = strstr(t, "worker 0");
    CHECK_MSG(w2 && w1 && w0 && w2 < w1 && w1 < w0, "%s", t);
    CHECK(strstr(w2, "no answer: h:9002: Couldn't connect") != NULL);
    /* 100 samples/s, 5 steps/s, comm-wait 0.5 s over 2 s: 25% */
    CHECK_MSG(strstr(w1, "        100      5.0       25.0") != NULL, "%s", w1);
    CHECK(strstr(t, "(no servers)") != NULL);
    ps_strbuf_free(&b);
}

/* ---------------------------------------------------------------- a live server */

/* A server on a thread of this process with its metrics on mport. */
typedef struct isrv {
    ps_test_isrv t;
    ps_server *s;
    int port, mport;
} isrv;

static int isrv_start(isrv *v, int mode, int num_workers)
{
    v->mport = ps_test_free_port();
    int rc = ps_test_isrv_start(&v->t, mode, num_workers, -1, 0.5f, v->mport);
    v->s = v->t.s;
    v->port = v->t.port;
    return rc;
}

static void isrv_stop(isrv *v) { ps_test_isrv_stop(&v->t); }

/* The value of `name` on the server's page (-1: no such sample). */
static double scraped(const isrv *v, const char *name)
{
    char target[64], why[256];
    snprintf(target, sizeof target, "127.0.0.1:%d", v->mport);
    ps_strbuf page = {0};
    double x = -1;
    int n;
    if (ps_top_scrape(target, 5000, &page, why, sizeof why) == 0) {
        x = ps_top_metric(ps_strbuf_str(&page), name, &n);
        if (!n)
            x = -1;
    }
    ps_strbuf_free(&page);
    return x;
}

enum { N = 64 };

PS_TEST(server_page_counts_sync_rounds_pushes_and_bytes_as_stats_does)
{
    isrv v;
    CHECK_OK(isrv_start(&v, PS_MODE_SYNC, 2));
    void *d[2] = {ps_test_dealer(v.port), ps_test_dealer(v.port)};
    CHECK_OK(ps_test_hello(d[0], 0, PS_MODE_SYNC, 2, 0));
    CHECK_OK(ps_test_hello(d[1], 1, PS_MODE_SYNC, 2, 0));
    float w[N] = {0}, g[N];
    for (int i = 0; i < N; i++)
        g[i] = 0.01f * (float)i;
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 5, 0, 0), r;
    h.total = N;
    CHECK_OK(ps_test_rpc(d[0], &h, w, N, &r, NULL, 0, NULL));
    enum { ROUNDS = 3 };
    for (int round = 0; round < ROUNDS; round++)
        for (int k = 0; k < 2; k++) {
            h = ps_test_header(PS_MSG_PUSH, k, 10 + (uint64_t)(2 * round + k), 5, 0, round);
            CHECK_OK(ps_test_rpc(d[k], &h, g, N, &r, NULL, 0, NULL));
            CHECK_EQ_INT(r.type, PS_MSG_PUSH);
        }
    ps_stats st;
    CHECK_OK(ps_test_stats(v.port, &st));
    /* the update thread publishes when it has nothing to do: by now */
    CHECK_EQ_INT((int)scraped(&v, "ps_server_updates_total"), (int)st.updates);
    CHECK_EQ_INT((int)st.updates, ROUNDS);
    CHECK_EQ_INT((int)scraped(&v, "ps_server_pushes_total"), 2 * ROUNDS);
    CHECK_EQ_INT((int)scraped(&v, "ps_server_received_bytes_total"), (int)st.bytes_in);
    CHECK_EQ_INT((int)scraped(&v, "ps_server_inits_total"), 1);
    CHECK_EQ_INT((int)scraped(&v, "ps_server_chunks"), 1);
    CHECK_EQ_INT((int)scraped(&v, "ps_server_workers_seen"), 2);
    /* a round waited for its second push, and each update is timed */
    CHECK_EQ_INT((int)scraped(&v, "ps_server_round_wait_seconds_count"), ROUNDS);
    CHECK_EQ_INT((int)scraped(&v, "ps_server_push_apply_seconds_count"), ROUNDS);
    CHECK(scraped(&v, "ps_server_memory_bytes") >= N * sizeof(float));
    CHECK(scraped(&v, "ps_server_max_memory_bytes") == (double)v.t.max_memory);
    /* a push of an old round again: a duplicate; a push to a key nobody made:
     * refused */
    h = ps_test_header(PS_MSG_PUSH, 0, 90, 5, 0, 0);
    CHECK_OK(ps_test_rpc(d[0], &h, g, N, &r, NULL, 0, NULL));
    h = ps_test_header(PS_MSG_PUSH, 0, 91, 6, 0, ROUNDS);
    CHECK_OK(ps_test_rpc(d[0], &h, g, N, &r, NULL, 0, NULL));
    CHECK_EQ_INT(r.type, PS_MSG_ERROR);
    CHECK_OK(ps_test_stats(v.port, &st));
    CHECK_EQ_INT((int)scraped(&v, "ps_server_duplicates_total"), 1);
    CHECK_EQ_INT((int)scraped(&v, "ps_server_refused_requests_total"), (int)st.errors);
    CHECK(st.errors >= 1);
    zmq_close(d[0]);
    zmq_close(d[1]);
    isrv_stop(&v);
}

/* A collector that stops the scrape it runs in until the test lets it go. */
typedef struct gate {
    sem_t entered, release;
    int used; /* only the first scrape stops */
} gate;

static void stuck_collector(void *user, ps_metrics_out *o)
{
    gate *g = user;
    if (!g->used) {
        g->used = 1;
        sem_post(&g->entered);
        sem_wait(&g->release);
    }
    ps_metrics_family(o, "t_gate", PS_METRIC_GAUGE, "The test's gate.");
    ps_metrics_sample(o, "", 1);
}

typedef struct scrape_job {
    const isrv *v;
    double updates; /* what the stopped scrape finally read */
} scrape_job;

static void *scrape_main(void *arg)
{
    scrape_job *j = arg;
    j->updates = scraped(j->v, "ps_server_updates_total");
    return NULL;
}

PS_TEST(a_scrape_stopped_in_a_collector_holds_nothing_the_update_path_waits_for)
{
    isrv v;
    CHECK_OK(isrv_start(&v, PS_MODE_ASYNC, 1));
    gate g = {.used = 0};
    sem_init(&g.entered, 0, 0);
    sem_init(&g.release, 0, 0);
    /* the scrape runs the server's collector first, then stops in ours,
     * holding whatever a scrape holds (the registry's lock, the exporter's
     * thread) for as long as the test wants */
    CHECK_OK(ps_metrics_add(ps_server_metrics(v.s), stuck_collector, &g));
    scrape_job job = {&v, -1};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, scrape_main, &job) == 0);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    CHECK_OK(sem_timedwait(&g.entered, &dl));
    /* meanwhile every push is applied and answered, every pull sees it, and
     * the STATS path answers too: each within PS_TEST_RPC_MS, or FAIL */
    void *d = ps_test_dealer(v.port);
    CHECK_OK(ps_test_hello(d, 0, PS_MODE_ASYNC, 1, -1));
    float w[N] = {0}, gr[N], out[N];
    for (int i = 0; i < N; i++)
        gr[i] = 1.0f;
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 9, 0, 0), r;
    h.total = N;
    int ok = ps_test_rpc(d, &h, w, N, &r, NULL, 0, NULL) == 0;
    enum { PUSHES = 50 };
    for (int k = 0; ok && k < PUSHES; k++) {
        h = ps_test_header(PS_MSG_PUSH, 0, 100 + (uint64_t)k, 9, 0, k);
        ok = ps_test_rpc(d, &h, gr, N, &r, NULL, 0, NULL) == 0 && r.type == PS_MSG_PUSH &&
             r.chunk_version == k + 1;
    }
    size_t got = 0;
    h = ps_test_header(PS_MSG_PULL, 0, 200, 9, 0, 0);
    ok = ok && ps_test_rpc(d, &h, NULL, 0, &r, out, N, &got) == 0 && got == N &&
         r.chunk_version == PUSHES;
    ps_stats st;
    memset(&st, 0, sizeof st);
    ok = ok && ps_test_stats(v.port, &st) == 0;
    /* let the scrape go before checking, so a failure does not leave it stuck */
    sem_post(&g.release);
    pthread_join(th, NULL);
    CHECK_MSG(ok, "an update, pull or STATS request waited on the stopped scrape");
    CHECK_EQ_INT((int)st.updates, PUSHES);
    CHECK(out[0] == -0.5f * PUSHES); /* sgd lr 0.5, gradient 1, from 0 */
    /* the scrape itself went on afterwards: it read the server's figures
     * before it stopped (the update thread publishes, it never waits) */
    CHECK(job.updates >= 0 && job.updates <= PUSHES);
    CHECK_EQ_INT((int)scraped(&v, "ps_server_updates_total"), PUSHES);
    CHECK_EQ_INT((int)scraped(&v, "t_gate"), 1);
    zmq_close(d);
    ps_metrics_remove(ps_server_metrics(v.s), &g);
    isrv_stop(&v);
    sem_destroy(&g.entered);
    sem_destroy(&g.release);
}

/* Does process pid map a library whose path holds name? */
static int maps(int pid, const char *name)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *f = fopen(path, "r");
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, name) != NULL;
    if (f)
        fclose(f);
    return found;
}

PS_TEST(a_server_with_metrics_off_maps_no_http_library)
{
    ps_test_server off, on;
    char words[64];
    CHECK_OK(ps_test_server_start(&off, 1, "--quiet"));
    snprintf(words, sizeof words, "--quiet --metrics-port %d", ps_test_free_port());
    CHECK_OK(ps_test_server_start(&on, 1, words));
    /* both answer: they are past their start */
    ps_stats st;
    CHECK_OK(ps_test_stats(off.port, &st));
    CHECK_OK(ps_test_stats(on.port, &st));
    CHECK(!maps(off.pid, "libmicrohttpd") && !maps(off.pid, "libgnutls"));
    CHECK(maps(on.pid, "libmicrohttpd"));
    CHECK_OK(ps_test_stop(off.pid, PS_TEST_RPC_MS));
    CHECK_OK(ps_test_stop(on.pid, PS_TEST_RPC_MS));
}

PS_TEST(checkpoints_are_counted_timed_and_aged)
{
    ps_test_server sv;
    char words[512], target[64], why[256];
    int mport = ps_test_free_port();
    snprintf(words, sizeof words,
             "--quiet --num-workers 1 --mode async --checkpoint-dir %s/ckpt-metrics "
             "--checkpoint-every 2 --metrics-port %d", ps_test_tmpdir(), mport);
    CHECK_OK(ps_test_server_start(&sv, 1, words));
    void *d = ps_test_dealer(sv.port);
    CHECK_OK(ps_test_hello(d, 0, PS_MODE_ASYNC, 1, -1));
    float w[N] = {0};
    ps_header h = ps_test_header(PS_MSG_INIT, 0, 1, 3, 0, 0), r;
    h.total = N;
    CHECK_OK(ps_test_rpc(d, &h, w, N, &r, NULL, 0, NULL));
    for (int k = 0; k < 4; k++) { /* a checkpoint every 2 pushes */
        h = ps_test_header(PS_MSG_PUSH, 0, 10 + (uint64_t)k, 3, 0, k);
        CHECK_OK(ps_test_rpc(d, &h, w, N, &r, NULL, 0, NULL));
        CHECK_EQ_INT(r.type, PS_MSG_PUSH);
    }
    /* the acknowledgements waited for a checkpoint (the I/O thread publishes
     * right after it released them: poll, within a bound) */
    snprintf(target, sizeof target, "127.0.0.1:%d", mport);
    ps_strbuf page = {0};
    const char *t = "";
    int n = 0;
    double written = 0;
    for (int i = 0; i < 500 && written < 1; i++) {
        CHECK_OK(ps_top_scrape(target, 5000, &page, why, sizeof why));
        t = ps_strbuf_str(&page);
        written = ps_top_metric(t, "ps_server_checkpoints_total", &n);
        if (written < 1)
            usleep(10000);
    }
    CHECK_MSG(n == 1 && written >= 1, "%s", t);
    CHECK(ps_top_metric(t, "ps_server_checkpoint_write_seconds_count", &n) == written);
    CHECK(ps_top_metric(t, "ps_server_checkpoint_failures_total", &n) == 0 && n == 1);
    double age = ps_top_metric(t, "ps_server_checkpoint_age_seconds", &n);
    CHECK(n == 1 && age >= 0 && age < 60);
    CHECK(ps_top_metric(t, "ps_server_checkpoint_last_success_timestamp_seconds", &n) > 1e9);
    ps_strbuf_free(&page);
    zmq_close(d);
    CHECK_OK(ps_test_stop(sv.pid, PS_TEST_RPC_MS));
}
