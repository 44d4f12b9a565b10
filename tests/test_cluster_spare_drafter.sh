#!/usr/bin/env bash
# test_cluster_spare_drafter.sh: a rank on its way into a generation that has already ended, a
# later one (formed with a spare drafter) having raised the checkpoint folder's fence. world_size
# 2, three drafters: generation 1 is drafter0 + drafter1, drafter0 (rank 0) writing a slow
# checkpoint. drafter1 dies: generation 2 forms of drafter0 + drafter2, and drafter0 waits for its
# write before it joins. drafter2 dies too, both come back: generation 3 forms of drafter1 +
# drafter2 and raises the fence to 3. drafter0 then meets a fence past its generation 2: that
# generation ended (its RESTART is queued), so it goes on to the next; a fence past the ledger's
# generation with no RESTART coming is the ledger gone back (test_cluster_ledger_restored). It
# was taken for that at once: exit 78, the healthy cluster FAILED.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 1500 || exit 1
delay=$(($(cl_scaled 1) * 15000))
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=10 drafter.debug_ckpt_delay_ms=$delay data.epochs=50
cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_wait 's["group"]["active"] and s["group"]["generation"] == 1 and step() >= 12' 120 coord || fail "no steps in generation 1"
cl_start drafter2 drafter-d -c "$CL_INI" -i 2
cl_wait_log "$CL_DIR/drafter2.log" "waiting for the drafter group|ready" 30 || true
sleep 1
cl_kill drafter1 KILL
cl_wait_exit drafter1 10 || true
cl_wait 's["group"]["active"] and s["group"]["generation"] == 2' 30 coord || fail "no generation 2: $(cl_json 's["group"]')"
cl_kill drafter2 KILL
cl_wait_exit drafter2 10 || true
cl_start drafter1 drafter-d -c "$CL_INI" -i 1
cl_start drafter2 drafter-d -c "$CL_INI" -i 2
cl_wait 's["group"]["active"] and s["group"]["generation"] == 3' 60 coord || fail "no generation 3: $(cl_json 's["group"]')"
[[ $((16#$(cat "$CL_DIR/state/checkpoints/generation"))) == 3 ]] || fail "the fence is not at 3"
cl_wait_log "$CL_DIR/drafter0.log" "joining generation 2: generation 2 ended while this rank joined it \(a later one has raised the checkpoint folder's fence\)" \
  $((delay / 1000 + 30)) || fail "drafter0 did not take generation 2 for ended: $(grep -v ' = \|^#' "$CL_DIR/drafter0.log" | tail -3)"
cl_alive drafter0 || fail "drafter0 left: $(grep -v ' = \|^#' "$CL_DIR/drafter0.log" | tail -3)"
step=$(cl_json 'step()')
cl_wait 's["state"] == "running" and step() >= '"$((step + 5))" 60 coord ||
  fail "the cluster did not go on: $(cl_json 's["state"], s["reason"]')"
cl_never "$CL_DIR/coord.log" "fatal error from %s" "fatal error from" "a fatal error was reported"
echo "ok: a rank that met the fence of a later generation on its way in went on; the cluster trains"
