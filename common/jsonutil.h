/* jsonutil.h: reading a JSON file, the checks on parsed JSON that cJSON leaves to its caller, and
 * two fields the coordinator's and dflashctl's documents share. */
#pragma once
#include <stddef.h>
#include <cjson/cJSON.h>

/* A key that appears twice in one object, anywhere in the tree under node: cJSON keeps both
 * and finds the first, Python's json keeps the last, so such a file means different things to
 * different readers. Returns 1 and its dotted path in path (e.g. "rope_scaling.factor"), or 0. */
int json_duplicate_key(const cJSON *node, char *path, size_t pathlen);

/* text[0..len) as one JSON object, with nothing but whitespace after it (trailing bytes mean a
 * damaged or concatenated file), no NUL byte in it (the parser would stop there, the rest unseen)
 * and no key twice. text[len] must be 0. On error -DF_EFORMAT and "path: reason" in err. */
int json_parse_object(const char *text, size_t len, const char *path, cJSON **out, char *err, size_t errlen);

/* The regular file at path (at most max bytes) through json_parse_object. -DF_EMISSING when it
 * does not exist, -DF_ERANGE when larger than max, -errno when it cannot be read. */
int json_read_object(const char *path, size_t max, cJSON **out, char *err, size_t errlen);

/* "on_disk": whether the folder dir is there as this process sees it now (true/false; null where
 * it cannot tell, the folder not visible to it); dir NULL: false. */
void json_add_on_disk(cJSON *o, const char *dir);

/* key: the string s, or null when s is NULL. */
void json_add_string_or_null(cJSON *o, const char *key, const char *s);
