/* fuzz_ctl.c: fuzz target for dflashctl's tables (daemons/dflashctl/show.c): the JSON reply of
 * a coordinator, or of whatever --connect reached, rendered by the table of one query. Byte 0
 * picks the query, the rest is the reply, read as dflashctl reads it (ctl_clean). Checked beyond
 * "no crash, no undefined behaviour" (a time out of range, a number where a string belongs): every
 * table prints its first line, and nothing but UTF-8 text and newlines (no escape sequence for the
 * terminal, whatever the reply's strings hold). */
#include <cjson/cJSON.h>
#include "daemons/dflashctl/show.c"
#include "tests/fuzz/fuzz.h"

int fuzz_ctl(const uint8_t *data, size_t size)
{
    static void (*const show[])(FILE *, const cJSON *) = {
        ctl_show_status, ctl_show_ring, ctl_show_daemons, ctl_show_batches, ctl_show_errors, ctl_show_checkpoints,
        ctl_show_ledger_status, ctl_show_ledger_batches,
    };
    if (size < 1)
        return 0;
    cJSON *doc = cJSON_ParseWithLength((const char *)data + 1, size - 1);
    if (!doc)
        return 0;
    ctl_clean(doc);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (out) {
        show[data[0] % (sizeof show / sizeof show[0])](out, doc);
        FUZZ_ASSERT(fclose(out) == 0);
        FUZZ_ASSERT(text && len > 0 && memchr(text, '\n', len));
        for (size_t i = 0; i < len; i++) {
            FUZZ_ASSERT(text[i] != '\0');
            if (text[i] == '\n')
                text[i] = ' ';
        }
        FUZZ_ASSERT(text_plain_len(text) == len);
        free(text);
    }
    cJSON_Delete(doc);
    return 0;
}
