/* sqlite_ro.h: opening an SQLite file (a coordinator's ledger) to read only, from another
 * process, leaving nothing beside it. A WAL database whose -wal file is not there was closed by its
 * last writer: SQLite opening it read-only the usual way would make the -wal and -shm files beside
 * it (and leave them), and cannot where the folder is not writable to the reader; opened
 * immutable (sqlite_ro_uri) it reads the file alone. A reader that did so checks afterwards that
 * no -wal file appeared meanwhile (a writer started on it): else its reading may be torn and is
 * done again the usual way (with the writer's WAL index). */
#pragma once
#include <stddef.h>

/* What SQLite would answer vaguely ("unable to open database file", or "file is not a database"
 * only at the first read): path is there, readable, a regular file with SQLite's header. *wal:
 * its header says WAL mode (read and write versions 2). 0, or <0 with the reason in err. */
int sqlite_ro_check(const char *path, int *wal, char *err, size_t errlen);

/* Whether path-wal is there, beside the file a link leads to, where SQLite looks. An answer other
 * than "no such file" counts as there. */
int sqlite_ro_wal_present(const char *path);

/* The URI (for SQLITE_OPEN_URI) that opens path read-only, immutable when asked: "file:" and the
 * path, every byte other than a letter, digit or one of "/._-~" as %XX (a '?' or '#' in a name is
 * the name's), an absolute path behind an empty authority. -ENAMETOOLONG when cap is too small. */
int sqlite_ro_uri(char *uri, size_t cap, const char *path, int immutable);
