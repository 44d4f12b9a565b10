#!/usr/bin/env bash
# test_coordinator_accept_nomem.sh: a connection the coordinator has no memory for is held, not
# dropped, and the listener keeps listening. A shim (LD_PRELOAD, compiled here) fails the
# calloc of a connection's state while a flag file exists: a dflashctl started then gets its
# answer once the flag is gone, and later ones are answered too. (The coordinator once returned
# without accepting: libuv stops polling a listener until an accept, so it took no connection
# again, while its watchdog kept it alive.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cc=${CC:-cc}
cat >"$T/sz.c" <<'EOF2'
#include <stdio.h>
#include "daemons/coordinator/coord.h"
int main(void) { printf("%zu\n", sizeof(struct member)); return 0; }
EOF2
"$cc" -std=gnu11 -I. -o "$T/sz" "$T/sz.c" || fail "cannot build the size probe"
cat >"$T/nomem.c" <<'EOF2'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
/* calloc(1, DFLASH_NOMEM_SIZE) fails while the file DFLASH_NOMEM_FLAG exists; all else is the
 * real calloc's (found on first use; dlsym's own allocations meanwhile get NULL, which it takes). */
void *calloc(size_t n, size_t size)
{
    static void *(*real)(size_t, size_t);
    static __thread int resolving;
    if (!real) {
        if (resolving)
            return NULL;
        resolving = 1;
        real = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
        resolving = 0;
    }
    static size_t target = (size_t)-1;
    static const char *flag;
    if (target == (size_t)-1) {
        const char *s = getenv("DFLASH_NOMEM_SIZE");
        flag = getenv("DFLASH_NOMEM_FLAG");
        target = s ? strtoul(s, NULL, 10) : 0;
    }
    if (n == 1 && size == target && flag && access(flag, F_OK) == 0)
        return NULL;
    return real(n, size);
}
EOF2
"$cc" -shared -fPIC -o "$T/nomem.so" "$T/nomem.c" -ldl || fail "cannot build the calloc shim"
size=$("$T/sz") || fail "size probe"

cl_init "$T/c" 50 || exit 1
(export LD_PRELOAD=$T/nomem.so DFLASH_NOMEM_SIZE=$size DFLASH_NOMEM_FLAG=$T/nomem.flag
 export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
 exec "$CL_BIN/coordinator-d" -c "$CL_INI") >>"$CL_DIR/coord.log" 2>&1 &
CL_PIDS[coord]=$!
cl_wait 's["state"] == "running"' 30 coord || fail "coordinator did not come up"

touch "$T/nomem.flag"
"$CL_BIN/dflashctl" -s "$CL_SOCK" status >"$T/held.out" 2>&1 &
held=$!
cl_wait_log "$CL_DIR/coord.log" "no memory for the connection: held until there is" 10 ||
  fail "the connection's allocation did not fail: $(tail -3 "$CL_DIR/coord.log")"
sleep 0.5
kill -0 "$held" 2>/dev/null || fail "dflashctl did not wait for its held connection: $(cat "$T/held.out")"
rm -f "$T/nomem.flag"
wait "$held" || fail "the held connection was not answered: $(cat "$T/held.out")"
grep -q "running" "$T/held.out" || fail "status of the held connection: $(cat "$T/held.out")"
cl_wait_log "$CL_DIR/coord.log" "memory again: the connection held is taken" 5 || fail "no notice of the connection taken"
for i in 1 2 3; do
  "$CL_BIN/dflashctl" -s "$CL_SOCK" status >/dev/null || fail "connection $i after the shortage was not answered"
done
(($(grep -c "no memory for the connection" "$CL_DIR/coord.log") == 1)) || fail "the held connection is logged more than once"
echo "ok: a connection without memory is held and then answered; the listener listens on"
