/* stopnote.h: the coordinator's stop note, "<socket>.stopped", one line: why the cluster ended.
 *
 * Written when the coordinator ends the cluster (the run is complete, an operator's drain or
 * stop, a fatal error), removed when a coordinator starts (right after it takes its lock). A
 * coordinator that dies leaves none, and daemons keep waiting for it to come back. So a target
 * or drafter that finds no coordinator but this note knows the cluster is over: one started
 * after the end has nothing to do (ipc/peer.h), one that was away when STOP was sent is told
 * STOP by its client (ipc/client.h, client_opts.stop_note). */
#pragma once
#include <stddef.h>
#include <sys/types.h>

/* What a note's reason ends with when the coordinator left before every target and drafter had
 * (coordinator.dead_after_ms after the stop): what they write at the stop may be missing. */
#define STOP_NOTE_NOT_LEFT "had not left when the coordinator did"
/* The longest note kept, in bytes (without its newline): a longer one is cut. */
#define STOP_NOTE_MAX 254

/* Atomically (tmp + rename); group gid (the socket's; -1 keeps it), mode 0644 & umask. */
int stop_note_write(const char *sock, const char *reason, gid_t gid);
void stop_note_clear(const char *sock);
/* 1 and the reason in why when the note is there (a regular file), else 0. */
int stop_note_read(const char *sock, char *why, size_t n);
