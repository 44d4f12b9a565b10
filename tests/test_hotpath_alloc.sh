#!/usr/bin/env bash
# test_hotpath_alloc.sh: target-d and drafter-d make no heap allocation, and open and map no file,
# per batch. A shim (LD_PRELOAD, compiled here) counts every malloc-family call, mmap, munmap,
# open, openat and fopen of a daemon, by call site, and writes the counts when the process exits.
# The same CPU cluster (2 targets, 2 data-parallel drafters, one checkpoint at the end) runs an
# epoch twice, of about 60 and of about 240 batches: a daemon's counts must not grow with the
# batches. A few calls are allowed for arrays that double when the coordinator answers late; one
# per batch would be some 180. The call sites that grew are printed, named by addr2line.
# (Skipped in sanitizer builds: their runtimes own malloc.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

for b in target-d drafter-d; do
  if grep -qaE '__(asan|tsan|msan)_init' "$CL_BIN/$b"; then
    echo "SKIP: $b is a sanitizer build (its runtime owns malloc)"
    exit 77
  fi
done

cc=${CC:-cc}
cat >"$T/count.c" <<'EOF2'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>
/* glibc's own entry points: no dlsym (which allocates) on the malloc path. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

/* call site (return address) and kind -> count; open addressing, never removed, lock-free */
#define NSITES 8192
static _Atomic uintptr_t site[NSITES];
static _Atomic uint64_t count[NSITES];
static const char *kinds[] = { "malloc", "calloc", "realloc", "memalign", "mmap", "munmap", "open", "fopen" };
enum { K_MALLOC, K_CALLOC, K_REALLOC, K_MEMALIGN, K_MMAP, K_MUNMAP, K_OPEN, K_FOPEN };
static _Atomic uint64_t lost;

static void note(void *ret, int kind)
{
    uintptr_t key = ((uintptr_t)ret << 3) | (uintptr_t)kind;
    size_t h = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 51);
    for (size_t i = 0; i < NSITES; i++) {
        size_t j = (h + i) & (NSITES - 1);
        uintptr_t k = atomic_load(&site[j]);
        if (k == 0) {
            uintptr_t zero = 0;
            if (atomic_compare_exchange_strong(&site[j], &zero, key))
                k = key;
            else
                k = zero;
        }
        if (k == key) {
            atomic_fetch_add(&count[j], 1);
            return;
        }
    }
    atomic_fetch_add(&lost, 1);
}

#define RET __builtin_return_address(0)
void *malloc(size_t n) { note(RET, K_MALLOC); return __libc_malloc(n); }
void *calloc(size_t n, size_t s) { note(RET, K_CALLOC); return __libc_calloc(n, s); }
void *realloc(void *p, size_t n) { note(RET, K_REALLOC); return __libc_realloc(p, n); }
void *aligned_alloc(size_t a, size_t n) { note(RET, K_MEMALIGN); return __libc_memalign(a, n); }
void *memalign(size_t a, size_t n) { note(RET, K_MEMALIGN); return __libc_memalign(a, n); }
int posix_memalign(void **p, size_t a, size_t n)
{
    note(RET, K_MEMALIGN);
    void *q = __libc_memalign(a, n);
    if (!q)
        return 12;
    *p = q;
    return 0;
}

#define REAL(name) static __typeof__(name) *real_##name; if (!real_##name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)
void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
    REAL(mmap);
    note(RET, K_MMAP);
    return real_mmap(a, n, prot, flags, fd, off);
}
int munmap(void *a, size_t n) { REAL(munmap); note(RET, K_MUNMAP); return real_munmap(a, n); }
int open(const char *path, int flags, ...)
{
    REAL(open);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
    va_end(ap);
    note(RET, K_OPEN);
    return real_open(path, flags, mode);
}
int openat(int dir, const char *path, int flags, ...)
{
    REAL(openat);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
    va_end(ap);
    note(RET, K_OPEN);
    return real_openat(dir, path, flags, mode);
}
FILE *fopen(const char *path, const char *mode) { REAL(fopen); note(RET, K_FOPEN); return real_fopen(path, mode); }

/* "COUNT KIND OBJECT OFFSET" per call site, into $DFLASH_COUNT_OUT */
__attribute__((destructor)) static void dump(void)
{
    const char *out = getenv("DFLASH_COUNT_OUT");
    if (!out)
        return;
    FILE *f = fopen(out, "we");
    if (!f)
        return;
    for (size_t j = 0; j < NSITES; j++) {
        uintptr_t k = atomic_load(&site[j]);
        if (!k)
            continue;
        void *ret = (void *)(k >> 3);
        Dl_info di;
        if (dladdr(ret, &di) && di.dli_fname)
            fprintf(f, "%llu %s %s 0x%lx\n", (unsigned long long)atomic_load(&count[j]), kinds[k & 7], di.dli_fname,
                    (unsigned long)((uintptr_t)ret - (uintptr_t)di.dli_fbase));
        else
            fprintf(f, "%llu %s ? 0x%lx\n", (unsigned long long)atomic_load(&count[j]), kinds[k & 7], (unsigned long)ret);
    }
    if (atomic_load(&lost))
        fprintf(f, "%llu lost ? 0x0\n", (unsigned long long)atomic_load(&lost));
    fclose(f);
}
EOF2
"$cc" -std=gnu11 -O2 -shared -fPIC -o "$T/count.so" "$T/count.c" -ldl || fail "cannot build the counting shim"

# run NAME SAMPLES: one epoch of the cluster with counted targets and drafters; the batches in BATCHES
run() {
  local name=$1 samples=$2 i n
  cl_init "$T/$name" "$samples" >/dev/null || fail "cl_init $name"
  cl_ini_add drafter.world_size=2 drafter.checkpoint_every=100000 drafter.min_ready=2 drafter.ready_timeout_ms=300
  cl_start coord coordinator-d -c "$CL_INI"
  cl_wait 's["state"] == "running"' 30 || fail "$name: coordinator did not come up"
  for i in 0 1; do
    for n in target drafter; do
      DFLASH_COUNT_OUT=$T/$name/$n$i.count LD_PRELOAD=$T/count.so cl_start $n$i $n-d -c "$CL_INI" -i $i
    done
  done
  for n in target0 target1 drafter0 drafter1 coord; do
    cl_wait_exit $n 300 || fail "$name: $n exited with '$CL_RC'"
  done
  for n in target0 target1 drafter0 drafter1; do
    [[ -s $T/$name/$n.count ]] || fail "$name: $n wrote no counts"
  done
  BATCHES=$(cl_sql 'SELECT count(*) FROM batches WHERE state = 4')
  cl_cleanup
}

run small 220
small=$BATCHES
run large 880
large=$BATCHES
echo "epochs of $small and $large batches"
((large - small >= 100)) || fail "the two epochs differ by $((large - small)) batches, too few to tell"

bad=0
for n in target0 target1 drafter0 drafter1; do
  # call sites whose counts grew with the batches, addr2line'd where the object is ours
  "$CL_PY" - "$T/small/$n.count" "$T/large/$n.count" "$n" "$((large - small))" >"$T/$n.diff" <<'EOF2' || bad=1
import subprocess, sys
def load(path):
    d = {}
    for line in open(path):
        c, kind, obj, off = line.split()
        d[(kind, obj, off)] = d.get((kind, obj, off), 0) + int(c)
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
name, batches = sys.argv[3], int(sys.argv[4])
grew = sorted(((b[k] - a.get(k, 0), k) for k in b if b[k] > a.get(k, 0)), reverse=True)
total = sum(g for g, _ in grew)
calls = sum(b.values())
print("%s: %d counted calls in the larger epoch, %d more than in the smaller one (%d batches more)"
      % (name, calls, total, batches))
for g, (kind, obj, off) in grew[:12]:
    where = off
    if "/bin/" in obj:
        try:
            where = subprocess.run(["addr2line", "-f", "-i", "-p", "-e", obj, hex(int(off, 16) - 1)],
                                   capture_output=True, text=True, timeout=20).stdout.strip().replace("\n", " <- ")
        except Exception:
            pass
    print("  +%d %s from %s %s" % (g, kind, obj.rsplit("/", 1)[-1], where))
sys.exit(1 if total > 16 or any(k[0] == "lost" for k in b) else 0)
EOF2
  cat "$T/$n.diff"
done
((bad == 0)) || fail "a daemon allocates, maps or opens per batch (the call sites above)"
echo "ok: no per-batch allocation, mapping or file open in target-d and drafter-d ($small and $large batches)"
