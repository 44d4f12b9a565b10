#!/usr/bin/env bash
# test_cluster_mismatch.sh: a target whose view of the run differs from the coordinator's says so
# and stops, instead of a restart loop or silently wrong training data:
#  - its own ring.max_tokens is smaller than the ring's slots (its forward buffers are sized by
#    it): exit 78, the unit is not restarted, the message names ring.max_tokens; a non-fatal
#    error: the cluster runs on (one stray target must not end a run), and a target as
#    configured joins and publishes;
#  - the dataset file at data.path is not the one the coordinator scheduled (here: rebuilt with
#    one more token in every sample): its checksum is not the one in the coordinator's WELCOME;
#    exit 78, a fatal error naming the file, the cluster fails, no batch is published;
#  - the dataset rewritten in place under a running target (its index now pointing outside the
#    tokens): the next batch it packs is refused, naming the file, not read out of bounds;
#  - the dataset replaced (renamed over) by one of the same sample lengths, other tokens, while
#    the cluster runs: the coordinator started again refuses its ledger (it was written for the
#    old file) with the reason; started on a new ledger, the target still reading the old file
#    leaves (its reconnect's WELCOME names another checksum) instead of packing stale tokens;
#  - the dataset truncated in place under a running target: its next read of the mapping faults
#    (SIGBUS); it dies of it, naming the file in one line, and systemd would restart it (a file that
#    shrank is then refused at load).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

cl_init "$T/c" 200 || exit 1
cl_start_coord || fail "coordinator did not come up"

cl_start small target-d -c "$CL_INI" -i 0 -o ring.max_tokens=256
cl_wait_exit small 60
[[ $CL_RC == 78 ]] || fail "a target with a smaller ring.max_tokens exited with '$CL_RC', wanted 78"
grep -q "carries 512 tokens a slot, this target's ring.max_tokens is 256" "$CL_DIR/small.log" ||
  fail "no clear message: $(tail -n 3 "$CL_DIR/small.log")"
cl_wait 's["error_count"] >= 1' 10 coord || fail "the refused target's error did not reach the coordinator"
[[ $(cl_json 's["state"], s["fatal_count"]') == "('running', 0)" ]] ||
  fail "one refused target changed the cluster: $(cl_json 's["state"], s["reason"], s["fatal_count"]')"
"$CL_BIN/dflashctl" -s "$CL_SOCK" errors | grep -q "exits: .*this target's ring.max_tokens is 256" ||
  fail "dflashctl errors does not say why the target left: $("$CL_BIN/dflashctl" -s "$CL_SOCK" errors)"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_wait 'any(d.get("published", 0) > 0 for d in targets())' 30 coord || fail "a target as configured did not publish"
"$CL_BIN/dflashctl" -s "$CL_SOCK" stop >/dev/null || fail "dflashctl stop"
cl_wait_exit coord 30
[[ $CL_RC == 0 ]] || fail "the coordinator exited with '$CL_RC' after the stop"
cl_wait_exit target0 30
cl_log "smaller ring.max_tokens: $(grep -h "carries" "$CL_DIR/small.log" | sed 's/^<[0-9]>//')"

cl_init "$T/c2" 200 || exit 1
cl_start_coord || fail "second coordinator did not come up"

"$CL_BIN/dflash-data" dump "$CL_DIR/data.bin" |
  "$CL_PY" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r["input_ids"].append(1); r["loss_mask"].append(1)
    print(json.dumps(r))' >"$T/longer.jsonl" || fail "dump"
"$CL_BIN/dflash-data" build -o "$CL_DIR/data.bin" -v 256 "$T/longer.jsonl" >/dev/null || fail "rebuild"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_wait_exit target0 60
[[ $CL_RC == 78 ]] || fail "the target on another dataset exited with '$CL_RC', wanted 78"
grep -q "$CL_DIR/data.bin: checksum [0-9a-f]*, but the coordinator schedules a dataset of checksum [0-9a-f]*: the file was replaced after the coordinator opened it: put the old file back" \
  "$CL_DIR/target0.log" || fail "no clear message: $(tail -n 3 "$CL_DIR/target0.log")"
cl_wait_exit coord 30
[[ $CL_RC != 0 ]] || fail "the coordinator ended the run as done"
grep -q "exiting: failed: .*the file was replaced after the coordinator opened it" "$CL_DIR/coord.log" ||
  fail "the cluster did not fail on the fatal error: $(tail -n 2 "$CL_DIR/coord.log")"
[[ $(cl_sql 'SELECT count(*) FROM batches WHERE state >= 2') == 0 ]] || fail "a batch was published from the other dataset"
# A coordinator started again on the replaced file (other lengths: another schedule too) says it
# was replaced, and that the old file will do (not only "move the ledger away")
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait_exit coord2 30
[[ $CL_RC == 78 ]] || fail "the coordinator on a replaced dataset of other lengths exited with '$CL_RC', wanted 78"
grep -q "ledger.db was written for a dataset of checksum [0-9a-f]*, $CL_DIR/data.bin now has checksum [0-9a-f]* (replaced; [^)]*): put the old file back" \
  "$CL_DIR/coord2.log" || fail "no clear message: $(tail -n 3 "$CL_DIR/coord2.log")"
cl_log "other dataset: $(grep -h "the file was replaced" "$CL_DIR/target0.log" | head -n 1 | sed 's/^<[0-9]>//')"

cl_init "$T/c3" 200 || exit 1
cl_start_coord || fail "third coordinator did not come up"
cl_ring_hold || fail "no ring"
cl_fill_ring || fail "the ring did not fill: $(cl_ring_states 4)"
"$CL_PY" - "$CL_DIR/data.bin" <<'PY' || fail "cannot rewrite the dataset in place"
import struct, sys
f = open(sys.argv[1], "r+b")
h = f.read(128)
n_samples, n_tokens = struct.unpack_from("<QQ", h, 16)
index_off = struct.unpack_from("<Q", h, 56)[0]
for i in range(n_samples):            # every entry's first token: past the end of the tokens
    f.seek(index_off + 16 * i)
    f.write(struct.pack("<Q", n_tokens))
PY
cl_start drafter0 drafter-d -c "$CL_INI" -i 0      # frees slots: the target packs its next lease
cl_wait_exit target0 60
[[ $CL_RC == 1 ]] || fail "the target on a dataset rewritten in place exited with '$CL_RC', wanted 1"
grep -q "$CL_DIR/data.bin changed while in use (sample [0-9]* points outside its tokens)" "$CL_DIR/target0.log" ||
  fail "no clear message: $(tail -n 3 "$CL_DIR/target0.log")"
cl_log "rewritten in place: $(grep -h "changed while in use" "$CL_DIR/target0.log" | head -n 1 | sed 's/^<[0-9]>//')"
cl_init "$T/c4" 200 || exit 1
cl_start_coord || fail "fourth coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
cl_wait 'step() >= 5' 60 coord || fail "no training"
"$CL_BIN/dflash-data" dump "$CL_DIR/data.bin" |
  "$CL_PY" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    r["input_ids"] = [(t + 1) % 255 for t in r["input_ids"]]
    print(json.dumps(r))' >"$T/shifted.jsonl" || fail "dump"
"$CL_BIN/dflash-data" build -o "$CL_DIR/data.new" -v 256 "$T/shifted.jsonl" >/dev/null || fail "rebuild"
mv "$CL_DIR/data.new" "$CL_DIR/data.bin"                # renamed over: the daemons keep the old file
cl_kill drafter0 KILL
cl_kill coord KILL
cl_wait_exit coord 10
cl_start coord2 coordinator-d -c "$CL_INI"
cl_wait_exit coord2 30
[[ $CL_RC == 78 ]] || fail "the coordinator on a replaced dataset exited with '$CL_RC', wanted 78"
grep -q "ledger.db was written for a dataset of checksum [0-9a-f]*, $CL_DIR/data.bin now has checksum [0-9a-f]* (replaced)" \
  "$CL_DIR/coord2.log" || fail "no clear message: $(tail -n 3 "$CL_DIR/coord2.log")"
cl_log "replaced dataset, coordinator: $(grep -h "(replaced)" "$CL_DIR/coord2.log" | head -n 1 | sed 's/^<[0-9]>//')"
mkdir "$T/old-ledger"
mv "$CL_DIR"/state/*-ledger.db* "$T/old-ledger/"       # a new run on the new file
cl_start coord3 coordinator-d -c "$CL_INI"
cl_wait_exit target0 60
[[ $CL_RC != timeout ]] || fail "the target reading the old file did not leave"
grep -q "target-d@0 exits: the coordinator now schedules dataset $CL_DIR/data.bin of checksum [0-9a-f]*, this daemon reads" \
  "$CL_DIR/target0.log" || fail "no clear message: $(tail -n 3 "$CL_DIR/target0.log")"
cl_log "replaced dataset, running target: $(grep -h "now schedules dataset" "$CL_DIR/target0.log" | head -n 1 | sed 's/^<[0-9]>//')"
cl_init "$T/c5" 200 || exit 1
cl_start_coord || fail "fifth coordinator did not come up"
cl_ring_hold || fail "no ring"
cl_fill_ring || fail "the ring did not fill: $(cl_ring_states 4)"
truncate -s 4096 "$CL_DIR/data.bin"               # in place: the target's mapping loses its pages
cl_start drafter0 drafter-d -c "$CL_INI" -i 0      # frees slots: the target packs its next lease
cl_wait_exit target0 60
[[ $CL_RC == 135 ]] || fail "the target on a truncated dataset exited with '$CL_RC', wanted 135 (SIGBUS)"
grep -q "target-d@0: SIGBUS: dataset $CL_DIR/data.bin shrank under this process" "$CL_DIR/target0.log" ||
  fail "no clear message: $(tail -n 3 "$CL_DIR/target0.log")"
cl_log "truncated in place: $(grep -h "SIGBUS" "$CL_DIR/target0.log" | head -n 1 | sed 's/^<[0-9]>//')"
echo "ok: a smaller ring.max_tokens, another dataset, one rewritten in place, one replaced and one truncated are refused with the reason"
