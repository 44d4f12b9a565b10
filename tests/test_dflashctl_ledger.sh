#!/usr/bin/env bash
# test_dflashctl_ledger.sh: dflashctl --ledger reads a run from its ledger file, no coordinator
# asked. A tiny CPU cluster (1 target, 1 drafter) runs to completion; while it runs, the view
# reads the ledger beside the coordinator (WAL) and agrees with the coordinator's own status,
# reads the commits a SIGKILLed coordinator left in the -wal file, and reads on while the
# coordinator started again commits, to the end of the run; once it has stopped, status, batches,
# errors and checkpoints (text and --json) agree with the ledger's rows as Python's sqlite3 reads
# them, also on a copy with errors and a dropped checkpoint added, and the errors print as the
# online command prints them. A missing file, a folder, an empty or text file, another program's
# database, a ledger of another schema and a locked one are each refused in one line, exit 1. No
# read changes a ledger (its bytes and mtime), nor, on a stopped one, leaves files beside it.
set -u
cd "$(dirname "$0")/.."
. tests/lib/cluster.sh
cl_test_init

CTL=$CL_BIN/dflashctl
# the schema the coordinator writes: the view must read that one
schema=$(sed -n 's/^#define LEDGER_SCHEMA \([0-9]*\).*/\1/p' daemons/coordinator/ledger.[ch])
[[ $schema =~ ^[0-9]+$ ]] || fail "no one LEDGER_SCHEMA in daemons/coordinator/ledger.[ch]: '$schema'"

cl_init "$T/c" 600 || exit 1
L=$CL_DIR/state/$CL_NAME-ledger.db
cl_start_cluster 1 || fail "cluster start"

# ---- beside a running coordinator (WAL) ----
# Paused (the ledger still open, its -wal file beside it): the view agrees with the coordinator.
cl_wait 's["group"]["checkpoint"]["step"] >= 1' 180 coord || fail "no checkpoint"
"$CTL" -s "$CL_SOCK" pause ledger view test >/dev/null || fail "pause"
[[ -e $L-wal ]] || fail "test setup: the running coordinator's ledger has no -wal file"
"$CL_PY" - "$CTL" "$CL_SOCK" "$L" "$schema" <<'PY' || fail "--ledger status beside the paused coordinator"
import json, subprocess, sys, time
ctl, sock, L, schema = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def get(*a):
    p = subprocess.run([ctl] + list(a) + ["--json", "status"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "", (a, p.returncode, p.stderr)
    return json.loads(p.stdout)
states = ("total", "pending", "leased", "published", "trained", "checkpointed")
for _ in range(100):    # (the batches in hand when the pause came settle first)
    s, v = get("-s", sock), get("--ledger", L)
    if all(s["batches"][k] == v["batches"][k] for k in states):
        break
    time.sleep(0.1)
assert all(s["batches"][k] == v["batches"][k] for k in states), (s["batches"], v["batches"])
assert v["schema"] == schema and v["run"] == s["run"] and v["ledger"] == L, (v, s["run"])
assert v["state"] == "paused" and v["reason"].endswith(": ledger view test") and v["reason"] == s["reason"], v
assert v["group"]["checkpoint"] == s["group"]["checkpoint"] and v["group"]["checkpoint"]["step"] >= 1, (v["group"], s["group"])
assert v["group"]["generation"] == s["group"]["generation"] == 1 and v["group"]["active"], v["group"]
assert v["epoch"]["done_batches"] == s["epoch"]["done_batches"], (v["epoch"], s["epoch"])
PY
"$CTL" --ledger "$L" status >"$T/out.txt" || fail "--ledger status (text) beside the coordinator"
grep -q "^state: paused (pause by dflashctl .*: ledger view test), as its coordinator last recorded it$" "$T/out.txt" ||
  fail "live status text: $(cat "$T/out.txt")"
for cmd in batches errors checkpoints; do
  "$CTL" --ledger "$L" "$cmd" >"$T/out.txt" 2>"$T/err.txt" && [[ -s $T/out.txt ]] || fail "--ledger $cmd beside the coordinator: $(cat "$T/err.txt")"
  "$CTL" --ledger "$L" --json "$cmd" | "$CL_PY" -m json.tool >/dev/null || fail "--ledger --json $cmd does not parse"
done
# Killed, its commits still in the -wal file beside the ledger: read from there, the ledger and
# its -wal unchanged; the counts are what SQLite reads from them.
cl_kill coord KILL
cl_wait_exit coord 10
[[ -s $L-wal ]] || fail "test setup: the killed coordinator left no -wal file"
"$CL_PY" - "$CTL" "$L" <<'PY' || fail "--ledger on the ledger of a killed coordinator"
import hashlib, json, os, sqlite3, subprocess, sys
ctl, L = sys.argv[1], sys.argv[2]
def snap():
    return [(hashlib.sha256(open(f, "rb").read()).hexdigest(), os.stat(f).st_mtime_ns) for f in (L, L + "-wal")]
before = snap()
p = subprocess.run([ctl, "--ledger", L, "--json", "status"], capture_output=True, text=True)
assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr)
assert snap() == before, "the ledger or its -wal changed"
v = json.loads(p.stdout)
c = sqlite3.connect("file:%s?mode=ro" % L, uri=True)
per = dict(c.execute("SELECT state, count(*) FROM batches GROUP BY state").fetchall())
m = dict(c.execute("SELECT key, value FROM meta").fetchall())
c.close()
states = ("pending", "leased", "published", "trained", "checkpointed")
assert [v["batches"][k] for k in states] == [per.get(i, 0) for i in range(5)], (v["batches"], per)
assert v["state"] == m["state"] == "paused" and v["group"]["checkpoint"]["step"] == int(m["ckpt_step"]) >= 1, (v, m)
PY
cl_log "read the ledger of the killed coordinator from its -wal"
cl_start coord coordinator-d -c "$CL_INI"
cl_wait 's["state"] == "paused"' 60 coord || fail "the coordinator started again did not come back paused"

# Resumed: read again and again while the coordinator commits, to the end of the run; every
# reading is one commit's (its counts add up).
"$CTL" -s "$CL_SOCK" resume >/dev/null || fail "resume"
reads=0
while cl_alive coord; do
  "$CTL" --ledger "$L" --json status >"$T/live.json" 2>"$T/err.txt" || fail "--ledger beside a committing coordinator: $(cat "$T/err.txt")"
  "$CL_PY" -c '
import json, sys
b = json.load(open(sys.argv[1]))["batches"]
assert sum(b[k] for k in ("pending", "leased", "published", "trained", "checkpointed")) == b["total"] > 0, b' "$T/live.json" ||
    fail "a reading whose counts do not add up: $(cat "$T/live.json")"
  reads=$((reads + 1))
done
((reads > 0)) || fail "the coordinator ended before one reading beside it"
cl_log "read beside the running coordinator ($reads readings while it committed)"

cl_wait_exit coord 300 || fail "the run did not complete: coordinator '$CL_RC'"
for n in target0 drafter0; do cl_wait_exit $n 60 || fail "$n exited with '$CL_RC'"; done
grep -q 'run complete: every batch checkpointed' "$CL_DIR/coord.log" || fail "the run did not complete"
# A reading that held the ledger as the coordinator closed it kept the coordinator from folding
# its WAL into the file: the -wal and -shm files stay (SQLite's way), and the next open (a
# coordinator's start) folds them in. That open here, for a stopped ledger of one file.
if [[ -e $L-wal || -e $L-shm ]]; then
  cl_log "the coordinator closed its ledger during a reading: its -wal and -shm files are folded in here"
  "$CL_PY" -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute("SELECT count(*) FROM meta"); c.close()' "$L"
  [[ ! -e $L-wal && ! -e $L-shm ]] || fail "test setup: -wal and -shm still beside the ledger: $(ls "$CL_DIR/state")"
fi

# ---- the stopped run: every command against the rows ----
# (TZ=UTC: the errors' times print in local time, as online)
TZ=UTC "$CL_PY" - "$CTL" "$L" "$schema" "$T" <<'PY' || fail "the stopped run's ledger"
import collections, hashlib, json, os, shutil, sqlite3, subprocess, sys, time
ctl, L, schema, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

def snapshot(path):
    st = os.stat(path)
    d = os.path.dirname(path) or "."
    return hashlib.sha256(open(path, "rb").read()).hexdigest(), st.st_mtime_ns, st.st_size, sorted(os.listdir(d))

def ctl_run(path, *args):
    """dflashctl --ledger path args: (rc, stdout, stderr); the file and its folder unchanged"""
    before = snapshot(path) if os.path.isfile(path) else None
    p = subprocess.run([ctl, "--ledger", path] + list(args), capture_output=True, text=True)
    if before is not None:
        after = snapshot(path)
        assert after == before, ("changed by dflashctl", args, before, after)
    return p.returncode, p.stdout, p.stderr

def ok(path, *args):
    rc, out, err = ctl_run(path, *args)
    assert rc == 0 and err == "", (args, rc, err)
    return out

def doc(path, *args):
    return json.loads(ok(path, "--json", *args))

def sql(path, q, *a):
    # (immutable: no coordinator writes here, and a read-only open would leave -wal and -shm files)
    c = sqlite3.connect("file:%s?mode=ro&immutable=1" % path, uri=True)
    try:
        return c.execute(q, a).fetchall()
    finally:
        c.close()

def meta(path):
    return dict(sql(path, "SELECT key, value FROM meta"))

def utc(ms):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000))

def check(path):
    m = meta(path)
    states = ["pending", "leased", "published", "trained", "checkpointed"]
    per = collections.Counter(dict(sql(path, "SELECT state, count(*) FROM batches GROUP BY state")))
    total = sum(per.values())
    kept = collections.Counter(b for (b,) in sql(path, "SELECT batch FROM trains WHERE rolled_back = 0"))
    ckpted = [i for (i,) in sql(path, "SELECT id FROM batches WHERE state = 4")]
    n_rows, n_rb = sql(path, "SELECT count(*), count(nullif(rolled_back, 0)) FROM trains")[0]
    n_err, n_fatal = sql(path, "SELECT count(*), count(nullif(fatal, 0)) FROM errors")[0]
    n_ck, n_drop = sql(path, "SELECT count(*), count(dropped) FROM checkpoints")[0]
    head = {"generation": int(m["ckpt_gen"]), "step": int(m["ckpt_step"]), "dir": m["ckpt_dir"]}

    # status
    s = doc(path, "status")
    assert s["schema"] == schema == sql(path, "PRAGMA user_version")[0][0], s["schema"]
    assert s["run"] == "%016x" % int(m["run_id"]), (s["run"], m["run_id"])
    assert s["state"] == m["state"] == "stopped" and s["reason"] == m["reason"], (s["state"], s["reason"], m)
    assert s["dataset"] == m["dataset"] and s["created_ms"] == int(m["created_ms"]), s
    assert s["batches"] == dict({"total": total}, **{k: per[i] for i, k in enumerate(states)}), (s["batches"], per)
    epochs = sql(path, "SELECT epoch, count(*), sum(state = 4) FROM batches GROUP BY epoch ORDER BY epoch")
    assert s["epoch"]["per_epoch"] == [{"epoch": e, "batches": n, "checkpointed": c} for e, n, c in epochs], s["epoch"]
    assert s["epoch"]["scheduled"] == len(epochs) and s["epoch"]["done_batches"] == per[4], s["epoch"]
    assert s["epoch"]["run_batches"] == int(m["run_batches"]), s["epoch"]
    # the run's batches: the scheduled epochs' and epoch 0's for each epoch not scheduled yet (the
    # estimate run_batches, made when the first group formed, is only the lr horizon)
    n_ep = int(m["epochs"])
    want_total = sum(n for _, n, _ in epochs) + (n_ep - len(epochs)) * epochs[0][1]
    assert s["epoch"]["epochs"] == n_ep and s["epoch"]["total_batches"] == want_total, s["epoch"]
    assert s["last_change_ms"] == sql(path, "SELECT max(updated_ms) FROM batches")[0][0], s["last_change_ms"]
    assert s["group"]["generation"] == int(m["group_gen"]) and s["group"]["checkpoint"] == head, (s["group"], m)
    assert s["group"]["world_size"] == int(m["gen%s_world" % m["group_gen"]]) == 1, s["group"]
    assert s["checkpoints"] == {"count": n_ck, "dropped": n_drop}, s["checkpoints"]
    assert s["trains"] == {"rows": n_rows, "rolled_back": n_rb, "trained_twice": sum(1 for n in kept.values() if n > 1),
                           "checkpointed_not_once": sum(1 for i in ckpted if kept[i] != 1)}, s["trains"]
    assert s["error_count"] == n_err and s["fatal_count"] == n_fatal and len(s["errors"]) == min(n_err, 10), s
    text = ok(path, "status").splitlines()
    assert text[0] == "ledger %s (schema %d): run %s, created %s UTC, dataset %s" % (
        path, schema, s["run"], utc(s["created_ms"]), m["dataset"]), text[0]
    assert text[1] == "state: stopped (%s), as its coordinator last recorded it" % m["reason"], text[1]
    line = "epochs scheduled: %d of %d; the run: %.1f%% (%d of %s%d batches checkpointed)" % (
        len(epochs), n_ep, 100.0 * per[4] / want_total, per[4], "" if len(epochs) == n_ep else "about ", want_total)
    assert line in text, (line, text)
    line = "batches of the epochs scheduled: %d: %s; last change %s UTC" % (
        total, ", ".join("%s %d" % (k, per[i]) for i, k in enumerate(states)), utc(s["last_change_ms"]))
    assert line in text, (line, text)
    line = "drafter group: generation %s (1 rank), not formed; lineage head: step %d (generation %d) %s" % (
        m["group_gen"], head["step"], head["generation"], head["dir"])
    assert line in text, (line, text)
    line = ("trainings: %d recorded, %d rolled back; batches trained more than once in the lineage: %d; checkpointed "
            "batches not trained exactly once: %d" % (n_rows, n_rb, s["trains"]["trained_twice"],
                                                      s["trains"]["checkpointed_not_once"]))
    assert line in text, (line, text)
    assert "errors: %d (%d fatal)" % (n_err, n_fatal) in text, text

    # batches: the -n changed last, newest first
    want = sql(path, "SELECT id, epoch, idx, state, leases, gen, step FROM batches ORDER BY updated_ms DESC, id DESC")
    for n in (None, 5):
        b = doc(path, *(["-n", str(n)] if n else []), "batches")
        rows = b["recent"]
        assert [r["id"] for r in rows] == [w[0] for w in want[:n or 100]], ([r["id"] for r in rows], want[:5])
        for r, (i, e, x, st, leases, gen, step) in zip(rows, want):
            assert (r["epoch"], r["index"], r["state"], r["leases"], r["trains"]) == (e, x, states[st], leases, kept[i]), r
            assert st < 3 or (r["generation"], r["step"]) == (gen, step), r
        assert b["batches"] == s["batches"] and b["epoch"]["per_epoch"] == s["epoch"]["per_epoch"], b
    text = ok(path, "-n", "5", "batches").splitlines()
    body = text[text.index(next(l for l in text if l.startswith("BATCH "))) + 1:]
    assert len(body) == 5 and body[0].split()[0] == "%d:%d" % want[0][1:3], body
    assert body[0].split()[1] == states[want[0][3]], body

    # checkpoints: the coordinator's document, newest first
    c = doc(path, "checkpoints")
    rows = sql(path, "SELECT gen, step, dir, ms, dropped FROM checkpoints ORDER BY rowid DESC LIMIT 100")
    assert c["head"] == head, c["head"]
    assert [(r["generation"], r["step"], r["dir"], r["written_ms"], r["dropped"]) for r in c["checkpoints"]] == \
        [tuple(r) for r in rows], c["checkpoints"]
    assert all(r["on_disk"] == os.path.isdir(r["dir"]) for r in c["checkpoints"]), c["checkpoints"]
    text = ok(path, "checkpoints").splitlines()
    assert text[0] == "lineage head: step %d (generation %d) %s" % (head["step"], head["generation"], head["dir"]), text
    assert any(l.split()[4:5] == ["head"] and l.endswith(head["dir"]) for l in text), text
    assert len(doc(path, "-n", "2", "checkpoints")["checkpoints"]) == min(2, n_ck)
    return s, m

s, m = check(L)
assert s["error_count"] == 0, s["errors"]
out = ok(L, "errors")
assert out == "errors: 0 (0 fatal)\n", out
print("stopped run: %d batches, %d trains rows, head step %d" % (
    s["batches"]["total"], s["trains"]["rows"], s["group"]["checkpoint"]["step"]))

# A copy with five errors (the newest fatal) and the head's checkpoint dropped (as a CKPT_BAD
# drops one): the errors print as the online command prints them, newest first.
C = os.path.join(T, "copy.db")
shutil.copyfile(L, C)
con = sqlite3.connect(C)
con.executemany("INSERT INTO errors VALUES (?, 'target', 0, 4242, ?, -5, ?)",
                [(1700000000000 + 1000 * k, int(k == 5), "test error %d" % k) for k in range(1, 6)])
# (and the lineage falls back to the one before it, as the coordinator's fall back does)
con.execute("UPDATE checkpoints SET dropped = 'test: does not load' WHERE rowid = (SELECT max(rowid) FROM checkpoints)")
gen, step, d = con.execute("SELECT gen, step, dir FROM checkpoints WHERE dropped IS NULL ORDER BY rowid DESC").fetchone()
con.executemany("UPDATE meta SET value = ? WHERE key = ?", [(str(gen), "ckpt_gen"), (str(step), "ckpt_step"), (d, "ckpt_dir")])
con.commit()
con.close()
s, m = check(C)
assert s["error_count"] == 5 and s["fatal_count"] == 1 and s["checkpoints"]["dropped"] == 1, s
e = doc(C, "-n", "3", "errors")
assert e["count"] == 5 and e["fatal"] == 1 and [x["message"] for x in e["errors"]] == ["test error 5", "test error 4", "test error 3"], e
assert e["errors"][0] == {"wall_ms": 1700000005000, "role": "target", "gpu": 0, "pid": 4242, "fatal": True, "code": -5,
                          "message": "test error 5"}, e["errors"][0]
out = ok(C, "-n", "3", "errors")
assert out == ("errors: 5 (1 fatal)\n  %s target@0 pid 4242 FATAL: test error 5\n  %s target@0 pid 4242 test error 4\n"
               "  %s target@0 pid 4242 test error 3\n" % (utc(1700000005000), utc(1700000004000), utc(1700000003000))), out
# Who a row is of: the coordinator by name (not "coordinator@-1 pid 0"), a daemon whose GPU is not
# known without one, and none where the message begins by naming the daemon itself
con = sqlite3.connect(C)
con.executemany("INSERT INTO errors VALUES (?, ?, ?, ?, 0, -5, ?)", [
    (1700000006000, "coordinator", -1, 0, "lock held"),
    (1700000007000, "drafter", -1, 99, "drafter-d (pid 99) died while away"),
    (1700000008000, "target", 1, 77, "target-d@1 (pid 77) died without a word"),
    (1700000009000, "target", 0, 55, "target-d@0 exits: no room")])
con.commit()
con.close()
out = ok(C, "-n", "4", "errors")
assert out == ("errors: 9 (1 fatal)\n  %s target@0 pid 55 target-d@0 exits: no room\n  %s target-d@1 (pid 77) died "
               "without a word\n  %s drafter-d (pid 99) died while away\n  %s coordinator lock held\n" % (
               utc(1700000009000), utc(1700000008000), utc(1700000007000), utc(1700000006000))), out
# A message with controls (ESC, C1's CSI) and bytes that are no UTF-8 (a ledger is a file anyone
# with access may have written): printed plain, '?' for each such byte, in the table and the JSON
con = sqlite3.connect(C)
con.execute("INSERT INTO errors VALUES (1700000010000, 'target', 0, 66, 0, -5, ?)",
            ("clear\x1b[2J\u009b3J screen",))
con.execute("INSERT INTO errors VALUES (1700000011000, 'target', 0, 67, 0, -5, CAST(? AS TEXT))",
            (b"cut \xc3 bad \xff\x80 end",))
con.commit()
con.close()
for args in (["-n", "2", "errors"], ["--json", "-n", "2", "errors"]):
    p = subprocess.run([ctl, "--ledger", C] + args, capture_output=True)
    assert p.returncode == 0, (args, p)
    assert b"\x1b" not in p.stdout and b"\xc2\x9b" not in p.stdout, (args, p.stdout)
    text = p.stdout.decode("utf-8")         # (strict: raises on what is no UTF-8)
    assert "clear?[2J??3J screen" in text and "cut ? bad ?? end" in text, (args, text)
json.loads(p.stdout.decode("utf-8"))
out = ok(C, "checkpoints").splitlines()
assert out[2].split()[4] == "dropped" and out[3].strip() == "test: does not load" and out[4].split()[4] == "head", out

# Epochs with every batch checkpointed are counted in one line, the others listed (a long run
# has hundreds of epochs): two more epochs, complete, beside epoch 0 with one batch left pending
E = os.path.join(T, "epochs.db")
shutil.copyfile(C, E)
con = sqlite3.connect(E)
for ep in (1, 2):
    con.execute("INSERT INTO batches SELECT id + (?1 << 32), ?1, idx, n_samples, n_tokens, 4, 0, -1, gen, step, leases, "
                "updated_ms FROM batches WHERE epoch = 0", (ep,))
con.execute("UPDATE batches SET state = 0 WHERE id = (SELECT max(id) FROM batches WHERE epoch = 0)")
con.commit()
n0 = con.execute("SELECT count(*), sum(state = 4) FROM batches WHERE epoch = 0").fetchone()
con.close()
lines = [l for l in ok(E, "status").splitlines() if l.startswith(("epoch ", "2 epochs"))]
assert lines == ["2 epochs with every batch checkpointed",
                 "epoch 1 (batch ids 0:*): %d of %d batches checkpointed" % (n0[1], n0[0])], lines

# The path as SQLite's URI would misread it (a '?', '#' or '%' in a name), a link, a relative path.
W = os.path.join(T, "we?ird#name%41 x.db")
shutil.copyfile(C, W)
assert doc(W, "status")["error_count"] == 11
os.symlink(C, os.path.join(T, "link.db"))
assert doc(os.path.join(T, "link.db"), "status")["error_count"] == 11
p = subprocess.run([ctl, "--ledger", "copy.db", "--json", "status"], capture_output=True, text=True, cwd=T)
assert p.returncode == 0 and json.loads(p.stdout)["error_count"] == 11, p.stderr
assert sorted(f for f in os.listdir(T) if f.startswith(("copy.db", "we?ird", "link.db"))) == \
    ["copy.db", "link.db", "we?ird#name%41 x.db"], os.listdir(T)

# ---- refused in one line, exit 1 ----
def refused(path, reason, *args):
    rc, out, err = ctl_run(path, *(args or ("status",)))
    want = "dflashctl: %s: %s\n" % (path, reason)
    assert rc == 1 and out == "" and err == want, (path, rc, out, err, want)

refused(os.path.join(T, "missing.db"), "No such file or directory")
assert not os.path.exists(os.path.join(T, "missing.db"))
refused(T, "a folder, not a ledger file")
open(os.path.join(T, "empty.db"), "w").close()
refused(os.path.join(T, "empty.db"), "an empty file, not a ledger")
open(os.path.join(T, "notes.txt"), "w").write("not a database, " * 20)
refused(os.path.join(T, "notes.txt"), "not an SQLite database (no SQLite header), so not a ledger")
other = os.path.join(T, "other.db")
con = sqlite3.connect(other); con.execute("CREATE TABLE t(x)"); con.commit(); con.close()
refused(other, "an SQLite database but not a dflash ledger (it has no table 'meta')")
for v, why in ((schema + 1, "written by a newer dflash"),
               (schema - 1, "written by an older dflash: a coordinator of this one updates it when it next starts on it")):
    V = os.path.join(T, "schema%d.db" % v)
    shutil.copyfile(L, V)
    con = sqlite3.connect(V); con.execute("PRAGMA user_version = %d" % v); con.commit(); con.close()
    for cmd in ("status", "batches", "errors", "checkpoints"):
        refused(V, "ledger schema %d, this dflashctl reads schema %d (%s)" % (v, schema, why), cmd)
if os.geteuid() != 0:
    U = os.path.join(T, "unreadable.db")
    shutil.copyfile(L, U)
    os.chmod(U, 0)
    refused(U, "Permission denied")
# Locked: a writer holding the exclusive lock (locking_mode EXCLUSIVE) past the 5 s busy wait.
K = os.path.join(T, "locked.db")
shutil.copyfile(L, K)
con = sqlite3.connect(K, isolation_level=None)
con.execute("PRAGMA locking_mode = EXCLUSIVE")
con.execute("BEGIN EXCLUSIVE")
con.execute("UPDATE meta SET value = value WHERE key = 'state'")
p = subprocess.run([ctl, "--ledger", K, "status"], capture_output=True, text=True)
con.execute("ROLLBACK")
con.close()
assert p.returncode == 1 and p.stdout == "" and p.stderr.startswith("dflashctl: %s: locked by another process (SQLite, " % K) \
    and p.stderr.endswith(": database is locked)\n") and p.stderr.count("\n") == 1, (p.returncode, p.stderr)
print("refusals ok")
PY

# Usage errors (64): --ledger with a socket, a command the ledger does not answer, no path.
"$CTL" --ledger "$L" -s "$T/x.sock" status 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -q "^dflashctl: --ledger reads a file, no coordinator: it goes without -s" "$T/err.txt" ||
  fail "--ledger with -s: exit $rc: $(cat "$T/err.txt")"
"$CTL" --ledger "$L" ring 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -q "^dflashctl: ring: not kept in the ledger (--ledger reads status, batches, errors, checkpoints)$" "$T/err.txt" ||
  fail "--ledger ring: exit $rc: $(cat "$T/err.txt")"
"$CTL" --ledger "$L" pause 2>/dev/null; rc=$?
[[ $rc == 64 ]] || fail "--ledger pause: exit $rc"
"$CTL" status --ledger 2>"$T/err.txt"; rc=$?
[[ $rc == 64 ]] && grep -q "^dflashctl: --ledger needs a value$" "$T/err.txt" || fail "--ledger without a path: exit $rc: $(cat "$T/err.txt")"
"$CTL" --help | grep -q "dflashctl --ledger PATH \[--json\] \[-n LIMIT\] status|batches|errors|checkpoints" ||
  fail "--help does not show --ledger"
[[ ! -e $L-wal && ! -e $L-shm ]] || fail "files left beside the ledger: $(ls "$CL_DIR/state")"

# The stop note's hint names the config's ledger as one shell word, whatever its name holds.
odd="$T/it's a run"
mkdir -p "$odd/run" "$odd/state"
cp "$L" "$odd/state/odd-ledger.db"
printf '[cluster]\nname = odd\nruntime_dir = %s/run\nstate_dir = %s/state\n' "$odd" "$odd" >"$odd/dflash.ini"
echo "stopped: run complete" >"$odd/run/odd.sock.stopped"
"$CTL" -c "$odd/dflash.ini" errors 2>"$T/err.txt" && fail "dflashctl with no coordinator: exit 0"
hint=$(sed -n 's/^dflashctl: the run.s record: //p' "$T/err.txt")
eval "set -- $hint"
[[ $# == 4 && $1 == dflashctl && $2 == --ledger && $3 == "$odd/state/odd-ledger.db" && $4 == errors ]] ||
  fail "the hint is not one command line: '$hint' ($(cat "$T/err.txt"))"
"$CTL" --ledger "$3" errors >/dev/null || fail "the hint's ledger does not read"
echo "ok: dflashctl --ledger"
