#!/usr/bin/env bash
# test_cluster_reboot.sh: a power loss, then a reboot in which the new drafter-d carries the owner
# token (pid + start time since boot) the ledger saved for the one of the last boot. A token says
# nothing of the boot: the coordinator took the new process for rank 0 of the old generation,
# seated it there with no rollback, and the batches trained after the head checkpoint before the
# power loss (their gradients lost with it) were marked CHECKPOINTED by the next checkpoint.
# The ledger keeps the boot's id; one last opened on another boot has its owners taken as gone.
# The reboot is made here by killing every process, removing the ring, writing another boot id
# into the ledger and the new drafter's token into its group_tokens (what a collision leaves).
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init
[[ -r /proc/sys/kernel/random/boot_id ]] || { echo "SKIP: no /proc/sys/kernel/random/boot_id"; exit 77; }

cl_init "$T/c" 1500 || exit 1
cl_ini_add drafter.checkpoint_every=25 data.epochs=50
cl_start_cluster 1 || fail "cluster did not come up"
cl_wait 's["group"]["checkpoint"]["step"] >= 25 and 8 <= step() % 25 <= 18' 120 coord || fail "no training"
gen=$(cl_json 's["group"]["generation"]')
[[ $(cl_sql "select value from meta where key='boot_id'") == "$(cat /proc/sys/kernel/random/boot_id)" ]] ||
  fail "the ledger does not keep this boot's id: '$(cl_sql "select value from meta where key='boot_id'")'"
# the power loss: every process at once, and the ring (in /dev/shm) gone
kill -9 "$(cl_pid coord)" "$(cl_pid target0)" "$(cl_pid drafter0)"
for n in coord target0 drafter0; do cl_wait_exit $n 10 || true; done
rm -f "/dev/shm/dflash-$CL_NAME"*
head=$(cl_sql "select value from meta where key='ckpt_step'")
cl_sql "select id from batches where state=3 and gen=$gen and step>$head" >"$T/lost.txt"
n_lost=$(wc -l <"$T/lost.txt")
cl_log "head step $head; $n_lost batches trained past it in generation $gen died with the power loss"
((n_lost > 0)) || fail "no batch trained past the head checkpoint before the power loss"
# the reboot: the new drafter-d has the token saved for the old rank 0
seen=$(wc -l <"$CL_DIR/coord.log")
cl_start drafter0 drafter-d -c "$CL_INI" -i 0
p=$(cl_pid drafter0)
for ((i = 0; i < 50; i++)); do [[ -r /proc/$p/stat ]] && break; sleep 0.1; done
ticks=$(awk '{ sub(/.*\) /, ""); print $20 }' "/proc/$p/stat")
cl_sql "update meta set value='$((p | (ticks << 22)))' where key='group_tokens'"
cl_sql "update meta set value='00000000-0000-4000-8000-000000000000' where key='boot_id'"
cl_start_coord || fail "the coordinator did not come back"
cl_start target0 target-d -c "$CL_INI" -i 0
cl_wait 's["state"] == "running" and s["group"]["active"] and s["group"]["checkpoint"]["step"] > '"$head + 25" 180 coord ||
  fail "no checkpoint after the reboot"
tail -n +$((seen + 1)) "$CL_DIR/coord.log" >"$T/coord2.log"
grep -q "was last opened on another boot (00000000-0000-4000-8000-000000000000, now .*): the 1 drafter rank and the owners of [0-9]* batch\(es\)\? in flight it names are processes of that boot, taken as gone" "$T/coord2.log" ||
  fail "the other boot is not said: $(grep -i boot "$T/coord2.log")"
grep -q "rejoined group generation $gen" "$T/coord2.log" &&
  fail "the new drafter was seated in the old generation: $(grep "rejoined" "$T/coord2.log")"
[[ $(cl_json 's["group"]["generation"]') -gt $gen ]] || fail "the group did not start a new generation"
# every batch whose training died with the power loss is trained again, none counted from the old one
bad=$(while read -r id; do cl_sql "select id from batches where id=$id and state=4 and gen=$gen"; done <"$T/lost.txt")
[[ -z $bad ]] || fail "batches whose training was lost are CHECKPOINTED in generation $gen: $(echo $bad)"
echo "ok: a drafter with the old boot's token is no rank of the old generation; the $n_lost lost batches are trained again"
