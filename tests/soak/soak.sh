#!/usr/bin/env bash
# soak.sh: the kill-everything soak on the CPU backend. Coordinator + 2 targets + a 2-rank
# drafter group (plain processes, tiny random model, structured synthetic data, several epochs)
# under tests/soak/soak.py, which SIGKILLs random daemons at random points of the run and starts
# them again like systemd would, until the run completes; then checks exactly-once training in
# the surviving lineage (ledger, final checkpoint, metrics), no leaked slot, nothing left in
# /dev/shm, no socket left; --short also replays each generation (dflash-replay) to the bit.
#   tests/soak/soak.sh --short         a few minutes: 2 epochs, 12 kills (tests/test_soak.sh)
#   tests/soak/soak.sh --long          32 minutes of kills (>= 120), then the run is ended after the
#                                      epochs scheduled by then, and completes (docs/soak.md)
# Options after the mode: --kills N --samples N --epochs N --seed N --dir DIR (keep the run
# there) and any soak.py option (--gap-min S --gap-max S --max-minutes M ...).
# Needs the build (DFLASH_BUILD, default build/), python3, sqlite3.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh

mode=short
case ${1:-} in --short|--long) mode=${1#--}; shift;; esac
if [[ $mode == short ]]; then
  samples=5000 epochs=2 kills=12 extra=(--min-per-kind 2 --gap-min 0.5 --gap-max 2.5 --max-minutes 8)
else
  samples=8000 epochs=200 kills=120 extra=(--minutes 32 --min-per-kind 20 --gap-min 3 --max-minutes 150 --poll 0.3)
fi
seed=$(( $(date +%s) % 100000 ))
dir=
pass=()
while (($#)); do
  case $1 in
    --samples) samples=$2; shift 2;;
    --epochs) epochs=$2; shift 2;;
    --kills) kills=$2; shift 2;;
    --seed) seed=$2; shift 2;;
    --dir) dir=$2; shift 2;;
    *) pass+=("$1"); shift;;
  esac
done
T=${dir:-${DFLASH_TEST_TMP:-$(mktemp -d)}}
mkdir -p "$T"
trap 'cl_cleanup' EXIT

cl_init "$T/c" "$samples" || exit 1
cl_ini_add drafter.world_size=2 drafter.checkpoint_every=10 data.epochs="$epochs"
# short: every checkpoint kept, so that dflash-replay finds where the head generation started
[[ $mode == long ]] && cl_ini_add drafter.keep_checkpoints=20 || cl_ini_add drafter.keep_checkpoints=0
echo "soak ($mode): run dir $CL_DIR, seed $seed (replay with --seed $seed)"
"$CL_PY" tests/soak/soak.py --bin "$CL_BIN" --ini "$CL_INI" --sock "$CL_SOCK" --dir "$CL_DIR" --rundir "$CL_DIR/run" \
  --state "$CL_DIR/state" --name "$CL_NAME" --ledger "$CL_DIR/state/$CL_NAME-ledger.db" --kills "$kills" \
  --seed "$seed" "${extra[@]}" "${pass[@]}" 2>&1 | tee "$CL_DIR/soak-verdict.txt"
rc=${PIPESTATUS[0]}
if ((rc != 0)); then
  cl_logs 25
  # the verdict again, last: a test runner shows only the tail
  echo "---- soak verdict (seed $seed)"
  sed -n '/^FAIL: /,$p' "$CL_DIR/soak-verdict.txt"
  grep -m1 'summary:' "$CL_DIR/soak-verdict.txt"
  exit 1
fi
if [[ $mode == short ]]; then
  # The weights too: each generation (a drafter kill ends one) redone from where it started, on
  # the batches its ledger rows name, equals its newest checkpoint to the bit (a batch lost,
  # trained twice or on the wrong rank would show).
  dirs=$(cl_sql 'SELECT c.dir FROM checkpoints c WHERE c.dropped IS NULL AND c.rowid = (SELECT max(rowid)
                 FROM checkpoints d WHERE d.gen = c.gen AND d.dropped IS NULL) ORDER BY c.gen') ||
    { echo "FAIL: cannot read the checkpoints from the ledger (seed $seed)"; exit 1; }
  replayed=0
  for dir in $dirs; do
    out=$("$CL_BIN/dflash-replay" -c "$CL_INI" --checkpoint "$dir" 2>&1)
    rrc=$?
    echo "$out"
    ((rrc == 0)) || { echo "FAIL: dflash-replay to $dir: exit $rrc (seed $seed)"; exit 1; }
    replayed=$((replayed + 1))
  done
  ((replayed > 0)) || { echo "FAIL: no checkpoint in the ledger to replay (seed $seed)"; exit 1; }
fi
exit 0
