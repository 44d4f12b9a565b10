/* show.h: dflashctl's human-readable tables of the coordinator's QUERY replies and of the ledger
 * view's documents (show.c). */
#pragma once
#include <cjson/cJSON.h>
#include <stdio.h>

/* One per query (the reply's parsed JSON document), printed to out. */
void ctl_show_status(FILE *out, const cJSON *s);
void ctl_show_ring(FILE *out, const cJSON *r);
void ctl_show_daemons(FILE *out, const cJSON *d);
void ctl_show_batches(FILE *out, const cJSON *b);
void ctl_show_errors(FILE *out, const cJSON *e);
void ctl_show_checkpoints(FILE *out, const cJSON *c);
/* dflashctl --ledger's own documents (ledger_view.c; its errors and checkpoints print as above). */
void ctl_show_ledger_status(FILE *out, const cJSON *s);
void ctl_show_ledger_batches(FILE *out, const cJSON *b);

/* o's string member k, or "" when it is missing or not a string. */
const char *ctl_str(const cJSON *o, const char *k);
/* cJSON_Parse, then every string in the document (keys too) made plain text (common/text.h):
 * what the tables print is never a control sequence for the terminal, whoever wrote it. */
cJSON *ctl_parse(const char *json);
/* The same for a document read otherwise (a ledger's). */
void ctl_clean(cJSON *doc);
