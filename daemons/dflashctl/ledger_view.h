/* ledger_view.h: dflashctl --ledger: the run as a coordinator's ledger file records it, read
 * without a coordinator and without writing to the file (ledger_view.c). */
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

enum ledger_view_what {
    LEDGER_VIEW_NONE = 0,       /* (a command the ledger cannot answer: ring, daemons, controls) */
    LEDGER_VIEW_STATUS,         /* the run's summary: ctl_show_ledger_status */
    LEDGER_VIEW_BATCHES,        /* counts, epochs, the batches changed last: ctl_show_ledger_batches */
    LEDGER_VIEW_ERRORS,         /* the coordinator's `errors` document: ctl_show_errors */
    LEDGER_VIEW_CHECKPOINTS,    /* the coordinator's `checkpoints` document: ctl_show_checkpoints */
};

/* Read the ledger at path (SQLite, read-only: the file is never created or written, also while a
 * coordinator has it open) into the JSON document of `what`, with at most `limit` rows of
 * batches, errors or checkpoints, newest first. 0 with *out (cJSON_Delete it), or <0 with the
 * reason in err (without the path: "not an SQLite database ...", "ledger schema 3, ..."). */
int ledger_view_read(const char *path, enum ledger_view_what what, uint32_t limit, cJSON **out, char *err,
                     size_t errlen);
