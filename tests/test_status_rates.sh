#!/usr/bin/env bash
# test_status_rates.sh: what `dflashctl` shows of the daemons' speed follows what they do now, not
# what their last batch did. A target whose drafter stopped (SIGSTOP: the ring fills) shows its
# slot wait growing, and the training line says the stopped drafter's numbers are as last heard; a target that stopped itself is shown silent and left out of the targets'
# tokens/s; after a pause every rate falls to 0 within its 10 s window.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init 'cl_kill target0 CONT; cl_kill drafter0 CONT'

cl_init "$T/c" 4000 || exit 1
# silent after a third of dead_after_ms (5 s); seen silent for 10 s before it would be taken for
# dead (then it leaves targets(): the wait below could not see it any more)
cl_ini_add coordinator.dead_after_ms=$(($(cl_scaled 15) * 1000))
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 'step() >= 5 and all(d["tokens_per_s"] > 0 for d in targets() + drafters())' 60 coord ||
  fail "no rates while training: $(cl_json '[(d["role"], d.get("tokens_per_s")) for d in s["daemons"]]')"
cl_log "training: target $(cl_json 'targets()[0]["tokens_per_s"]') tok/s, group $(cl_json 'drafters()[0]["tokens_per_s"]') tok/s"

# the drafter stopped: the ring fills and the target's wait for a free slot shows as it grows
cl_kill drafter0 STOP
cl_wait 'targets()[0]["wait_ms"] > 1500' 20 coord ||
  fail "the target's slot wait does not grow with a full ring: $(cl_json 'targets()[0]["wait_ms"]') ms"
# ... and, silent, the training line says its numbers are as last heard
cl_wait 'drafters()[0]["silent"] and s["drafter"]["silent"]' 14 coord ||
  fail "a stopped drafter is not shown silent: $(cl_json '(drafters()[0]["silent"], s["drafter"].get("silent"))')"
"$CL_BIN/dflashctl" -s "$CL_SOCK" status >"$CL_DIR/status.txt"
grep -q "^training (as last heard: no drafter heard from lately): step" "$CL_DIR/status.txt" ||
  fail "dflashctl status shows a stopped drafter's training line as current: $(grep '^training' "$CL_DIR/status.txt")"
cl_kill drafter0 CONT

# the target stopped: silent (after 5 s here), not in the targets' sum
cl_kill target0 STOP
cl_wait 'targets()[0]["silent"] and s["drafter"]["target_tokens_per_s"] == 0' 14 coord ||
  fail "a stopped target is not shown silent: $(cl_json '(targets()[0]["silent"], s["drafter"]["target_tokens_per_s"])')"
"$CL_BIN/dflashctl" -s "$CL_SOCK" daemons >"$CL_DIR/daemons.txt"
grep -q "^target .*(silent for [0-9.]* s: as last heard)" "$CL_DIR/daemons.txt" ||
  fail "dflashctl daemons does not say the target is silent: $(cat "$CL_DIR/daemons.txt")"
cl_kill target0 CONT

# paused: nothing moves, every rate falls to 0 within its window
"$CL_BIN/dflashctl" -s "$CL_SOCK" pause "test" >/dev/null || fail "dflashctl pause"
cl_wait 'all(d["tokens_per_s"] == 0 and not d["silent"] for d in targets() + drafters())' 20 coord ||
  fail "rates after the pause: $(cl_json '[(d["role"], d.get("tokens_per_s")) for d in s["daemons"]]')"
"$CL_BIN/dflashctl" -s "$CL_SOCK" daemons >"$CL_DIR/daemons.txt"
grep -q "^target .* 0 tok/s" "$CL_DIR/daemons.txt" && grep -q "^drafter .* group 0 tok/s" "$CL_DIR/daemons.txt" ||
  fail "dflashctl daemons after the pause: $(cat "$CL_DIR/daemons.txt")"
cl_never "$CL_DIR/daemons.txt" ", h2d %.2f ms" "^drafter .*, h2d" "a CPU drafter (it reads the slot in place) shows an H2D time"
[[ $(cl_json 'drafters()[0]["h2d_ms"]') == 0 ]] || fail "a CPU drafter's h2d_ms: $(cl_json 'drafters()[0]["h2d_ms"]')"
cat "$CL_DIR/daemons.txt"
echo "ok: slot wait grows with a full ring, a stopped target is silent, rates fall to 0 when paused"
