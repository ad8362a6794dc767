/* The I/O thread's modules on their own, without sockets: barriers, STATS
 * requests, the worker table, the checkpoint coordinator (server.h lists
 * them).  Replies are caught by a ps_reply_to that records them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "barrier.h"
#include "checkpoint.h"
#include "ckpt_coord.h"
#include "ps_error.h"
#include "ps_test.h"
#include "ps_time.h"
#include "server.h"
#include "stats_req.h"
#include "workers.h"

/* What a module asked the I/O thread to send. */
typedef struct sent {
    int n;
    ps_header h[16];
} sent;

static void record(void *user, zmq_msg_t *id, const ps_header *h)
{
    (void)id;
    sent *s = user;
    if (s->n < 16)
        s->h[s->n] = *h;
    s->n++;
}

static zmq_msg_t route(void)
{
    zmq_msg_t m;
    zmq_msg_init_size(&m, 5);
    memcpy(zmq_msg_data(&m), "peer1", 5);
    return m;
}

static ps_header request(uint32_t type, int32_t rank, uint64_t seq, int64_t step)
{
    ps_header h;
    ps_header_init(&h, type);
    h.rank = rank;
    h.seq = seq;
    ps_header_set_s(&h, step); /* what `s` means for the type */
    return h;
}

PS_TEST(barrier_waits_for_live_workers_only)
{
    sent got = {0};
    ps_barriers *b;
    CHECK_OK(ps_barriers_create(3, (ps_reply_to){&got, record}, &b));
    const char *why = NULL;
    for (int r = 0; r < 2; r++) {
        ps_header h = request(PS_MSG_BARRIER, r, 10 + (uint64_t)r, 7);
        zmq_msg_t id = route();
        CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
        zmq_msg_close(&id);
    }
    CHECK_EQ_INT(got.n, 0);
    /* rank 2 is dropped: the barrier no longer waits for it */
    ps_barriers_set_live(b, 2, 0);
    CHECK_EQ_INT(got.n, 2);
    CHECK_EQ_INT(got.h[0].type, PS_MSG_BARRIER);
    CHECK_EQ_INT(got.h[0].barrier_id, 7);
    CHECK_EQ_INT(got.h[1].seq, 11);
    /* a resend of a completed barrier is answered at once */
    ps_header h = request(PS_MSG_BARRIER, 0, 10, 7);
    zmq_msg_t id = route();
    CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
    zmq_msg_close(&id);
    CHECK_EQ_INT(got.n, 3);
    /* back in the live set: a new barrier waits for rank 2 again */
    ps_barriers_set_live(b, 2, 1);
    for (int r = 0; r < 2; r++) {
        h = request(PS_MSG_BARRIER, r, 20 + (uint64_t)r, 8);
        id = route();
        CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
        zmq_msg_close(&id);
    }
    CHECK_EQ_INT(got.n, 3);
    ps_barriers_close(b);
    CHECK_EQ_INT(got.n, 5);
    CHECK_EQ_INT(got.h[4].type, PS_MSG_ERROR);
    CHECK_EQ_INT(got.h[4].err_code, PS_ECLOSED);
    ps_barriers_destroy(b);
}

PS_TEST(a_rank_refused_at_hello_fails_the_barriers_waiting_for_it_with_why)
{
    sent got = {0};
    ps_barriers *b;
    CHECK_OK(ps_barriers_create(3, (ps_reply_to){&got, record}, &b));
    const char *why = NULL;
    ps_header h = request(PS_MSG_BARRIER, 0, 50, 4);
    zmq_msg_t id = route();
    CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
    zmq_msg_close(&id);
    CHECK_EQ_INT(got.n, 0);
    /* rank 2 refused: the open barrier fails, its waiter told who and why */
    ps_barriers_refused(b, 2, PS_EMISMATCH, "model: server has fingerprint 1, worker 2 has 2");
    CHECK_EQ_INT(got.n, 1);
    CHECK_EQ_INT(got.h[0].type, PS_MSG_ERROR);
    CHECK_EQ_INT(got.h[0].err_code, PS_EMISMATCH);
    CHECK_EQ_INT(got.h[0].seq, 50);
    CHECK_MSG(strstr(got.h[0].err_text, "worker 2 was refused at hello") &&
                  strstr(got.h[0].err_text, "worker 2 has 2"), "%s", got.h[0].err_text);
    /* a barrier opened while it is still refused fails at its first arrival */
    h = request(PS_MSG_BARRIER, 1, 51, 5);
    id = route();
    CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
    zmq_msg_close(&id);
    CHECK_EQ_INT(got.n, 2);
    CHECK_EQ_INT(got.h[1].err_code, PS_EMISMATCH);
    /* accepted since: barriers wait for it again, and complete with it */
    ps_barriers_accepted(b, 2);
    for (int r = 0; r < 3; r++) {
        h = request(PS_MSG_BARRIER, r, 60 + (uint64_t)r, 6);
        id = route();
        CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
        zmq_msg_close(&id);
        CHECK_EQ_INT(got.n, r < 2 ? 2 : 5);
    }
    CHECK_EQ_INT(got.h[4].type, PS_MSG_BARRIER);
    /* a rank that arrived already does not fail the barrier when refused
     * later (its hello again, from another process) */
    h = request(PS_MSG_BARRIER, 2, 70, 7);
    id = route();
    CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
    zmq_msg_close(&id);
    ps_barriers_refused(b, 2, PS_EMISMATCH, "again");
    CHECK_EQ_INT(got.n, 5);
    ps_barriers_destroy(b);
}

PS_TEST(barrier_info_lists_live_ranks_missing_from_the_lowest_open_barrier)
{
    sent got = {0};
    ps_barriers *b;
    CHECK_OK(ps_barriers_create(5, (ps_reply_to){&got, record}, &b));
    ps_barrier_info bi;
    ps_barriers_info(b, &bi);
    CHECK_EQ_INT(bi.id, -1);
    const char *why = NULL;
    int arrive[][2] = {{1, 9}, {4, 3}, {2, 9}}; /* rank, barrier id */
    for (int k = 0; k < 3; k++) {
        ps_header h = request(PS_MSG_BARRIER, arrive[k][0], 30 + (uint64_t)k, arrive[k][1]);
        zmq_msg_t id = route();
        CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
        zmq_msg_close(&id);
    }
    ps_barriers_set_live(b, 3, 0); /* a dropped rank is not waited for */
    ps_barriers_info(b, &bi);
    CHECK_EQ_INT(bi.id, 3);
    CHECK_EQ_INT(bi.missing, 3);
    CHECK_EQ_INT(bi.nranks, 3);
    CHECK_EQ_INT(bi.ranks[0], 0);
    CHECK_EQ_INT(bi.ranks[1], 1);
    CHECK_EQ_INT(bi.ranks[2], 2);
    CHECK_EQ_INT(got.n, 0);
    ps_barriers_destroy(b);
    /* more missing ranks than are listed: the lowest, and the count */
    CHECK_OK(ps_barriers_create(100, (ps_reply_to){&got, record}, &b));
    ps_header h = request(PS_MSG_BARRIER, 0, 40, 1);
    zmq_msg_t id = route();
    CHECK_OK(ps_barriers_arrive(b, &id, &h, &why));
    zmq_msg_close(&id);
    ps_barriers_info(b, &bi);
    CHECK_EQ_INT(bi.id, 1);
    CHECK_EQ_INT(bi.missing, 99);
    CHECK_EQ_INT(bi.nranks, PS_BARRIER_RANKS_MAX);
    CHECK_EQ_INT(bi.ranks[0], 1);
    CHECK_EQ_INT(bi.ranks[PS_BARRIER_RANKS_MAX - 1], PS_BARRIER_RANKS_MAX);
    ps_barriers_destroy(b);
}

PS_TEST(stats_answered_when_every_owner_replied)
{
    sent got = {0};
    ps_stats_reqs *q;
    ps_barriers *b; /* one barrier open, reached by rank 1 of 2 */
    CHECK_OK(ps_barriers_create(2, (ps_reply_to){&got, record}, &b));
    ps_header bh = request(PS_MSG_BARRIER, 1, 4, 1);
    zmq_msg_t bid = route();
    const char *bwhy = NULL;
    CHECK_OK(ps_barriers_arrive(b, &bid, &bh, &bwhy));
    zmq_msg_close(&bid);
    CHECK_OK(ps_stats_reqs_create(2, (ps_reply_to){&got, record}, &q));
    ps_header h = request(PS_MSG_STATS, -1, 5, 0);
    zmq_msg_t id = route();
    uint64_t token = 0;
    const char *why = NULL;
    CHECK_OK(ps_stats_reqs_begin(q, &id, &h, &token, &why));
    zmq_msg_close(&id);
    ps_stats_frame of;
    memset(&of, 0, sizeof of);
    of.token = token;
    of.st.pushes = 3;
    of.st.chunks = 1;
    of.st.min_version = 4;
    of.st.max_version = 9;
    const ps_stats io = {.errors = 2, .workers_seen = 1, .forged = 7};
    ps_stats_reqs_part(q, &of, &io, b);
    CHECK_EQ_INT(got.n, 0);
    of.st.min_version = 2;
    of.st.max_version = 6;
    ps_stats_reqs_part(q, &of, &io, b);
    CHECK_EQ_INT(got.n, 1);
    CHECK_EQ_INT(got.h[0].type, PS_MSG_STATS);
    CHECK_EQ_INT(got.h[0].seq, 5);
    CHECK_EQ_INT(got.h[0].stats.pushes, 6);
    CHECK_EQ_INT(got.h[0].stats.errors, 2);
    CHECK_EQ_INT(got.h[0].stats.workers_seen, 1);
    CHECK_EQ_INT(got.h[0].stats.forged, 7);
    CHECK_EQ_INT(got.h[0].stats.min_version, 2);
    CHECK_EQ_INT(got.h[0].stats.max_version, 9);
    CHECK_EQ_INT(got.h[0].barrier.id, 1);
    CHECK_EQ_INT(got.h[0].barrier.missing, 1);
    CHECK_EQ_INT(got.h[0].barrier.nranks, 1);
    CHECK_EQ_INT(got.h[0].barrier.ranks[0], 0);
    ps_stats_reqs_destroy(q);
    ps_barriers_destroy(b);
}

/* A connection as workers.h takes it: routing id `id`, socket fd, no key. */
#define CONN(id, fd) (&(ps_conn){(id), strlen(id), (fd), NULL})

PS_TEST(silent_worker_dropped_then_rejoins_on_hello)
{
    ps_workers *w;
    CHECK_OK(ps_workers_create(2, 100, PS_LOSS_DROP, &w));
    int rejoined = -1;
    uint64_t tok = 0;
    char why[256];
    CHECK_EQ_INT(ps_workers_heard(w, 0, CONN("id0", -1), 0, why, sizeof why), PS_WORKER_UNKNOWN);
    CHECK_OK(ps_workers_hello(w, 0, CONN("id0", -1), 0, 0, "test", &tok, &rejoined, why, sizeof why));
    CHECK_EQ_INT(rejoined, 0);
    CHECK(tok != 0);
    CHECK_EQ_INT(ps_workers_seen(w), 1);
    CHECK_EQ_INT(ps_workers_hello_flags(w)[0], 1);
    CHECK_EQ_INT(ps_workers_check(w, 50000000LL), -1);
    CHECK_EQ_INT(ps_workers_heard(w, 0, CONN("id0", -1), 60000000LL, why, sizeof why), PS_WORKER_LIVE);
    CHECK_EQ_INT(ps_workers_check(w, 150000000LL), -1); /* heard at 60 ms */
    CHECK_EQ_INT(ps_workers_check(w, 200000000LL), 0);
    CHECK_EQ_INT(ps_workers_check(w, 300000000LL), -1); /* once */
    CHECK_EQ_INT(ps_workers_heard(w, 0, CONN("id0", -1), 300000000LL, why, sizeof why), PS_WORKER_DROPPED);
    /* dropped: its rank is free for any connection, which gets a new token */
    uint64_t tok2 = 0;
    CHECK_OK(ps_workers_hello(w, 0, CONN("id1", -1), 0, 310000000LL, "test", &tok2, &rejoined, why,
                              sizeof why));
    CHECK_EQ_INT(rejoined, 1);
    CHECK(tok2 != 0 && tok2 != tok);
    CHECK_EQ_INT(ps_workers_heard(w, 0, CONN("id1", -1), 320000000LL, why, sizeof why), PS_WORKER_LIVE);
    CHECK_EQ_INT(ps_workers_lost(w), 1);
    CHECK_EQ_INT(ps_workers_rejoined(w), 1);
    ps_workers_destroy(w);
}

PS_TEST(a_rank_held_by_a_live_connection_takes_a_hello_only_with_its_token)
{
    ps_workers *w;
    CHECK_OK(ps_workers_create(2, 0, PS_LOSS_WAIT, &w)); /* hold window: 3 s */
    int rejoined;
    uint64_t tok = 0, t2 = 0;
    char why[256] = "";
    const int64_t s = 1000000000LL;
    CHECK_OK(ps_workers_hello(w, 1, CONN("aaaaa", -1), 0, 10 * s, "a", &tok, &rejoined, why,
                              sizeof why));
    /* another connection, no token or a wrong one, while the holder is live */
    CHECK_EQ_INT(ps_workers_hello(w, 1, CONN("bbbbb", -1), 0, 11 * s, "b", &t2, &rejoined, why,
                                  sizeof why), PS_ESTATE);
    CHECK(strstr(why, "held by another connection"));
    CHECK_EQ_INT(ps_workers_hello(w, 1, CONN("bbbbb", -1), tok + 1, 11 * s, "b", &t2, &rejoined, why,
                                  sizeof why), PS_ESTATE);
    /* messages on another connection are refused and do not keep the holder
     * live ... */
    CHECK_EQ_INT(ps_workers_heard(w, 1, CONN("bbbbb", -1), 12 * s, why, sizeof why),
                 PS_WORKER_FORGED);
    CHECK_EQ_INT(ps_workers_hello(w, 1, CONN("bbbbb", -1), 0, 12 * s, "b", &t2, &rejoined, why,
                                  sizeof why), PS_ESTATE);
    /* ... its own do */
    CHECK_EQ_INT(ps_workers_heard(w, 1, CONN("aaaaa", -1), 12 * s, why, sizeof why),
                 PS_WORKER_LIVE);
    CHECK_EQ_INT(ps_workers_hello(w, 1, CONN("bbbbb", -1), 0, 14 * s, "b", &t2, &rejoined, why,
                                  sizeof why), PS_ESTATE);
    /* the same connection again: same token */
    CHECK_OK(ps_workers_hello(w, 1, CONN("aaaaa", -1), 0, 14 * s, "a", &t2, &rejoined, why,
                              sizeof why));
    CHECK_EQ_INT(t2, tok);
    /* the token proves it is the same worker on a new connection */
    CHECK_OK(ps_workers_hello(w, 1, CONN("ccccc", -1), tok, 14 * s, "c", &t2, &rejoined, why,
                              sizeof why));
    CHECK_EQ_INT(t2, tok);
    /* a holder silent past the window loses the rank to any hello */
    CHECK_OK(ps_workers_hello(w, 1, CONN("ddddd", -1), 0, 18 * s, "d", &t2, &rejoined, why,
                              sizeof why));
    CHECK(t2 != tok);
    CHECK_EQ_INT(ps_workers_refused(w), 4);
    /* a holder whose connection closed frees the rank at once */
    CHECK_OK(ps_workers_hello(w, 0, CONN("ggggg", 7), 0, 20 * s, "g", &t2, &rejoined, why,
                              sizeof why));
    CHECK_EQ_INT(ps_workers_hello(w, 0, CONN("hhhhh", 8), 0, 20 * s, "h", &t2, &rejoined, why,
                                  sizeof why), PS_ESTATE);
    ps_workers_gone(w, 8); /* not the holder's */
    CHECK_EQ_INT(ps_workers_hello(w, 0, CONN("hhhhh", 8), 0, 20 * s, "h", &t2, &rejoined, why,
                                  sizeof why), PS_ESTATE);
    ps_workers_gone(w, 7);
    CHECK_OK(ps_workers_hello(w, 0, CONN("hhhhh", 8), 0, 20 * s, "h", &t2, &rejoined, why,
                              sizeof why));
    ps_workers_destroy(w);
    /* restored ranks have no holder: the first hello is taken */
    CHECK_OK(ps_workers_create(2, 0, PS_LOSS_WAIT, &w));
    uint8_t known[2] = {1, 1};
    CHECK_OK(ps_workers_restore(w, known, 0));
    CHECK_OK(ps_workers_hello(w, 0, CONN("eeeee", -1), 0, 1, "e", &t2, &rejoined, why, sizeof why));
    CHECK(t2 != 0);
    CHECK_EQ_INT(ps_workers_hello(w, 0, CONN("fffff", -1), 0, 2, "f", &t2, &rejoined, why,
                                  sizeof why), PS_ESTATE);
    ps_workers_destroy(w);
}

PS_TEST(only_the_connection_holding_a_rank_speaks_for_it)
{
    ps_workers *w;
    CHECK_OK(ps_workers_create(2, 0, PS_LOSS_WAIT, &w)); /* hold window: 3 s */
    int rejoined;
    uint64_t tok = 0;
    char why[256] = "";
    const int64_t s = 1000000000LL;
    ps_conn a = {"aaaaa", 5, 7, "worker-1"}, b = {"bbbbb", 5, 8, "worker-2"};
    ps_conn a_other_key = {"aaaaa", 5, 7, "worker-2"};
    CHECK_OK(ps_workers_hello(w, 1, &a, 0, 10 * s, "a", &tok, &rejoined, why, sizeof why));
    CHECK_EQ_INT(ps_workers_heard(w, 1, &a, 11 * s, why, sizeof why), PS_WORKER_LIVE);
    /* another connection, or the same route under another key: refused,
     * counted, and the reason names the rank */
    CHECK_EQ_INT(ps_workers_heard(w, 1, &b, 11 * s, why, sizeof why), PS_WORKER_FORGED);
    CHECK(strstr(why, "worker 1 is held by another connection"));
    CHECK_EQ_INT(ps_workers_heard(w, 1, &a_other_key, 11 * s, why, sizeof why),
                 PS_WORKER_FORGED);
    CHECK(strstr(why, "CURVE key"));
    CHECK_EQ_INT(ps_workers_forged(w), 2);
    /* a forger's messages are no sign of life: the holder's silence counts */
    CHECK_EQ_INT(ps_workers_heard(w, 1, &b, 14 * s + 1, why, sizeof why), PS_WORKER_UNHELD);
    CHECK(strstr(why, "say hello on it first"));
    /* the holder's connection closed: its rank waits for a hello, from any */
    CHECK_EQ_INT(ps_workers_heard(w, 1, &a, 14 * s + 2, why, sizeof why), PS_WORKER_LIVE);
    ps_workers_gone(w, 7);
    CHECK_EQ_INT(ps_workers_heard(w, 1, &a, 15 * s, why, sizeof why), PS_WORKER_UNHELD);
    CHECK_EQ_INT(ps_workers_heard(w, 1, &b, 15 * s, why, sizeof why), PS_WORKER_UNHELD);
    CHECK_OK(ps_workers_hello(w, 1, &b, 0, 15 * s, "b", &tok, &rejoined, why, sizeof why));
    CHECK_EQ_INT(ps_workers_heard(w, 1, &b, 15 * s, why, sizeof why), PS_WORKER_LIVE);
    CHECK_EQ_INT(ps_workers_forged(w), 2);
    /* a restored rank has no holder: nothing but a hello is taken for it */
    ps_workers_destroy(w);
    CHECK_OK(ps_workers_create(2, 0, PS_LOSS_WAIT, &w));
    uint8_t known[2] = {1, 0};
    CHECK_OK(ps_workers_restore(w, known, 0));
    CHECK_EQ_INT(ps_workers_heard(w, 0, &a, 1, why, sizeof why), PS_WORKER_UNHELD);
    CHECK_EQ_INT(ps_workers_heard(w, 1, &a, 1, why, sizeof why), PS_WORKER_UNKNOWN);
    ps_workers_destroy(w);
}

PS_TEST(a_rank_that_never_says_hello_is_lost_after_the_timeout_from_the_first_hello)
{
    const int64_t ms = 1000000LL;
    ps_workers *w;
    int rejoined;
    uint64_t tok;
    char why[256];
    ps_conn a = {"aaaaa", 5, -1, NULL}, b = {"bbbbb", 5, -1, NULL};
    CHECK_OK(ps_workers_create(3, 100, PS_LOSS_DROP, &w));
    /* before any hello nothing is waited for */
    CHECK_EQ_INT(ps_workers_check(w, 1000 * ms), -1);
    CHECK_OK(ps_workers_hello(w, 0, &a, 0, 1000 * ms, "a", &tok, &rejoined, why, sizeof why));
    CHECK_EQ_INT(ps_workers_heard(w, 0, &a, 1090 * ms, why, sizeof why), PS_WORKER_LIVE);
    CHECK_EQ_INT(ps_workers_check(w, 1090 * ms), -1);
    /* 1 and 2 never said hello: dropped 100 ms after worker 0's hello */
    CHECK_EQ_INT(ps_workers_check(w, 1101 * ms), 1);
    CHECK_EQ_INT(ps_workers_check(w, 1101 * ms), 2);
    CHECK_EQ_INT(ps_workers_check(w, 1101 * ms), -1);
    CHECK_EQ_INT(ps_workers_lost(w), 2);
    CHECK_EQ_INT(ps_workers_seen(w), 1);
    CHECK_EQ_INT(ps_workers_hello_flags(w)[1], 0); /* not known: a checkpoint says so */
    CHECK_EQ_INT(ps_workers_heard(w, 1, &b, 1200 * ms, why, sizeof why), PS_WORKER_UNKNOWN);
    /* its hello, late, puts it back */
    CHECK_OK(ps_workers_hello(w, 1, &b, 0, 1200 * ms, "b", &tok, &rejoined, why, sizeof why));
    CHECK_EQ_INT(rejoined, 1);
    CHECK_EQ_INT(ps_workers_seen(w), 2);
    CHECK_EQ_INT(ps_workers_hello_flags(w)[1], 1);
    CHECK_EQ_INT(ps_workers_heard(w, 1, &b, 1200 * ms, why, sizeof why), PS_WORKER_LIVE);
    ps_workers_destroy(w);
    /* wait: lost, not dropped */
    CHECK_OK(ps_workers_create(2, 100, PS_LOSS_WAIT, &w));
    CHECK_OK(ps_workers_hello(w, 0, &a, 0, 1000 * ms, "a", &tok, &rejoined, why, sizeof why));
    CHECK_EQ_INT(ps_workers_heard(w, 0, &a, 1150 * ms, why, sizeof why), PS_WORKER_LIVE);
    CHECK_EQ_INT(ps_workers_check(w, 1200 * ms), -1);
    CHECK_EQ_INT(ps_workers_lost(w), 1);
    CHECK_OK(ps_workers_hello(w, 1, &b, 0, 1300 * ms, "b", &tok, &rejoined, why, sizeof why));
    CHECK_EQ_INT(rejoined, 0);
    CHECK_EQ_INT(ps_workers_seen(w), 2);
    ps_workers_destroy(w);
}

/* Durable rounds: an init acknowledgement waits for the checkpoint holding
 * its chunk, and the coordinator hands it back, it does not send it. */
PS_TEST(ckpt_coord_releases_held_replies_once_written)
{
    char dir[512], why[256];
    snprintf(dir, sizeof dir, "%s/coord-ck", ps_test_tmpdir());
    ps_server_config cfg;
    ps_server_config_default(&cfg);
    cfg.bind = "inproc://unused";
    cfg.mode = PS_MODE_SYNC;
    cfg.max_staleness = 0;
    cfg.checkpoint_dir = dir;
    cfg.checkpoint_every = 1;
    ps_ckpt_coord *c;
    CHECK_OK(ps_ckpt_coord_create(&cfg, &c, why, sizeof why));
    const ps_ckpt_policy *pol = ps_ckpt_coord_policy(c);
    CHECK(pol->on && pol->defer_acks && pol->durable && pol->report_progress);
    struct stat st;
    CHECK(stat(dir, &st) == 0 && S_ISDIR(st.st_mode));

    ps_held_reply *m = NULL;
    CHECK_EQ_INT(ps_ckpt_coord_hold(c, PS_OUT_HELD, 0, 0, &m), 0); /* version 0 is on disk */
    CHECK_EQ_INT(ps_ckpt_coord_hold(c, PS_OUT_INIT, 0, 0, &m), 1);
    CHECK(m != NULL);
    m->nf = 1;
    zmq_msg_init_size(&m->f[0], 4);
    ps_held_reply *later = NULL;
    CHECK_EQ_INT(ps_ckpt_coord_hold(c, PS_OUT_HELD, 3, 0, &later), 1);
    later->nf = 1;
    zmq_msg_init_size(&later->f[0], 4);

    /* a waiting init acknowledgement makes a checkpoint due */
    uint64_t token = 0;
    CHECK_EQ_INT(ps_ckpt_coord_due(c, ps_now_ns(), 1, &token), 1);
    CHECK(!ps_ckpt_coord_idle(c) && ps_ckpt_coord_collecting(c));

    ps_shard_config sc = {PS_MODE_SYNC, 0, 1, {PS_OPT_SGD, 1.0f, 0, 0, 0, 1e-8f, 0, 1.0f, 0, PS_OPT_GIVEN_ALL},
                          1 << 20, NULL, 1};
    ps_shard_hooks hk = {0};
    ps_shard *sh;
    CHECK_OK(ps_shard_create(&sc, &hk, &sh));
    ps_ckpt_frame cf;
    memset(&cf, 0, sizeof cf);
    cf.token = token;
    cf.rc = ps_ckpt_serialize(sh, NULL, PS_MODE_SYNC, 1, 1, &cf.part);
    ps_shard_destroy(sh);
    CHECK_OK(cf.rc);
    uint8_t hello[1] = {1};
    /* no writer thread: the file is written in ps_ckpt_coord_part */
    ps_held_reply *out = ps_ckpt_coord_part(c, 0, &cf, 0x1234, hello);
    CHECK(ps_ckpt_coord_idle(c));
    CHECK_EQ_INT(ps_ckpt_coord_count(c), 1);
    CHECK(out == m);
    CHECK(out->next == NULL); /* version 3 is not on disk yet */
    ps_held_reply_free(out);
    uint64_t *seqs = NULL;
    CHECK_EQ_INT(ps_ckpt_list(dir, 0, &seqs, why, sizeof why), 1);
    CHECK_EQ_INT(seqs[0], token);
    free(seqs);
    ps_ckpt_coord_destroy(c); /* frees the reply still held */
}

/* docs/PROTOCOL.md spells out the checkpoint configuration fingerprint. */
PS_TEST(checkpoint_config_fingerprint_is_the_documented_fnv)
{
    ps_opt_config o;
    ps_opt_default(&o);
    o.kind = PS_OPT_ADAM;
    o.lr = 0.125f;
    o.lr_decay_every = 7;
    unsigned char b[128], *p = b;
    int32_t ints[6] = {1, 2, 3, PS_MODE_ASYNC, -1, PS_OPT_ADAM};
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 4; k++)
            *p++ = (unsigned char)((uint32_t)ints[i] >> (8 * k));
    float f[7] = {o.lr, o.momentum, o.beta1, o.beta2, o.eps, o.weight_decay, o.lr_decay};
    for (int i = 0; i < 7; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        for (int k = 0; k < 4; k++)
            *p++ = (unsigned char)(u >> (8 * k));
    }
    for (int k = 0; k < 4; k++)
        *p++ = (unsigned char)(o.lr_decay_every >> (8 * k));
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char *q = b; q < p; q++)
        h = (h ^ *q) * 1099511628211ull;
    CHECK_EQ_INT(PS_OPT_NPARAMS, 8); /* the document lists eight */
    CHECK_EQ_INT(ps_ckpt_config_fp(1, 2, 3, PS_MODE_ASYNC, -1, &o), h);
}
