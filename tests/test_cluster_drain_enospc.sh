#!/usr/bin/env bash
# test_cluster_drain_enospc.sh: the run's final checkpoint does not fit (drafter.checkpoint_dir
# a 64 KiB tmpfs of a private mount namespace; coordinator.min_free_mb = 0, so nothing pauses).
# Every batch trained, the drain's checkpoint fails; the drafter tries it again after 1, 2, 4 ...
# s, not on each wait slice (it was begun, failed and recorded as an error several times a
# second, for ever). Room made (the tmpfs grown), the next try lands and the run completes:
# every daemon exits 0. Twice: with the last step not a multiple of drafter.checkpoint_every
# (the drain's own checkpoint), and with checkpoint_every = 1 (every step's periodic one, also
# failing all through the training before). (Skipped without the right to make a mount namespace.)
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_private_mounts "$0" "$@"
cl_test_init

for every in 1000000 1; do
  cl_init "$T/c$every" 300 || exit 1
  mkdir -p "$CL_DIR/ck"
  mount -t tmpfs -o size=64k dflash-ck "$CL_DIR/ck" || { echo "SKIP: cannot mount a tmpfs"; exit 77; }
  cl_ini_add coordinator.min_free_mb=0 data.epochs=1 drafter.checkpoint_every=$every drafter.checkpoint_dir="$CL_DIR/ck"

  cl_start_coord || fail "coordinator did not come up"
  cl_start target0 target-d -c "$CL_INI" -i 0
  cl_start drafter0 drafter-d -c "$CL_INI" -i 0
  cl_wait 's["state"] == "draining"' 120 coord || fail "no final drain: $(cl_json 's["state"], s.get("reason")')"
  fails() { grep -c "checkpoint of step [0-9]*: .*No space left on device" "$CL_DIR/drafter0.log"; }
  errors() { cl_sql "SELECT count(*) FROM errors WHERE message LIKE 'checkpoint of step%'"; }
  n0=$(fails) e0=$(errors) w=$(cl_scaled 10)
  sleep "$w"
  n=$(( $(fails) - n0 )) rows=$(( $(errors) - e0 ))
  cl_log "checkpoint_every $every: $w s of a drain whose checkpoint does not fit: $n tries failed, $rows errors recorded ($n0 before the drain was seen)"
  # tries at 0, 1, 3, 7, 15 ... s (2^k - 1): at most one more than those within the window (5 in
  # 10 s; it was 30 to 50)
  most=1
  for ((k = 0; (1 << k) - 1 <= w; k++)); do most=$((most + 1)); done
  ((n >= 2 && n <= most)) || fail "checkpoint_every $every: $n failed tries of the drain's checkpoint in $w s (at most $most)"
  ((rows <= n)) || fail "$rows errors recorded for $n tries"
  grep -q "the drain's checkpoint is tried again in 4 s" "$CL_DIR/drafter0.log" ||
    fail "no backoff said: $(grep 'failed in a row' "$CL_DIR/drafter0.log" | tail -2)"
  cl_status || fail "dflashctl status"
  [[ $(cl_json 's["state"]') == draining ]] || fail "not draining any more: $(cl_json 's["state"], s.get("reason")')"

  mount -o remount,size=64m "$CL_DIR/ck" || fail "cannot grow the tmpfs"
  for n in coord target0 drafter0; do
    cl_wait_exit $n 90 || fail "$n: exit '$CL_RC' after room was made ($(tail -2 "$CL_DIR/$n.log"))"
  done
  grep -q "run complete" "$CL_DIR/coord.log" || fail "the run did not complete: $(tail -3 "$CL_DIR/coord.log")"
  cl_log "checkpoint_every $every: the drain's checkpoint landed once there was room; run complete, every daemon exited 0"
  umount "$CL_DIR/ck"
done
echo "ok: the drain's checkpoint tried again with a backoff while it did not fit, then the run completed"
