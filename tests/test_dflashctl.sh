#!/usr/bin/env bash
# test_dflashctl.sh: dflashctl against a live coordinator-d: every command, --json parses,
# pause/resume/drain change the state, a bad socket path fails with a clear message; restarted on
# a ledger holding batches in flight and errors: -n N limits the rows, a refused control exits 1.
set -u
B=${DFLASH_BUILD:-build}
T=${TMPDIR:-/tmp}
CTL=$B/bin/dflashctl
name=ctl$$
fail() { echo "FAIL: $*" >&2; tail -20 "$T/coord.log" >&2; exit 1; }
cleanup() { [[ -n ${cpid:-} ]] && kill -9 "$cpid" 2>/dev/null; rm -f /dev/shm/dflash-$name; }
trap cleanup EXIT
json_ok() { if command -v jq >/dev/null; then jq -e . >/dev/null; else python3 -m json.tool >/dev/null; fi; }

"$B/bin/dflash-data" synth -o "$T/data.bin" -n 200 -v 300 --min-len 8 --max-len 120 >/dev/null || fail "dflash-data synth"
cat > "$T/dflash.ini" <<INI
[cluster]
name = $name
runtime_dir = $T
state_dir = $T
# (the first drain below waits over TCP)
tcp_listen = 127.0.0.1:0
tcp_token_file = $T/tcp.token
[ring]
slots = 4
max_tokens = 512
max_seqs = 64
[model]
capture_layers = 1
[coordinator]
ring_hidden = 8
heartbeat_ms = 50
min_free_mb = 16
# (a restart waits this long for its daemons: the drain below stays DRAINING meanwhile)
recovery_ms = 120000
[data]
path = $T/data.bin
token_budget = 512
max_seq_len = 128
INI
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/tcp.token"; chmod 600 "$T/tcp.token"
"$B/bin/coordinator-d" -c "$T/dflash.ini" >"$T/coord.log" 2>&1 &
cpid=$!
S=$T/$name.sock
for _ in $(seq 200); do "$CTL" -s "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$CTL" -s "$S" status >/dev/null || fail "coordinator did not come up"

# the config the units name in $DFLASH_CONFIG, without -c or -s
DFLASH_CONFIG=$T/dflash.ini "$CTL" status >"$T/out.txt" || fail "dflashctl with DFLASH_CONFIG"
grep -q "cluster $name, run [0-9a-f]\{16\}, up" "$T/out.txt" || fail "dflashctl status: $(head -2 "$T/out.txt")"
for cmd in status ring daemons batches errors; do
  "$CTL" -s "$S" $cmd >"$T/out.txt" || fail "dflashctl $cmd"
  [[ -s $T/out.txt ]] || fail "dflashctl $cmd printed nothing"
  "$CTL" -s "$S" --json $cmd | json_ok || fail "dflashctl --json $cmd does not parse"
done
"$CTL" -s "$S" --json status > "$T/s.json"
python3 - "$T/s.json" <<'PY' || fail "status --json lacks keys"
import json, sys
s = json.load(open(sys.argv[1]))
for k in ("state", "run", "daemons", "ring", "batches", "errors", "epoch", "drafter"):
    assert k in s, k
assert len(s["run"]) == 16 and int(s["run"], 16) != 0, s["run"]
for k in ("slots", "free", "writing", "ready", "reading"):
    assert k in s["ring"], k
for k in ("pending", "leased", "published", "trained", "checkpointed"):
    assert k in s["batches"], k
assert s["state"] == "running", s["state"]
assert s["batches"]["total"] > 0
tm = s["coordinator"]       # its own timings: the epoch's schedule was committed at start
assert tm["commits"] >= 1 and tm["commit_ms_max"] >= tm["commit_ms"] >= 0, tm
assert tm["check_ms_max"] >= 0 and tm["stall_ms_max"] >= 0 and tm["stalls"] >= 0, tm
PY
"$CTL" -s "$S" status | grep -q "coordinator: [0-9]* ledger commits\?, last [0-9.]* ms (max [0-9.]* ms).*loop held up [0-9]* times\?" ||
  fail "status does not show the coordinator's timings"
# (an owner token as a string of digits: 62 bits, which a JSON number would round)
"$CTL" -s "$S" --json ring | python3 -c 'import json,sys; r=json.load(sys.stdin); assert len(r["slot_list"]) == 4
assert all(isinstance(s["owner"], str) and s["owner"].isdigit() for s in r["slot_list"]), r["slot_list"]' \
  || fail "ring --json has no slot table, or its owners are not strings of digits"
"$CTL" -s "$S" ring | grep -q "FREE" || fail "ring table"

"$CTL" -s "$S" pause maintenance | grep -q "paused" || fail "pause"
"$CTL" -s "$S" --json status | grep -q '"state":"paused"' || fail "state after pause"
"$CTL" -s "$S" status | grep -q "maintenance" || fail "pause reason not shown"
# a second pause answers with the reason the cluster is paused for (the first one's)
"$CTL" -s "$S" pause later | grep -q "^pause: cluster is paused: pause by dflashctl .*: maintenance$" ||
  fail "a second pause does not say why the cluster is paused: $("$CTL" -s "$S" pause later)"
grep -q "pause by dflashctl (pid [0-9]*, uid [0-9]*): later: already paused (pause by dflashctl .*: maintenance): nothing changes" "$T/coord.log" ||
  fail "the second pause is not logged: $(grep -i pause "$T/coord.log")"
# options after the command are options, not words of the reason; "--" lets a reason start with '-'
"$CTL" status -s "$S" --json | json_ok || fail "options after the command"
"$CTL" -s "$S" resume disk checked >/dev/null || fail "resume"
grep -q "resume by dflashctl (pid [0-9]*, uid [0-9]*): disk checked" "$T/coord.log" ||
  fail "the resume's reason is not logged: $(grep -i resume "$T/coord.log")"
"$CTL" -s "$S" pause --json again | grep -q '"state":"paused"' || fail "pause --json printed no JSON"
"$CTL" -s "$S" status | grep -q "again" || fail "the reason after --json not kept"
"$CTL" -s "$S" status | grep -q -- "--json" && fail "--json taken as the reason"
"$CTL" -s "$S" resume >/dev/null || fail "resume"
"$CTL" -s "$S" pause -- -x- | grep -q "paused" || fail "pause -- -x-"
"$CTL" -s "$S" status | grep -q -- "-x-" || fail "a reason after -- not kept"
"$CTL" -s "$S" resume | grep -q "running" || fail "resume"
# A reason of 160 bytes is kept whole after who sent it; a longer one is refused, not cut
long=$(printf "word%05d " {1..15})end-of-i       # 15 x 10 + 8 = 158 bytes; " x" makes 160
"$CTL" -s "$S" pause $long x >/dev/null || fail "a pause with a 160-byte reason"
"$CTL" -s "$S" --json status | python3 -c 'import json,sys; r=json.load(sys.stdin)["reason"]; assert r.endswith(": "+sys.argv[1]+" x"), r' "$long" ||
  fail "a 160-byte reason not kept whole: $("$CTL" -s "$S" status)"
"$CTL" -s "$S" resume >/dev/null || fail "resume"
"$CTL" -s "$S" pause $long xy >/dev/null 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -qx "dflashctl: pause: the reason is 161 bytes, at most 160 are kept: shorten it" "$T/err.txt" ||
  fail "a 161-byte reason: exit $rc: $(cat "$T/err.txt")"
"$CTL" -s "$S" --json status | grep -q '"state":"running"' || fail "a refused reason changed the state"
"$CTL" -s "$S" --json resume | grep -q '"ok":true' || fail "resume is idempotent"

# Bad socket path: clear message, non-zero exit.
if "$CTL" -s "$T/nope.sock" status 2>"$T/err.txt"; then fail "bad socket path exited 0"; fi
grep -q "cannot connect to $T/nope.sock: No such file or directory" "$T/err.txt" || fail "bad socket message: $(cat "$T/err.txt")"
# a socket left by a coordinator that was killed: nobody listens
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.close()' "$T/stale.sock"
"$CTL" -s "$T/stale.sock" status 2>"$T/err.txt" && fail "a stale socket exited 0"
grep -q "cannot connect to $T/stale.sock: Connection refused (nothing listens there: no coordinator runs on it)" "$T/err.txt" ||
  fail "stale socket message: $(cat "$T/err.txt")"
"$CTL" -s "$S" frobnicate 2>"$T/err.txt"; rc=$?
[[ $rc == 64 && $(wc -l <"$T/err.txt") == 1 ]] && grep -q "unknown command 'frobnicate' (dflashctl -h lists them)" "$T/err.txt" ||
  fail "unknown command: exit $rc: $(cat "$T/err.txt")"
# A path that is not a socket says so.
"$CTL" -s "$T" status 2>"$T/err.txt" && fail "a folder as the socket exited 0"
grep -q "cannot connect to $T: not a socket (a folder)" "$T/err.txt" || fail "folder as socket: $(cat "$T/err.txt")"
"$CTL" -s "$S" -c "$T/dflash.ini" status 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -q "\-s and -c name the socket twice" "$T/err.txt" || fail "-s with -c: exit $rc: $(cat "$T/err.txt")"
# Bad arguments: a usage error (64) that says which.
"$CTL" -s "$S" -n abc batches 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -q "\-n abc: not a count" "$T/err.txt" || fail "-n abc: exit $rc: $(cat "$T/err.txt")"
"$CTL" -s "$S" -n -1 batches 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] || fail "-n -1: exit $rc"
"$CTL" -s "$S" -s "$T/other.sock" status 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -qx "dflashctl: -s given twice" "$T/err.txt" || fail "-s twice: exit $rc: $(cat "$T/err.txt")"
"$CTL" -s "$S" -n 5 -n 7 batches 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -qx "dflashctl: -n given twice" "$T/err.txt" || fail "-n twice: exit $rc: $(cat "$T/err.txt")"
"$CTL" -s "$S" -n " 5" batches 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] || fail "-n ' 5': exit $rc"
"$CTL" -s "$S" status now 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -q "^dflashctl: status takes no arguments ('now' is one" "$T/err.txt" ||
  fail "status with an argument: exit $rc: $(cat "$T/err.txt")"
"$CTL" --connect 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -q "\-\-connect needs a value" "$T/err.txt" || fail "--connect last: exit $rc: $(cat "$T/err.txt")"
# The socket from the config file.
"$CTL" -c "$T/dflash.ini" status >/dev/null || fail "-c CONFIG"
# ... from the DFLASH_CONFIG of the units' environment file (/etc/default/dflash), quoted or not
printf '# dflash units\nDFLASH_CONFIG="%s"\n' "$T/dflash.ini" >"$T/default"
DFLASH_DEFAULTS=$T/default "$CTL" status >"$T/out.txt" || fail "dflashctl with DFLASH_CONFIG in the environment file"
grep -q "cluster $name, run" "$T/out.txt" || fail "dflashctl status from the environment file: $(head -2 "$T/out.txt")"
# ... and from its [cluster] section when a mistake elsewhere (an edit for the next run) fails the
# file: a warning naming it, the running cluster still reached
sed 's/^\[coordinator\]$/[coordinator]\ndead_after_ms = 5x/' "$T/dflash.ini" >"$T/edited.ini"
grep -q '^dead_after_ms = 5x' "$T/edited.ini" || fail "test setup: no [coordinator] section to edit"
"$CTL" -c "$T/edited.ini" status >"$T/out.txt" 2>"$T/err.txt" || fail "a mistake in [coordinator] kept dflashctl away: $(cat "$T/err.txt")"
grep -q "dflashctl: warning: .*edited.ini:[0-9]*: coordinator.dead_after_ms: .*(the socket taken from its \[cluster\] section)" "$T/err.txt" ||
  fail "no warning naming the mistake: $(cat "$T/err.txt")"
# a mistake elsewhere and one in [cluster]: the one in [cluster] named first (it is what keeps
# dflashctl from the socket; fixing the other alone would only lead to it)
sed 's/^\[coordinator\]$/[coordinator]\ndead_after_ms = 5x/; s/^\[cluster\]$/[cluster]\nruntime_dir \/x/' "$T/dflash.ini" >"$T/two.ini"
"$CTL" -c "$T/two.ini" status 2>"$T/err.txt"; rc=$?
[[ $rc == 1 ]] && grep -q "^dflashctl: .*two.ini:[0-9]*: syntax error: no '=' or ':' in it (the socket's \[cluster\] section; the file also: .*two.ini:[0-9]*: " "$T/err.txt" ||
  fail "a mistake in [cluster] and one elsewhere: exit $rc: $(cat "$T/err.txt")"
# a second coordinator of the same cluster: refused by its lock, which the message names as the
# cluster's (a coordinator has no -i index)
"$B/bin/coordinator-d" -c "$T/dflash.ini" >"$T/second.log" 2>&1; rc=$?
[[ $rc == 1 ]] && grep -q "\.lock is held by another coordinator-d (pid [0-9]*): one instance per cluster (cluster.name)" "$T/second.log" ||
  fail "a second coordinator: exit $rc: $(grep -v ' = ' "$T/second.log" | tail -n 2)"
# a misspelt [cluster] header: no section to take the socket from, so no fall back to the default
# socket (another cluster's): refused, nothing sent
sed 's/^\[cluster\]$/[clustr]/' "$T/dflash.ini" >"$T/nosec.ini"
grep -q '^\[clustr\]$' "$T/nosec.ini" || fail "test setup: no [cluster] header to misspell"
"$CTL" -c "$T/nosec.ini" pause 2>"$T/err.txt"; rc=$?
[[ $rc == 1 ]] && grep -qx "dflashctl: .*nosec.ini:[0-9]*: \[clustr\]: unknown section (and the file has no \[cluster\] section to take the socket from: mend it, or give -s)" "$T/err.txt" ||
  fail "a misspelt [cluster] header: exit $rc: $(cat "$T/err.txt")"
"$CTL" -s "$S" --json status | grep -q '"state":"running"' || fail "a refused control reached the cluster"
sed 's/^name = .*/name = bad name!/' "$T/dflash.ini" >"$T/badname.ini"
"$CTL" -c "$T/badname.ini" status 2>"$T/err.txt"; rc=$?
[[ $rc == 1 ]] && grep -q "badname.ini:[0-9]*: cluster.name" "$T/err.txt" || fail "a bad cluster.name: exit $rc: $(cat "$T/err.txt")"

# drain --wait over TCP: no stop note to read there, the coordinator's last answer says it ended
port=$(sed -n 's/.*TCP listener on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$T/coord.log" | head -1)
[[ -n $port ]] || fail "no TCP listener port in the log"
"$CTL" --connect "127.0.0.1:$port" --token-file "$T/tcp.token" --wait drain >"$T/out.txt" 2>&1 ||
  fail "drain --wait over TCP: $(cat "$T/out.txt")"
grep -q "^drain: the cluster is stopped: drained (drain by dflashctl@127.0.0.1:[0-9]* .*; lineage head: " "$T/out.txt" ||
  fail "drain --wait over TCP said: $(cat "$T/out.txt")"
for _ in $(seq 100); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.05; done
wait "$cpid"; rc=$?; cpid=
[[ $rc -eq 0 ]] || fail "coordinator exit $rc after drain"
[[ ! -e $S ]] || fail "socket left behind"
[[ ! -e /dev/shm/dflash-$name ]] || fail "ring left behind"
grep -q "coordinator.ring_hidden = 8" "$T/coord.log" || fail "effective config not printed"

# Restarted on a ledger that holds six batches LEASED (by no process: they wait out the recovery
# window) and five errors: -n N shows N of them.
db=$T/$name-ledger.db
python3 - "$db" <<'PY' || fail "cannot change the ledger"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
assert c.execute("SELECT count(*) FROM batches").fetchone()[0] > 6
c.execute("UPDATE batches SET state = 1, owner = 0, slot = -1, leases = 1"
          " WHERE id IN (SELECT id FROM batches ORDER BY id LIMIT 6)")
c.executemany("INSERT INTO errors VALUES (?, 'target', 0, 4242, 0, -5, ?)",
              [(1700000000000 + 1000 * k, "test error %d" % k) for k in range(1, 6)])
c.commit()
PY
mv "$T/coord.log" "$T/coord1.log"
"$B/bin/coordinator-d" -c "$T/dflash.ini" >"$T/coord.log" 2>&1 &
cpid=$!
for _ in $(seq 200); do "$CTL" -s "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$CTL" -s "$S" --json status | grep -q '"recovering":true' || fail "the restarted coordinator is not recovering"
"$CTL" -s "$S" --json batches | python3 -c 'import json,sys; assert len(json.load(sys.stdin)["in_flight"]) == 6' ||
  fail "batches --json: not the 6 leased batches in flight"
"$CTL" -s "$S" --json -n 3 batches | python3 -c 'import json,sys; a=json.load(sys.stdin)["in_flight"]; assert len(a) == 3, len(a)' ||
  fail "batches --json -n 3: not 3 rows"
"$CTL" -s "$S" -n 3 batches >"$T/out.txt" || fail "batches -n 3"
[[ $(grep -c "^0:[0-9]* *leased " "$T/out.txt") == 3 ]] || fail "batches -n 3 shows: $(cat "$T/out.txt")"
"$CTL" -s "$S" errors >"$T/out.txt" || fail "errors"
[[ $(grep -c "test error" "$T/out.txt") == 5 ]] && grep -q "errors: 5 (0 fatal)" "$T/out.txt" || fail "errors shows: $(cat "$T/out.txt")"
"$CTL" -s "$S" --json -n 3 errors | python3 -c 'import json,sys; e=json.load(sys.stdin); assert len(e["errors"]) == 3 and e["count"] == 5, e' ||
  fail "errors --json -n 3: not 3 rows of 5"
"$CTL" -s "$S" -n 3 errors >"$T/out.txt" || fail "errors -n 3"
[[ $(grep -c "test error" "$T/out.txt") == 3 ]] && grep -q "test error 5" "$T/out.txt" && ! grep -q "test error 2" "$T/out.txt" ||
  fail "errors -n 3 (the newest 3) shows: $(cat "$T/out.txt")"

# A control the coordinator refuses exits 1 with its reason (DRAINING: the recovery window and the
# leases keep it there).
"$CTL" -s "$S" drain | grep -q "drain: cluster is draining" || fail "drain in the recovery window"
"$CTL" -s "$S" pause >"$T/out.txt" 2>"$T/err.txt"; rc=$?
[[ $rc == 1 ]] && grep -q "^dflashctl: pause: only a running cluster can pause (state is draining)$" "$T/err.txt" ||
  fail "a refused pause: exit $rc: $(cat "$T/out.txt" "$T/err.txt")"
"$CTL" -s "$S" --json resume >"$T/out.txt"; rc=$?
[[ $rc == 1 ]] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["ok"] is False and r["state"] == "draining" and "only a paused cluster can resume" in r["error"], r' "$T/out.txt" ||
  fail "a refused resume --json: exit $rc: $(cat "$T/out.txt")"
# --json --wait: JSON lines only, the control's answer, then how the cluster ended
"$CTL" -s "$S" --json --wait stop >"$T/out.txt" || fail "stop --json --wait: $(cat "$T/out.txt")"
python3 - "$T/out.txt" <<'PY' || fail "stop --json --wait printed: $(cat "$T/out.txt")"
import json, sys
docs = [json.loads(l) for l in open(sys.argv[1])]
assert len(docs) == 2 and docs[0]["ok"] is True, docs
assert docs[1]["state"] == "stopped" and "stop by dflashctl" in docs[1]["reason"], docs[1]
assert "checkpoint" in docs[1] and docs[1]["ended"] is True, docs[1]
PY
for _ in $(seq 200); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.05; done
wait "$cpid"; rc=$?; cpid=
[[ $rc -eq 0 ]] || fail "coordinator exit $rc after stop"
# Another program's socket: the protocol error names where it came from.
python3 - "$T/http.sock" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1); s.settimeout(10)
c = s.accept()[0]; c.settimeout(10); c.recv(4096)     # the HELLO first: a send into a closed socket is EPIPE
c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b"x" * 64)
try:
    while c.recv(4096): pass
except OSError: pass
c.close()
PY
hpid=$!
for _ in $(seq 50); do [[ -S $T/http.sock ]] && break; sleep 0.1; done
"$CTL" -s "$T/http.sock" status >"$T/out.txt" 2>"$T/err.txt"; rc=$?
wait "$hpid"
[[ $rc == 1 ]] && grep -q "^dflashctl: $T/http.sock: bad frame magic 0x50545448 (not a dflash peer?)$" "$T/err.txt" ||
  fail "another program's socket: exit $rc: $(cat "$T/err.txt")"
echo "dflashctl ok"
