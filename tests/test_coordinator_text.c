/* test_coordinator_text.c: what the coordinator keeps of a peer's text, cut to fit its own
 * fields, stays UTF-8 (a character is never cut in two: a lone lead byte made `dflashctl --json`
 * invalid JSON and the journal line binary), and an operator's reason is kept whole behind the
 * longest name a peer may give. */
#include "common/text.h"
#include "tests/test_coord_util.h"

static void cleanup(void)
{
    tc_kill(TC.coord);
    ring_unlink(TC.ring);
}

/* s is UTF-8 without a control character (text_clean would change nothing). */
static void check_plain(const char *what, const char *s)
{
    if (s[text_plain_len(s)])
        TEST_FAIL("%s is not plain UTF-8 from byte %zu: '%s'", what, text_plain_len(s), s);
}

static const cJSON *departed(const cJSON *status, const char *name)
{
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItem(status, "daemons")) {
        const cJSON *n = cJSON_GetObjectItem(d, "name");
        if (cJSON_IsFalse(cJSON_GetObjectItem(d, "alive")) && cJSON_IsString(n) && !strcmp(n->valuestring, name))
            return d;
    }
    return NULL;
}

int main(void)
{
    atexit(cleanup);
    tc_setup(NULL, NULL);
    tc_dataset(TC.data, 50, 8, 100, 500);
    tc_start_coord();
    char err[512];

    /* A BYE whose reason has a 2-byte character across every cut the coordinator makes of it
     * (its own 96 bytes, the departed row's 96, with or without a prefix). */
    for (int at = 80; at < 100; at++) {
        char name[32], reason[200];
        snprintf(name, sizeof name, "drafter-bye-%d", at);
        memset(reason, 'x', (size_t)at);
        snprintf(reason + at, sizeof reason - (size_t)at, "\xc3\xa9 and the rest of the reason");
        struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_DRAFTER, .device = 3, .name = name };
        struct client *d;
        CHECK_OK(client_open(&d, &o, err, sizeof err));
        CHECK_OK(client_bye(d, 1, "%s", reason));
        tc_wait_acked(d, 3000);
        client_free(d);
        const cJSON *row = NULL;
        cJSON *s = NULL;
        for (int i = 0; i < 100 && !row; i++) {
            cJSON_Delete(s);
            tc_sleep_ms(30);
            s = tc_query(PROTO_Q_STATUS);
            row = departed(s, name);
        }
        if (!row)
            TEST_FAIL("%s is not among the departed", name);
        const char *left = cJSON_GetObjectItem(row, "left_reason")->valuestring;
        check_plain("left_reason", left);
        CHECK_CONTAINS(left, "xxxxxxxxxx");
        cJSON_Delete(s);
    }

    /* An operator's reason of PROTO_REASON_MAX bytes from a peer of the longest name: whole. */
    char name[PROTO_NAME_MAX], reason[PROTO_REASON_MAX + 1];
    memset(name, 'n', sizeof name - 3);
    snprintf(name + sizeof name - 3, 3, "\xc3\xa9");      /* (a character at the end of the name too) */
    memset(reason, 'r', sizeof reason - 1);
    memcpy(reason + sizeof reason - 5, "\xe2\x82\xac.", 4);
    reason[sizeof reason - 1] = 0;
    CHECK_INT(strlen(reason), ==, PROTO_REASON_MAX);
    struct client_opts o = { .socket_path = TC.sock, .role = PROTO_ROLE_CTL, .device = -1, .name = name };
    struct client *c;
    CHECK_OK(client_open(&c, &o, err, sizeof err));
    char *json = NULL;
    int status = -1;
    CHECK_OK(client_control(c, PROTO_CTL_PAUSE, reason, &json, &status, err, sizeof err));
    CHECK_INT(status, ==, 0);
    free(json);
    client_free(c);
    cJSON *s = tc_query(PROTO_Q_STATUS);
    const char *why = cJSON_GetObjectItem(s, "reason")->valuestring;
    check_plain("the cluster's reason", why);
    size_t n = strlen(why);
    if (n < strlen(reason) || strcmp(why + n - strlen(reason), reason))
        TEST_FAIL("the operator's reason is not kept whole: '%s'", why);
    CHECK(!strncmp(why, "pause by nnnn", 13));
    cJSON_Delete(s);
    puts("ok: a peer's text cut between characters; an operator's reason kept whole");
    return 0;
}
