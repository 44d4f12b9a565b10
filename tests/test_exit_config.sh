#!/usr/bin/env bash
# test_exit_config.sh: a daemon that can never run as configured exits 78 (systemd's "not
# configured": not restarted) with one line saying what to change, not 1 (restarted for ever,
# each time loading the model again into the same failure).
#  - target-d on the CPU backend whose fp32 weights and scratch are larger than the host's memory
#    (the host made small with an LD_PRELOAD shim over sysconf(_SC_PHYS_PAGES), compiled here);
#  - target-d and drafter-d on the CUDA backend with an instance index past this host's GPUs (on a
#    host without any: index 0); the drafter's is not fatal to the cluster (test_exit_report). Not
#    run in a build without CUDA;
#  - target-d that cannot open the dataset the coordinator schedules (the path gone for it):
#    reported to the coordinator as its exit, not fatal to the cluster; one replaced by a file
#    that is no dataset fails the cluster.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 50 || exit 1
cc=${CC:-cc}
cat >"$T/small_host.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
/* A host of 16 pages: sysconf(_SC_PHYS_PAGES) says so, everything else is the real one's. */
long sysconf(int name)
{
    long (*real)(int) = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
    return name == _SC_PHYS_PAGES ? 16 : real(name);
}
EOF
"$cc" -shared -fPIC -o "$T/small_host.so" "$T/small_host.c" -ldl || fail "cannot build the sysconf shim"

# one line on stderr naming the fix, exit 78, before the daemon connects
expect78() {
  local name=$1 want=$2
  cl_wait_exit "$name" 60
  [[ $CL_RC == 78 ]] || fail "$name exited with '$CL_RC', wanted 78: $(tail -3 "$CL_DIR/$name.log")"
  grep -q -- "$want" "$CL_DIR/$name.log" || fail "$name does not say '$want': $(tail -3 "$CL_DIR/$name.log")"
  echo "ok: $name: exit 78: $(grep -m1 -- "$want" "$CL_DIR/$name.log")"
}

# (ASan must come first among the libraries; the shim need not be)
(export LD_PRELOAD=$T/small_host.so ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
 exec "$CL_BIN/target-d" -c "$CL_INI" -i 0) >>"$CL_DIR/target_mem.log" 2>&1 &
CL_PIDS[target_mem]=$!
expect78 target_mem "more than this host's .* GiB: lower ring.max_tokens"

# a model file that cannot be opened for want of descriptors (a shim says EMFILE for it): that
# may pass, so exit 1 (restarted), not 78
cat >"$T/emfile.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
/* open() of a path ending in $EMFILE_SUFFIX (model.safetensors) fails with EMFILE; every other
 * is the real one. */
int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    const char *suffix = getenv("EMFILE_SUFFIX") ? getenv("EMFILE_SUFFIX") : "model.safetensors";
    size_t n = strlen(path), k = strlen(suffix);
    if (n >= k && !strcmp(path + n - k, suffix)) {
        errno = EMFILE;
        return -1;
    }
    int (*real)(const char *, int, ...) = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    return real(path, flags, mode);
}
EOF
"$cc" -shared -fPIC -o "$T/emfile.so" "$T/emfile.c" -ldl || fail "cannot build the open shim"
(export LD_PRELOAD=$T/emfile.so ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
 exec "$CL_BIN/target-d" -c "$CL_INI" -i 0) >>"$CL_DIR/target_fd.log" 2>&1 &
CL_PIDS[target_fd]=$!
cl_wait_exit target_fd 60
[[ $CL_RC == 1 ]] || fail "target-d without a descriptor for its model exited '$CL_RC', wanted 1: $(tail -3 "$CL_DIR/target_fd.log")"
grep -q "model.safetensors.*Too many open files" "$CL_DIR/target_fd.log" || fail "no reason given: $(tail -3 "$CL_DIR/target_fd.log")"
echo "ok: target_fd: exit 1: $(grep -m1 "Too many open files" "$CL_DIR/target_fd.log")"
# ... and so may a config file that cannot be read for want of one (it was 78: never restarted)
(export LD_PRELOAD=$T/emfile.so EMFILE_SUFFIX=.ini ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
 exec "$CL_BIN/target-d" -c "$CL_INI" -i 0) >>"$CL_DIR/target_cfg_fd.log" 2>&1 &
CL_PIDS[target_cfg_fd]=$!
cl_wait_exit target_cfg_fd 60
[[ $CL_RC == 1 ]] || fail "target-d without a descriptor for its config exited '$CL_RC', wanted 1: $(tail -3 "$CL_DIR/target_cfg_fd.log")"
grep -q "$(basename "$CL_INI").*Too many open files" "$CL_DIR/target_cfg_fd.log" ||
  fail "no reason given: $(tail -3 "$CL_DIR/target_cfg_fd.log")"
echo "ok: target_cfg_fd: exit 1: $(grep -m1 "Too many open files" "$CL_DIR/target_cfg_fd.log")"
# ... and the model's config.json, by target-d and drafter-d
for d in target drafter; do
  (export LD_PRELOAD=$T/emfile.so EMFILE_SUFFIX=config.json ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
   exec "$CL_BIN/$d-d" -c "$CL_INI" -i 0) >>"$CL_DIR/${d}_hf_fd.log" 2>&1 &
  CL_PIDS[${d}_hf_fd]=$!
  cl_wait_exit ${d}_hf_fd 60
  [[ $CL_RC == 1 ]] || fail "$d-d without a descriptor for config.json exited '$CL_RC', wanted 1: $(tail -3 "$CL_DIR/${d}_hf_fd.log")"
  grep -q "config.json.*Too many open files" "$CL_DIR/${d}_hf_fd.log" || fail "no reason given: $(tail -3 "$CL_DIR/${d}_hf_fd.log")"
done

cl_start_coord || fail "coordinator did not come up"
# a coordinator of another cluster (its own runtime and state folders, so its own lock) given
# this one's socket: it leaves the socket of the coordinator answering there alone (it removed
# it as stale, and the running cluster's daemons and dflashctl could no longer reach it)
mkdir -p "$CL_DIR/run2" "$CL_DIR/state2"
for other in "$CL_NAME" "${CL_NAME}b"; do
  cl_start coord_b coordinator-d -c "$CL_INI" -o cluster.name="$other" -o cluster.runtime_dir="$CL_DIR/run2" \
    -o cluster.state_dir="$CL_DIR/state2" -o cluster.socket="$CL_SOCK"
  expect78 coord_b "control socket $CL_SOCK: a process listens there (the coordinator of another cluster, or another program): left alone"
  "$CL_BIN/dflashctl" -s "$CL_SOCK" status >/dev/null || fail "the running coordinator cannot be reached any more"
done
# the TCP listener on an address not this host's (TEST-NET-1): exit 78, not a restart loop
printf 's3cret-token-of-the-test-cluster\n' >"$T/tcp.token"; chmod 600 "$T/tcp.token"
cl_start coord_c coordinator-d -c "$CL_INI" -o cluster.name="${CL_NAME}c" -o cluster.runtime_dir="$CL_DIR/run2" \
  -o cluster.state_dir="$CL_DIR/state2" -o cluster.tcp_listen=192.0.2.1:9 -o cluster.tcp_token_file="$T/tcp.token"
expect78 coord_c "cluster.tcp_listen 192.0.2.1:9: address not available"
mv "$CL_DIR/data.bin" "$CL_DIR/data.away"     # the coordinator keeps its mapping of it
cl_start target_data target-d -c "$CL_INI" -i 0
expect78 target_data "data.bin: cannot open: No such file or directory"
mv "$CL_DIR/data.away" "$CL_DIR/data.bin"
"$CL_BIN/dflashctl" -s "$CL_SOCK" errors >"$CL_DIR/errors.txt" || fail "dflashctl errors"
grep -q "target-d@0 exits: .*data.bin: cannot open" "$CL_DIR/errors.txt" &&
  grep -q "errors: 1 (0 fatal)" "$CL_DIR/errors.txt" || fail "dflashctl errors: $(cat "$CL_DIR/errors.txt")"
cl_status && [[ $(cl_json 's["state"]') == running ]] || fail "the cluster is not running: $(cl_json 's["state"]')"

if "$CL_BIN/target-d" -c "$CL_INI" -i 0 -o target.backend=cuda -t 2>&1 | grep -q "this build has no CUDA"; then
  echo "(a build without CUDA: the device index cases are not run)"
else
  n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then   # the GPUs this process sees
    n_gpu=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
  fi
  cl_start target_dev target-d -c "$CL_INI" -i "$n_gpu" -o target.backend=cuda
  expect78 target_dev "device $n_gpu: $n_gpu GPUs* visible to this process"
  cl_start drafter_dev drafter-d -c "$CL_INI" -i "$n_gpu" -o drafter.backend=cuda
  expect78 drafter_dev "device $n_gpu: $n_gpu GPUs* visible to this process"
  "$CL_BIN/dflashctl" -s "$CL_SOCK" errors >"$CL_DIR/errors.txt" || fail "dflashctl errors"
  grep -q "drafter-d@$n_gpu exits: .*device $n_gpu: $n_gpu GPUs* visible" "$CL_DIR/errors.txt" &&
    grep -q "errors: 2 (0 fatal)" "$CL_DIR/errors.txt" || fail "dflashctl errors: $(cat "$CL_DIR/errors.txt")"
  cl_status && [[ $(cl_json 's["state"]') == running ]] || fail "the cluster is not running: $(cl_json 's["state"]')"
fi

# a dataset file replaced (renamed over) by one that is not a dataset: nobody's restart mends
# that, the cluster fails with the reason
# (random bytes after an 'X': never taken for JSON or compressed data, whose errors say more)
{ printf X; head -c 4095 /dev/urandom; } >"$CL_DIR/data.new" && mv "$CL_DIR/data.new" "$CL_DIR/data.bin"
cl_start target_bad target-d -c "$CL_INI" -i 0
expect78 target_bad "data.bin: not a dflash dataset (bad magic) (data.path: replaced after the coordinator opened it: put the old file back)"
cl_wait_log "$CL_DIR/coord.log" "cluster .* -> failed: target-d@0: .*data.bin: not a dflash dataset" 30 ||
  fail "the cluster did not fail: $(tail -3 "$CL_DIR/coord.log")"
