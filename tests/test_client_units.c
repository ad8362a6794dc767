/* libps's comm-thread decisions without sockets or servers: when a
 * sub-request is resent and how its backoff grows, when heartbeats are due,
 * when a silent server is given up on, and whether a refused request is
 * parked until a hello rejoins its server (client/client_resend.c,
 * client/client_rejoin.c).  They say what to send and the comm loop sends
 * it, so a test can play the loop: it calls them with chosen times and
 * "sends" by arming the slot they name. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "client_rejoin.h"
#include "client_requests.h"
#include "client_resend.h"
#include "client_sparse.h"
#include "ps_error.h"
#include "ps_test.h"
#include "ps_time.h"

#define MS 1000000LL
/* A time to start from (ns): the decisions take the time they are given. */
#define T0 (1000000LL * MS)

static char ep0[] = "tcp://127.0.0.1:1", ep1[] = "tcp://127.0.0.1:2";

static void fake_free(ps_client *c)
{
    psc_requests_free(c);
    psc_liveness_free(c);
    psc_rejoin_free(c);
    free(c);
}

/* A client with two servers and no comm thread: only what the decisions
 * read.  started: as after ps_client_start (heartbeats, silence, rejoins).
 * The resends and rejoins the tests cause are not news: errors alone are
 * logged. */
static ps_client *fake_client(int request_timeout_ms, int heartbeat_ms, int server_timeout_ms,
                              int started)
{
    static char *eps[2] = {ep0, ep1};
    ps_log_set_level(PS_LOG_ERROR);
    ps_client *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->opt.request_timeout_ms = request_timeout_ms;
    c->opt.heartbeat_ms = heartbeat_ms;
    c->opt.server_timeout_ms = server_timeout_ms;
    c->endpoints = eps;
    c->nservers = 2;
    c->started = started;
    if (psc_requests_new(c, psc_sparse_sub_free) || psc_liveness_new(c) || psc_rejoin_new(c)) {
        fake_free(c);
        return NULL;
    }
    return c;
}

/* A sub-request of r (reset to complete with its one reply) to `server`. */
static uint32_t new_sub(ps_client *c, uint32_t type, int server, ps_request *r)
{
    psc_req_reset(c, r, 1);
    return psc_slot_new(c, server, type, r);
}

static ps_header refusal(void)
{
    ps_header h;
    ps_header_init(&h, PS_MSG_ERROR);
    h.err_code = PS_EHELLO;
    return h;
}

/* The reply of a server that takes this worker back. */
static ps_header hello_reply(const ps_client *c, int server)
{
    ps_header h;
    ps_header_init(&h, PS_MSG_HELLO);
    h.flags |= PS_FLAG_REPLY;
    h.hello = c->hello_req;
    h.hello.server_rank = server;
    return h;
}

PS_TEST(resend_backoff_doubles_from_the_request_timeout_up_to_30_s)
{
    ps_client *c = fake_client(1000, 0, 0, 1);
    CHECK(c);
    ps_request r;
    uint32_t i = new_sub(c, PS_MSG_PUSH, 0, &r);
    CHECK(i != PSC_NO_SLOT);
    psc_resend_arm(c, i, T0);
    CHECK_EQ_INT(psc_resend_next(c, T0, 0), PSC_NO_SLOT); /* the loop's round after the send */
    int64_t sent = T0;
    const long gaps_ms[] = {1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000};
    for (size_t k = 0; k < sizeof gaps_ms / sizeof gaps_ms[0]; k++) {
        int64_t due = sent + gaps_ms[k] * MS;
        CHECK_EQ_INT(psc_liveness_timeout_ms(c, due - 10 * MS), 11); /* 10 ms, rounded up */
        CHECK_EQ_INT(psc_resend_next(c, due - 1, 0), PSC_NO_SLOT);
        CHECK_EQ_INT(psc_resend_next(c, due, 0), i);
        CHECK_EQ_INT(psc_resend_next(c, due, i + 1), PSC_NO_SLOT);
        psc_resend_arm(c, i, due); /* the loop sent it again */
        sent = due;
    }
    psc_slot_finish(c, i);
    CHECK(ps_request_test(&r));
    fake_free(c);
}

PS_TEST(a_resend_round_names_each_due_request_once_then_waits_for_the_earliest_deadline)
{
    ps_client *c = fake_client(1000, 0, 0, 1);
    CHECK(c);
    ps_request r[4];
    uint32_t a = new_sub(c, PS_MSG_PUSH, 0, &r[0]);
    uint32_t b = new_sub(c, PS_MSG_PULL, 1, &r[1]);
    uint32_t late = new_sub(c, PS_MSG_PULL, 0, &r[2]);
    uint32_t shut = new_sub(c, PS_MSG_SHUTDOWN, 1, &r[3]);
    psc_resend_arm(c, a, T0);
    psc_resend_arm(c, b, T0 + 200 * MS);
    psc_resend_arm(c, late, T0 + 700 * MS);
    psc_resend_arm(c, shut, T0);
    int64_t now = T0 + 1500 * MS; /* a and b are due, late at 1700 ms, shut never */
    CHECK_EQ_INT(psc_resend_next(c, now, 0), a);
    psc_resend_arm(c, a, now); /* next at 3500 ms */
    CHECK_EQ_INT(psc_resend_next(c, now, a + 1), b);
    psc_resend_arm(c, b, now);
    CHECK_EQ_INT(psc_resend_next(c, now, b + 1), PSC_NO_SLOT);
    /* the next round is at late's deadline, and only late is due then */
    CHECK_EQ_INT(psc_liveness_timeout_ms(c, now), 201);
    CHECK_EQ_INT(psc_resend_next(c, T0 + 1700 * MS - 1, 0), PSC_NO_SLOT);
    CHECK_EQ_INT(psc_resend_next(c, T0 + 1700 * MS, 0), late);
    const uint32_t all[] = {a, b, late, shut};
    for (int k = 0; k < 4; k++)
        psc_slot_finish(c, all[k]);
    fake_free(c);
}

PS_TEST(nothing_is_resent_without_a_request_timeout)
{
    ps_client *c = fake_client(0, 0, 0, 1);
    CHECK(c);
    ps_request r;
    uint32_t i = new_sub(c, PS_MSG_PUSH, 0, &r);
    psc_resend_arm(c, i, T0);
    CHECK_EQ_INT(psc_resend_next(c, T0 + 1000000 * MS, 0), PSC_NO_SLOT);
    CHECK_EQ_INT(psc_liveness_timeout_ms(c, T0), -1);
    psc_slot_finish(c, i);
    fake_free(c);
}

PS_TEST(heartbeats_are_due_every_heartbeat_ms_and_only_after_start)
{
    ps_client *c = fake_client(0, 250, 0, 0);
    CHECK(c);
    CHECK_EQ_INT(psc_heartbeat_due(c, T0), 0);
    CHECK_EQ_INT(psc_liveness_timeout_ms(c, T0), -1);
    c->started = 1; /* ps_client_start */
    CHECK_EQ_INT(psc_heartbeat_due(c, T0), 1);
    CHECK_EQ_INT(psc_heartbeat_due(c, T0), 0);
    CHECK_EQ_INT(psc_liveness_timeout_ms(c, T0 + 50 * MS), 201);
    CHECK_EQ_INT(psc_heartbeat_due(c, T0 + 250 * MS - 1), 0);
    CHECK_EQ_INT(psc_heartbeat_due(c, T0 + 250 * MS), 1);
    fake_free(c);
}

PS_TEST(a_silent_server_is_given_up_on_only_while_requests_wait_on_it)
{
    ps_client *c = fake_client(0, 0, 5000, 1);
    CHECK(c);
    ps_request r;
    uint32_t i = new_sub(c, PS_MSG_PULL, 0, &r);
    /* heard after the request began to wait: silence counts from here */
    int64_t heard = ps_now_ns() + 1000 * MS;
    psc_server_heard(c, 0, heard);
    int64_t limit = 5000 * MS;
    CHECK_EQ_INT(psc_liveness_timeout_ms(c, heard), 5001);
    psc_liveness_wake_by(c, heard + limit);
    CHECK_EQ_INT(psc_give_up_next(c, heard + limit, 0), -1);
    CHECK(!ps_request_test(&r));
    CHECK_EQ_INT(psc_give_up_next(c, heard + limit + 1, 0), 0);
    CHECK(ps_request_test(&r));
    CHECK_EQ_INT(r.status, PS_ETIMEDOUT);
    CHECK(strstr(r.err, ep0) != NULL);
    /* server 1 has been silent forever, but nothing waits on it */
    CHECK_EQ_INT(psc_give_up_next(c, heard + limit + 1, 1), -1);
    CHECK_EQ_INT(psc_slot_find(c, psc_slot_id(c, i), 0), PSC_NO_SLOT);
    fake_free(c);
}

PS_TEST(a_pause_of_the_process_makes_server_silence_count_afresh)
{
    ps_client *c = fake_client(0, 0, 5000, 1);
    CHECK(c);
    ps_request r;
    new_sub(c, PS_MSG_PULL, 0, &r);
    int64_t heard = ps_now_ns() + 1000 * MS;
    psc_server_heard(c, 0, heard);
    /* the poll was due back 100 ms after heard, the loop ran 6 s after:
     * the process was stopped, and the server's replies may be on their way */
    psc_liveness_wake_by(c, heard + 100 * MS);
    int64_t resumed = heard + 6000 * MS;
    CHECK_EQ_INT(psc_give_up_next(c, resumed, 0), -1);
    psc_liveness_wake_by(c, INT64_MAX);
    CHECK_EQ_INT(psc_give_up_next(c, resumed + 5000 * MS, 0), -1);
    CHECK_EQ_INT(psc_give_up_next(c, resumed + 5000 * MS + 1, 0), 0);
    CHECK_EQ_INT(r.status, PS_ETIMEDOUT);
    fake_free(c);
}

PS_TEST(a_refused_request_is_parked_until_a_hello_rejoins_its_server_then_resent)
{
    ps_client *c = fake_client(1000, 0, 0, 1);
    CHECK(c);
    ps_request r;
    uint32_t i = new_sub(c, PS_MSG_PUSH, 1, &r);
    psc_resend_arm(c, i, T0);
    ps_header no = refusal();
    CHECK_EQ_INT(psc_rejoin_park(c, i), 0);
    uint32_t hello = psc_rejoin_hello(c, 1, &no);
    CHECK(hello != PSC_NO_SLOT);
    CHECK_EQ_INT(c->slots->sub[hello].type, PS_MSG_HELLO);
    CHECK_EQ_INT(c->slots->sub[hello].server, 1);
    /* one hello at a time; a parked request is not resent, nor released early */
    CHECK_EQ_INT(psc_rejoin_hello(c, 1, &no), PSC_NO_SLOT);
    CHECK_EQ_INT(psc_resend_next(c, T0 + 3600000 * MS, 0), PSC_NO_SLOT);
    CHECK_EQ_INT(psc_rejoin_unpark(c, 1, 0), PSC_NO_SLOT);
    CHECK_EQ_INT(psc_rejoin_reply(c, i, &no), 0); /* not a rejoin hello */
    ps_header yes = hello_reply(c, 1);
    CHECK_EQ_INT(psc_rejoin_reply(c, hello, &yes), 1);
    CHECK_EQ_INT(psc_rejoin_unpark(c, 1, 0), i);
    CHECK_EQ_INT(psc_rejoin_unpark(c, 1, i + 1), PSC_NO_SLOT);
    CHECK_EQ_INT(psc_rejoin_unpark(c, 1, 0), PSC_NO_SLOT);
    CHECK(!ps_request_test(&r));
    psc_slot_finish(c, i);
    CHECK_EQ_INT(r.status, 0);
    fake_free(c);
}

PS_TEST(a_server_that_refuses_us_after_three_hellos_in_a_row_fails_requests_until_one_is_served)
{
    ps_client *c = fake_client(0, 0, 0, 1);
    CHECK(c);
    ps_header no = refusal();
    ps_request r;
    uint32_t i = new_sub(c, PS_MSG_PULL, 0, &r);
    for (int k = 0; k < 3; k++) {
        CHECK_EQ_INT(psc_rejoin_park(c, i), 0);
        uint32_t hello = psc_rejoin_hello(c, 0, &no);
        CHECK(hello != PSC_NO_SLOT);
        ps_header yes = hello_reply(c, 0);
        CHECK_EQ_INT(psc_rejoin_reply(c, hello, &yes), 1);
        CHECK_EQ_INT(psc_rejoin_unpark(c, 0, 0), i);
    }
    CHECK_EQ_INT(psc_rejoin_park(c, i), -1);
    CHECK_EQ_INT(psc_rejoin_hello(c, 0, &no), PSC_NO_SLOT);
    /* a served request shows the rank is live there again */
    psc_rejoin_served(c, 0);
    CHECK_EQ_INT(psc_rejoin_park(c, i), 0);
    CHECK(psc_rejoin_hello(c, 0, &no) != PSC_NO_SLOT);
    fake_free(c);
}

PS_TEST(a_refusal_before_start_or_of_a_hello_fails_the_request)
{
    ps_client *c = fake_client(0, 0, 0, 0);
    CHECK(c);
    ps_header no = refusal();
    ps_request r, h;
    uint32_t i = new_sub(c, PS_MSG_PUSH, 0, &r);
    CHECK_EQ_INT(psc_rejoin_park(c, i), -1);
    CHECK_EQ_INT(psc_rejoin_hello(c, 0, &no), PSC_NO_SLOT);
    c->started = 1;
    uint32_t j = new_sub(c, PS_MSG_HELLO, 0, &h);
    CHECK_EQ_INT(psc_rejoin_park(c, j), -1);
    fake_free(c);
}

PS_TEST(a_rejoin_that_fails_fails_what_was_parked_with_its_reason)
{
    ps_client *c = fake_client(0, 0, 0, 1);
    CHECK(c);
    ps_header no = refusal();
    ps_request r[2];
    /* the hello cannot go */
    uint32_t i = new_sub(c, PS_MSG_PUSH, 0, &r[0]);
    CHECK_EQ_INT(psc_rejoin_park(c, i), 0);
    uint32_t hello = psc_rejoin_hello(c, 0, &no);
    CHECK(hello != PSC_NO_SLOT);
    psc_set_error(c->slots->sub[hello].req, PS_EIO, "no route");
    psc_slot_finish(c, hello);
    psc_rejoin_unsent(c, 0);
    CHECK(ps_request_test(&r[0]));
    CHECK_EQ_INT(r[0].status, PS_EIO);
    CHECK(strcmp(r[0].err, "cannot rejoin tcp://127.0.0.1:1: no route") == 0);
    /* the server refuses the hello */
    uint32_t j = new_sub(c, PS_MSG_PULL, 0, &r[1]);
    CHECK_EQ_INT(psc_rejoin_park(c, j), 0);
    hello = psc_rejoin_hello(c, 0, &no);
    CHECK(hello != PSC_NO_SLOT);
    ps_header bad;
    ps_header_init(&bad, PS_MSG_ERROR);
    bad.err_code = PS_EMISMATCH;
    snprintf(bad.err_text, sizeof bad.err_text, "model differs");
    CHECK_EQ_INT(psc_rejoin_reply(c, hello, &bad), 1);
    CHECK_EQ_INT(psc_rejoin_unpark(c, 0, 0), PSC_NO_SLOT);
    CHECK(ps_request_test(&r[1]));
    CHECK_EQ_INT(r[1].status, PS_EMISMATCH);
    CHECK(strcmp(r[1].err, "cannot rejoin tcp://127.0.0.1:1: model differs") == 0);
    fake_free(c);
}
