/* text.h: text that dflash shows people (log lines, `dflashctl`'s tables, its JSON, the ledger's
 * messages) is UTF-8 with no control character. Text a peer wrote is made so as it is read
 * (ipc/proto.c); text cut to fit a field is cut between characters, never inside one (a lone lead
 * byte makes the JSON invalid and a journal line binary). */
#pragma once
#include <stddef.h>

/* The length of s's longest prefix of at most max bytes that ends between two characters (s is
 * valid UTF-8 up to its NUL; the prefix is s whole when strlen(s) <= max). */
size_t text_fit(const char *s, size_t max);

/* s, cut at most to its first max bytes as text_fit says (a NUL written there). */
void text_cut(char *s, size_t max);

/* In place: every byte that is not part of a well-formed UTF-8 character, and every control
 * character (C0, DEL, C1 U+0080..U+009F: a newline would forge a log line, an escape drive a
 * terminal), becomes '?' (one per byte). The length stays. */
void text_clean(char *s);

/* The length of s's longest prefix that text_clean leaves as it is (strlen(s): s is plain text). */
size_t text_plain_len(const char *s);

/* Two lines of space-separated "key=value" words, a daemon's own (mine) and the one it must match
 * (theirs): 1 and "KEY is A here, B in the run" in out for the first key, of mine then of theirs,
 * whose values differ (a key one line lacks: "none"), else 0 and "". */
int text_kv_diff(const char *mine, const char *theirs, char *out, size_t n);
