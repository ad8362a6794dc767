/* common/ps_strbuf: growable strings and argv vectors. */
#include <stdlib.h>
#include <string.h>

#include "ps_error.h"
#include "ps_strbuf.h"
#include "ps_test.h"

PS_TEST(strbuf_appends_and_formats_past_its_first_buffer)
{
    ps_strbuf b = {0};
    CHECK(!strcmp(ps_strbuf_str(&b), "")); /* empty, never NULL */
    CHECK_OK(ps_strbuf_add(&b, "ab"));
    CHECK_OK(ps_strbuf_addn(&b, "cdef", 2));
    CHECK_OK(ps_strbuf_addf(&b, "-%d-%s", 42, "x"));
    CHECK(!strcmp(ps_strbuf_str(&b), "abcd-42-x"));
    CHECK_EQ_INT(b.n, 9);
    /* longer than the formatting scratch space */
    char big[3000];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK_OK(ps_strbuf_addf(&b, "[%s]", big));
    CHECK_EQ_INT(b.n, 9 + 2 + sizeof big - 1);
    CHECK(b.p[9] == '[' && b.p[b.n - 1] == ']' && b.p[b.n] == 0);
    ps_strbuf_reset(&b);
    CHECK_EQ_INT(b.n, 0);
    CHECK(!strcmp(ps_strbuf_str(&b), ""));
    ps_strbuf_free(&b);
    CHECK(b.p == NULL && b.n == 0);
}

PS_TEST(strbuf_take_hands_over_the_string)
{
    ps_strbuf b = {0};
    char *s = ps_strbuf_take(&b);
    CHECK(s && !strcmp(s, ""));
    free(s);
    ps_strbuf_addf(&b, "%s=%d", "n", 3);
    s = ps_strbuf_take(&b);
    CHECK(s && !strcmp(s, "n=3"));
    CHECK(b.p == NULL && b.n == 0);
    free(s);
}

PS_TEST(strbuf_failure_is_sticky_until_reset)
{
    ps_strbuf b = {0};
    ps_strbuf_add(&b, "kept");
    b.failed = 1; /* as after a failed allocation */
    CHECK_EQ_INT(ps_strbuf_add(&b, "more"), PS_ENOMEM);
    CHECK_EQ_INT(ps_strbuf_addf(&b, "%d", 1), PS_ENOMEM);
    CHECK_EQ_INT(b.n, 4);
    CHECK(!strcmp(ps_strbuf_str(&b), "")); /* a failed string is never used */
    ps_strbuf_reset(&b);
    CHECK_OK(ps_strbuf_add(&b, "again"));
    CHECK(!strcmp(ps_strbuf_str(&b), "again"));
    b.failed = 1;
    CHECK(ps_strbuf_take(&b) == NULL); /* and freed */
    CHECK(b.p == NULL);
}

PS_TEST(strvec_is_a_null_terminated_argv_of_copies)
{
    ps_strvec v = {0};
    char word[] = "first";
    CHECK_OK(ps_strvec_push(&v, word));
    word[0] = 'F'; /* the vector holds its own copy */
    for (int i = 0; i < 40; i++)
        CHECK_OK(ps_strvec_pushf(&v, "--n%d", i));
    CHECK_EQ_INT(v.n, 41);
    CHECK(!strcmp(v.v[0], "first") && !strcmp(v.v[40], "--n39") && v.v[41] == NULL);
    v.failed = 1;
    CHECK_EQ_INT(ps_strvec_push(&v, "x"), PS_ENOMEM);
    CHECK_EQ_INT(v.n, 41);
    ps_strvec_free(&v);
    CHECK(v.v == NULL && v.n == 0 && !v.failed);
}
