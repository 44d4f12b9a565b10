#!/usr/bin/env bash
# test_replay.sh: dflash-replay re-trains a CPU run from its ledger and finds the weights of its
# checkpoints bit for bit. One target and a two-rank drafter group train one epoch; many steps
# have a batch on one rank only. Such a rank must add zeros to the gradients' all-reduce (not the
# gradients of its step before), which no comparison of the replicas can see: the all-reduce keeps
# them identical whatever it sums. The replay sums each step's batches as the ledger lists them.
# Then: an earlier checkpoint (--checkpoint) passes too, another learning rate fails (exit 1), and
# input that does not belong to the run is refused (exit 78).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
unset WATCHDOG_PID NOTIFY_SOCKET

# A target of 16 layers (15 run per batch) against a drafter of one: it forwards a batch in more
# time than a rank's wait slice for a slot, so while one rank trains the batch it took, the other
# often finds none. The slice is a quarter of the watchdog interval (capped at 200 ms): the
# drafters get one of 40 ms, as under WatchdogSec=40ms, so 10 ms slices. 140 samples make 35
# batches: an odd number, so at least one step has a single batch whatever the timing.
CL_MKMODEL_ARGS="--layers 16" cl_init "$T/c" 140 || exit 1
. tests/lib/replay.sh
cl_ini_add model.capture_layers=1,14 drafter.world_size=2 drafter.checkpoint_every=8
D=$CL_DIR

cl_start_coord || fail "coordinator did not come up"
cl_start target0 target-d -c "$CL_INI" -i 0
for i in 0 1; do
  WATCHDOG_USEC=40000 cl_start drafter$i drafter-d -c "$CL_INI" -i $i
done
# the epoch completes: the coordinator drains the drafters for a final checkpoint and stops
cl_wait_exit coord 120 || fail "coordinator exited with '$CL_RC'"
for n in target0 drafter0 drafter1; do
  cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"
done

steps=$(cl_sql 'SELECT count(DISTINCT step) FROM trains WHERE gen = 1 AND rolled_back = 0')
single=$(cl_sql 'SELECT count(*) FROM (SELECT step FROM trains WHERE gen = 1 AND rolled_back = 0
                 GROUP BY step HAVING count(DISTINCT rank) = 1)')
final=$(cl_sql 'SELECT step FROM checkpoints WHERE gen = 1 AND dropped IS NULL ORDER BY step DESC LIMIT 1')
first=$(cl_sql 'SELECT dir FROM checkpoints WHERE gen = 1 ORDER BY step LIMIT 1')
nck=$(cl_sql 'SELECT count(*) FROM checkpoints WHERE gen = 1')
[[ $(cl_sql 'SELECT count(*) FROM trains WHERE gen != 1') == 0 ]] ||
  fail "a second generation: $(cl_sql 'SELECT DISTINCT gen FROM trains')"
cl_log "$steps steps, $single of them with one rank's batch only; $nck checkpoints, the last at step $final"
if ((single == 0)); then
  echo "SKIP: every step had a batch on both ranks (the target kept up with the ranks): nothing to test"
  exit 77
fi
((nck >= 3)) || fail "$nck checkpoints, expected one every 8 of $steps steps"
[[ $final == "$steps" ]] || fail "the last checkpoint is at step $final, the run took $steps steps"


# the final checkpoint (the default: the newest of generation 1), then the first one
replay_expect 0 "^dflash-replay: $final steps of generation 1 replayed to .*step-0*$final: master weights max abs diff 0,\
 max rel diff 0 .*: PASS$"
# read-only, nothing left beside the ledger (a -wal and a -shm file, that a read-only open would
# make of a stopped ledger), also when its folder is not writable to the reader: as root (for
# whom it stays writable) the replay runs as uid 65534, a copy of it where that user reaches
ledger=$CL_DIR/state/$CL_NAME-ledger.db
[[ -e $ledger-wal || -e $ledger-shm ]] && fail "files beside the ledger after the replay: $(ls "$ledger"*)"
chmod a-w "$CL_DIR/state"
if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null; then
  mkdir -p "$T/bin" && cp "$REPLAY" "$T/bin/" && chmod 755 "$T" "$T/bin" "$T/bin/dflash-replay" && chmod -R a+rX "$CL_DIR"
  chmod a-w "$CL_DIR/state"
  saved=$REPLAY REPLAY=$T/bin/dflash-replay REPLAY_AS="setpriv --reuid=65534 --regid=65534 --clear-groups"
  replay_expect 0 ": PASS$" --checkpoint "$first"
  REPLAY=$saved REPLAY_AS=
else
  replay_expect 0 ": PASS$" --checkpoint "$first"
fi
[[ -e $ledger-wal || -e $ledger-shm ]] && fail "files beside the ledger after a replay in a folder it may not write"
chmod u+w "$CL_DIR/state"
first_step=$((10#${first##*step-}))
replay_expect 0 "^dflash-replay: $first_step steps .*: PASS$" --checkpoint "$first"
# a learning rate 1% off the run's: the weights differ
replay_expect 1 ": FAIL$" -o drafter.lr=2.97e-3
# a final checkpoint whose AdamW step count (optimizer.bin's opt_step, checksum made good) is
# not the steps trained: it would resume another learning-rate schedule
opt="$(cl_sql 'SELECT dir FROM checkpoints ORDER BY rowid DESC LIMIT 1')/optimizer.bin"
cp "$opt" "$T/optimizer.bin.orig"
"$CL_PY" - "$opt" <<'EOF2' || fail "cannot edit $opt"
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
opt_step, step = struct.unpack_from("<qq", b, 32)      # struct opt_header: opt_step, step
assert opt_step == step > 0, (opt_step, step)
struct.pack_into("<q", b, 32, opt_step + 1000)
h = 0xcbf29ce484222325                                  # FNV-1a 64 of every byte before the last 8
for x in b[:-8]:
    h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
struct.pack_into("<Q", b, len(b) - 8, h)
open(sys.argv[1], "wb").write(b)
EOF2
replay_expect 1 "; AdamW step count $final, checkpoint $((final + 1000)): FAIL$"
cp "$T/optimizer.bin.orig" "$opt"

# input that is not the run's, each named in one line
replay_expect 78 "nowhere: No such file" --checkpoint "$T/nowhere"
replay_expect 64 "^dflash-replay: unexpected argument '/tmp' \(try -h\)$" /tmp
replay_expect 64 "^dflash-replay: unknown option '--frob' \(try -h\)$" --frob
replay_expect 64 "^dflash-replay: .*: its value has a control character \(0x0a\) at byte 12$" -o $'drafter.lr=1\n2'
out=$("$REPLAY" 2>&1); rc=$?
[[ $rc == 64 && $out == "dflash-replay: -c CONFIG is needed: the run's configuration (try -h)" ]] ||
  fail "dflash-replay with no argument: exit $rc: $out"
replay_expect 78 "drafter.seed: 7, the run's checkpoint .* was trained with seed 42" -o drafter.seed=7
replay_expect 78 "meta.fingerprint .* data.seed" -o data.seed=99
replay_expect 78 "target.backend: cuda" -o target.backend=cuda
# the target's weights: another model of the same shapes is not the run's
"$CL_PY" "$CL_SRC/tools/mkmodel.py" "$T/othermodel" --vocab 256 --layers 16 --std 0.03 >/dev/null || fail "cannot make the other model"
replay_expect 78 "model.path: $T/othermodel has weights of fingerprint [0-9a-f]{16}, the run of .* trained on [0-9a-f]{16} \(other weights\)" \
  -o model.path="$T/othermodel"
# ... nor the run's weights under other config.json settings
mkdir "$T/tweak" && cp "$CL_DIR/model/"* "$T/tweak/" || fail "cannot copy the model"
sed -i 's/"rope_theta": 1000000.0/"rope_theta": 500000.0/' "$T/tweak/config.json"
replay_expect 78 "model.path: $T/tweak/config.json: rope_theta is 500000 here, 1000000 in the run of .* \(other settings\)" \
  -o model.path="$T/tweak"
replay_expect 78 "drafter.world_size is 3, the run.s drafter group had 2 ranks" -o drafter.world_size=3
# ... also after later generations formed (a group restart): generation 1's size is recorded
ledger=$CL_DIR/state/$CL_NAME-ledger.db
cp "$ledger" "$T/ledger.saved"
cl_sql "UPDATE meta SET value = '3' WHERE key = 'group_gen'" >/dev/null
replay_expect 78 "drafter.world_size is 3, the run.s drafter group had 2 ranks" -o drafter.world_size=3
cp "$T/ledger.saved" "$ledger"
root=$(dirname "$first")
cp "$root/run-id" "$T/run-id.saved"
printf '%016x\n' 1 >"$root/run-id"
replay_expect 78 "run-id: run 0000000000000001, the ledger .* is of run" --checkpoint "$first"
cp "$T/run-id.saved" "$root/run-id"
mkdir "$T/other" && cp -r "$first" "$T/other/"
replay_expect 78 "not one the ledger .* records" --checkpoint "$T/other/$(basename "$first")"
echo "ok: $steps steps ($single with one rank's batch) replayed bit for bit"
