/* jsonutil.h: checks on parsed JSON that cJSON leaves to its caller. */
#pragma once
#include <stddef.h>
#include <cjson/cJSON.h>

/* A key that appears twice in one object, anywhere in the tree under node: cJSON keeps both
 * and finds the first, Python's json keeps the last, so such a file means different things to
 * different readers. Returns 1 and its dotted path in path (e.g. "rope_scaling.factor"), or 0. */
int json_duplicate_key(const cJSON *node, char *path, size_t pathlen);
