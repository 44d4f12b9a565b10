#!/usr/bin/env python3
"""soak.py: the kill-everything soak of a dflash cluster of plain processes (started by
tests/soak/soak.sh, which prepares the model, data and config). It supervises a coordinator,
targets and a drafter group like systemd would (a daemon that exits is started again after a
short delay) and SIGKILLs a random daemon at random points of the run's progress, until the
run completes on its own. Meanwhile it checks that no ring slot stays held by a dead process,
that a target or coordinator kill never ends the drafter group's generation, and that no daemon
crashes by itself (signal, config error). At the end: every daemon exits 0, the ledger, the
final checkpoint and the metrics agree that every batch was trained exactly once in the
surviving lineage (check_run.py), every ring slot is FREE, nothing is left in /dev/shm and no
socket is left in the runtime dir. Prints a summary; exit 0 ok, 1 failed."""
import argparse
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_run  # noqa: E402

RING_STATES = ["FREE", "WRITING", "READY", "READING"]
# Sanitizer reports: an ASan / UBSan / LSan / TSan finding in any daemon fails the soak (the
# daemon's exit code alone is 1, which looks like an ordinary failure systemd restarts).
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "WARNING: ThreadSanitizer")
# Internal consistency checks that log instead of crashing: any of them is a bug.
INVARIANT_MARKS = ("lease list out of step",)
# libuv's assertion when a handle is closed twice (coordinator-d's exit path).


def now():
    return time.monotonic()


class Daemon:
    def __init__(self, name, kind, argv, logdir):
        self.name, self.kind, self.argv = name, kind, argv
        self.log = os.path.join(logdir, name + ".log")
        self.proc = None
        self.started = 0.0
        self.restart_at = None      # when a down daemon is started again
        self.killed = False         # the current process was SIGKILLed by us
        self.starts = self.kills = 0
        self.exited_at = 0.0
        self.exits = []             # (rc, seconds it ran) of exits we did not cause
        self.gone_pids = set()      # processes SIGKILLed by us or that exited other than 0

    def start(self):
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.started, self.restart_at, self.killed = now(), None, False
        self.starts += 1

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        self.killed = True
        self.kills += 1
        self.gone_pids.add(self.proc.pid)
        self.proc.send_signal(signal.SIGKILL)


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.t0 = now()
        self.failures = []
        self.events = open(os.path.join(a.dir, "soak-events.log"), "a", buffering=1)
        cfg = ["-c", a.ini]
        self.coord = Daemon("coord", "coordinator", [os.path.join(a.bin, "coordinator-d")] + cfg, a.dir)
        self.targets = [Daemon("target%d" % i, "target", [os.path.join(a.bin, "target-d")] + cfg + ["-i", str(i)], a.dir)
                        for i in range(a.targets)]
        self.drafters = [Daemon("drafter%d" % i, "drafter", [os.path.join(a.bin, "drafter-d")] + cfg + ["-i", str(i)],
                                a.dir) for i in range(a.world)]
        self.daemons = [self.coord] + self.targets + self.drafters
        self.status = None
        self.status_at = 0.0
        self.max_gen = 0
        self.suspects = {}          # (slot, pid, state) -> first seen held by a dead pid
        self.suspects_since = None  # the coordinator start those sightings belong to
        self.leaks = 0
        self.ring_checks = 0
        self.coord_done = False
        self.ring_fd = None
        self.drained_early = []     # the coordinator exited 0 before the run was complete
        self.operator_starts = 0

    def say(self, msg):
        line = "[%7.1fs] %s" % (now() - self.t0, msg)
        print(line, flush=True)
        self.events.write(line + "\n")

    def fail(self, msg):
        self.failures.append(msg)
        self.say("FAIL: " + msg)

    def ctl(self, *args, timeout=10):
        try:
            p = subprocess.run([os.path.join(self.a.bin, "dflashctl"), "-s", self.a.sock, "--json"] + list(args),
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if p.returncode != 0:
            return None
        try:
            return json.loads(p.stdout)
        except ValueError:
            return None

    # ---- supervision --------------------------------------------------------------------------

    def reap(self):
        for d in self.daemons:
            if d.proc is None or d.proc.poll() is None:
                continue
            rc, ran = d.proc.returncode, now() - d.started
            d.proc, d.exited_at = None, now()
            if d.killed:
                pass
            elif rc == 0:
                # A clean exit (drain, stop) is not restarted by systemd: see restart_due.
                state, reason = self.ledger_state() if d is self.coord else ("", "")
                self.say("%s exited 0 after %.1fs%s" % (d.name, ran, " (%s: %s)" % (state, reason) if state else ""))
                if d is self.coord and "run complete" in reason:
                    self.coord_done = True
                elif d is self.coord:
                    self.drained_early.append((now() - self.t0, state, reason))
                    # Nothing here drains the run: only the final checkpoint ends it.
                    self.fail("the run ended '%s: %s' with batches left, every daemon exiting 0" % (state, reason))
                    d.restart_at = now() + self.rng.uniform(0.2, self.a.restart_delay)
                continue
            else:
                d.exits.append((rc, ran))
                d.gone_pids.add(d.proc.pid)
                self.say("%s exited by itself with %s after %.1fs" % (d.name, rc, ran))
                if rc < 0 or rc == 78:
                    self.fail("%s: exit %s (%s)" % (d.name, rc, "signal %d" % -rc if rc < 0 else "config error"))
            if self.coord_done:
                continue
            d.restart_at = now() + self.rng.uniform(0.2, self.a.restart_delay)

    def log_count(self, d, text):
        try:
            with open(d.log, errors="replace") as f:
                return f.read().count(text)
        except OSError:
            return 0

    def ledger_state(self):
        import sqlite3
        try:
            db = sqlite3.connect("file:%s?mode=ro" % self.a.ledger, uri=True)
            meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('state', 'reason')").fetchall())
            db.close()
            return meta.get("state", "?"), meta.get("reason", "")
        except sqlite3.Error as e:
            return "?", str(e)

    def restart_due(self):
        for d in self.daemons:
            if d.proc is None and d.restart_at is not None and now() >= d.restart_at and not self.coord_done:
                d.start()
                self.say("started %s again (pid %d, start %d)" % (d.name, d.proc.pid, d.starts))
        # Daemons that left cleanly (a drain) are started again once the cluster runs and
        # wants them, as an operator would (`systemctl start dflash.target`).
        s = self.status
        if self.coord.alive() and s and s["state"] == "running":
            for d in self.targets + self.drafters:
                if d.proc is None and d.restart_at is None and self.status_at > d.exited_at + 0.5:
                    d.start()
                    self.operator_starts += 1
                    self.say("started %s again: it left in a drain, the cluster runs again" % d.name)

    # ---- observation --------------------------------------------------------------------------

    def poll_status(self):
        if not self.coord.alive():
            return
        s = self.ctl("status")
        if not s:
            return
        self.status, self.status_at = s, now()
        g = s["group"]["generation"]
        self.max_gen = max(self.max_gen, g)

    def check_ring(self):
        """A WRITING / READING slot of a dead process must be reclaimed soon after the
        coordinator (up and out of recovery) sees it: it never is while the coordinator is down."""
        if not self.coord.alive() or self.coord.started != self.suspects_since:
            self.suspects.clear()
            self.suspects_since = self.coord.started if self.coord.alive() else None
            return
        r = self.ctl("ring")
        if not r:
            return
        self.ring_checks += 1
        seen = set()
        for sl in r.get("slot_list", []):
            if sl["state"] not in ("WRITING", "READING") or not sl["pid"]:
                continue
            try:
                os.kill(int(sl["pid"]), 0)
                continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            key = (sl["slot"], sl["pid"], sl["state"])
            seen.add(key)
            first = self.suspects.setdefault(key, now())
            if now() - first > self.a.leak_after * self.a.scale:
                self.leaks += 1
                self.fail("slot %d stays %s for dead pid %d (batch %d:%d) for %.0fs" %
                          (sl["slot"], sl["state"], sl["pid"], sl["epoch"], sl["index"], now() - first))
                self.suspects[key] = now() + 1e9
        for k in list(self.suspects):
            if k not in seen:
                del self.suspects[k]

    # ---- kills --------------------------------------------------------------------------------

    def plan_kinds(self):
        """The kind of each kill: the min_per_kind of each kind first, round by round (each round
        one of every kind, in a random order), then the rest drawn by weight. A run may end before
        its last planned kill points (a fast machine finishes the epochs early; kills keep a gap),
        so the guaranteed ones must not wait behind drawn ones."""
        a = self.a
        kinds = ["target", "drafter", "coordinator"]
        def drawn(n):
            return [self.rng.choices(kinds, [a.w_target, a.w_drafter, a.w_coord])[0] for _ in range(n)]
        head = []
        for _ in range(a.min_per_kind):
            round_ = kinds[:]
            self.rng.shuffle(round_)
            head += round_
        self.n_guaranteed = len(head)
        return head + drawn(max(0, a.kills - len(head))) + drawn(1000)  # time-paced runs may go on

    def pick_victim(self, kind):
        pool = [d for d in self.daemons if d.kind == kind and d.alive()]
        return self.rng.choice(pool) if pool else None

    def run(self):
        a = self.a
        self.kill_log = []
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
        self.coord.start()
        deadline = now() + 60 * a.scale
        while not self.coord_done and now() < deadline:
            self.reap()
            self.poll_status()
            if self.status and self.status["state"] == "running":
                break
            time.sleep(0.1)
        if not self.status:
            self.fail("the coordinator did not come up")
            return
        self.ring_fd = os.open("/dev/shm/dflash-" + a.name, os.O_RDONLY)
        for d in self.targets + self.drafters:
            d.start()
        total = self.status["epoch"]["total_batches"]
        points = sorted(self.rng.uniform(0.03, 0.92) for _ in range(a.kills))
        plan = self.plan_kinds()
        self.say("soak: %d daemons, about %d batches in %d epochs, %d kills planned (seed %d)" %
                 (len(self.daemons), total, self.status["epoch"]["epochs"], a.kills, a.seed))
        next_gap = 0.0
        finale = False
        if a.minutes:
            points = []
            next_gap = self.rng.uniform(0.3, 1.7) * a.minutes * 60 / a.kills
        last_kill = now()
        last_ring = last_report = 0.0
        end_by = now() + a.max_minutes * 60 * a.scale
        while not self.coord_done:
            if now() > end_by:
                self.fail("the run did not complete within %g minutes" % a.max_minutes)
                return
            self.reap()
            if self.coord_done:
                break       # the run completed: no kill and no start from here on
            self.restart_due()
            self.poll_status()
            if now() - last_ring > 1.0:
                self.check_ring()
                last_ring = now()
            s = self.status
            prog = s["epoch"]["progress"] if s else 0.0
            if now() - last_report > 30 and s:
                last_report = now()
                self.say("progress %.1f%%, state %s, %d kills, generation %d, checkpoint step %d, batches %s" %
                         (100 * prog, s["state"], len(self.kill_log), s["group"]["generation"],
                          s["group"]["checkpoint"]["step"], {k: v for k, v in s["batches"].items() if v}))
            if a.minutes:
                # Time-paced: kills at random intervals averaging minutes/kills, until both
                # the time and the number are reached; then the run is shortened to the
                # epochs already scheduled, and completes.
                due = not finale and now() - last_kill >= next_gap
                if not finale and now() - self.t0 >= a.minutes * 60 and len(self.kill_log) >= a.kills:
                    finale = True
                    self.shorten_run()
                    continue
            else:
                due = points and prog >= points[0] and now() - last_kill >= next_gap
            if due:
                v = self.pick_victim(plan[len(self.kill_log)])
                if v:
                    if points:
                        points.pop(0)
                    v.kill()
                    self.kill_log.append((now() - self.t0, v.kind, v.name, prog))
                    self.say("kill %d: SIGKILL %s (pid %d) at %.1f%% (state %s)" %
                             (len(self.kill_log), v.name, v.proc.pid, 100 * prog, s["state"] if s else "?"))
                    last_kill = now()
                    if a.minutes:
                        mean = a.minutes * 60 / a.kills
                        next_gap = max(a.gap_min, self.rng.uniform(0.3 * mean, 1.7 * mean))
                    else:
                        # The guaranteed kills (first in the plan) at shorter gaps: a fast run
                        # must not end before them.
                        hi = a.gap_max
                        if len(self.kill_log) < self.n_guaranteed:
                            hi = (a.gap_min + a.gap_max) / 2
                        next_gap = self.rng.uniform(a.gap_min, hi)
            time.sleep(a.poll)
        self.finish(points)

    def shorten_run(self):
        """The last kill: the coordinator, started again with data.epochs = the epochs it has
        scheduled (read from the ledger while it is down), so the run ends after them. A
        restart with another run length is what an operator does to end a run early."""
        c = self.coord
        while not c.alive():
            time.sleep(0.1)
            self.reap()
            self.restart_due()
        c.kill()
        self.kill_log.append((now() - self.t0, c.kind, c.name, -1))
        c.proc.wait()
        import sqlite3
        db = sqlite3.connect("file:%s?mode=ro" % self.a.ledger, uri=True)
        epochs = db.execute("SELECT max(epoch) + 1 FROM batches").fetchone()[0]
        db.close()
        c.argv = c.argv + ["-o", "data.epochs=%d" % epochs]
        self.say("kill %d: SIGKILL coord, started again with data.epochs=%d: the run ends after the scheduled epochs"
                 % (len(self.kill_log), epochs))
        self.reap()
        c.restart_at = now()
        self.restart_due()

    # ---- the end ------------------------------------------------------------------------------

    def finish(self, points):
        a = self.a
        self.say("run complete; %d kills done, %d planned kill points not reached" % (len(self.kill_log), len(points)))
        for d in self.targets + self.drafters:
            if d.proc is None:
                continue
            try:
                rc = d.proc.wait(timeout=60 * a.scale)
            except subprocess.TimeoutExpired:
                self.fail("%s still running 60s after the coordinator left" % d.name)
                d.proc.kill()
                d.proc.wait()
                continue
            if rc != 0 and not d.killed:
                self.fail("%s exited %d at the end (ran %.1fs)" % (d.name, rc, now() - d.started))
            d.proc = None
        words = [struct.unpack("<Q", os.pread(self.ring_fd, 8, 4096 + 64 * i))[0] for i in range(a.slots)]
        states = [RING_STATES[w & 3] for w in words]
        if any(st != "FREE" for st in states):
            self.fail("ring at the end: %s" % " ".join(states))
        os.close(self.ring_fd)
        left = [f for f in os.listdir("/dev/shm") if f.startswith("dflash-" + a.name)]
        if left:
            self.fail("left in /dev/shm: %s" % left)
        socks = []
        for root, _, files in os.walk(a.rundir):
            for f in files:
                p = os.path.join(root, f)
                if os.path.exists(p) and (os.lstat(p).st_mode & 0o170000) == 0o140000:
                    socks.append(p)
        if socks:
            self.fail("sockets left: %s" % socks)
        import sqlite3
        db = sqlite3.connect("file:%s?mode=ro" % a.ledger, uri=True)
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("state") != "stopped" or "run complete" not in meta.get("reason", ""):
            self.fail("ledger says the run ended %s: %s" % (meta.get("state"), meta.get("reason")))
        n_err = db.execute("SELECT count(*) FROM errors").fetchone()[0]
        died = [m for (m,) in db.execute("SELECT message FROM errors WHERE message LIKE '%died without a word%'")]
        db.close()
        # A death the coordinator recorded (a target or drafter gone without its BYE) is one of a
        # process killed here or one that failed by itself: a daemon leaving cleanly says BYE.
        gone = set().union(*(d.gone_pids for d in self.daemons))
        for m in died:
            pid = re.search(r"\(pid (\d+)\) died without a word", m)
            if not pid or int(pid.group(1)) not in gone:
                self.fail("recorded as dead, but neither killed nor failed: %s" % m)
        td_kills = sum(d.kills for d in self.daemons if d.kind != "coordinator")
        if td_kills >= 3 and not died:
            self.fail("%d target and drafter kills, none recorded as a death in the ledger" % td_kills)
        self.deaths = len(died)
        for d in self.daemons:
            for mark in SANITIZER_MARKS:
                n = self.log_count(d, mark)
                if n:
                    self.fail("%s.log: %d sanitizer reports '%s'" % (d.name, n, mark))
            for mark in INVARIANT_MARKS:
                n = self.log_count(d, mark)
                if n:
                    self.fail("%s.log: %d broken invariants '%s'" % (d.name, n, mark))
        # Generations end only through drafters leaving: a target or coordinator kill must not.
        # The coordinator's reasons: a drafter died / left, or did not rejoin within
        # coordinator.recovery_ms after a coordinator restart (slow, not wrong: counted apart).
        drafter_exits = sum(len(d.exits) for d in self.drafters)
        drafter_kills = sum(d.kills for d in self.drafters)
        ends = re.findall(r"drafter group generation \d+ ends \((.*)\): restarting", open(self.coord.log, errors="replace").read())
        late = sum("did not come back after the coordinator restart" in r for r in ends)
        ended = len(ends) - late
        if ended > drafter_kills + drafter_exits:
            self.fail("%d generations ended for %d drafter kills and %d drafter exits: %s" %
                      (ended, drafter_kills, drafter_exits, sorted(set(ends))))
        self.late_rejoins = late
        # Every start after the first that came up resumed from the ledger (never a fresh run).
        starts = open(self.coord.log, errors="replace").read().split("# coordinator-d effective configuration")[2:]
        fresh = [i for i, t in enumerate(starts) if "coordinator-d: ready:" in t and "coordinator-d: resuming from " not in t]
        if fresh:
            self.fail("coordinator starts %s came up without resuming from the ledger" % [i + 2 for i in fresh])
        sys.stdout.flush()
        saved = sys.argv
        sys.argv = ["check_run.py", a.ledger, a.state]
        rc = check_run.main()
        sys.argv = saved
        if rc:
            self.failures.append("check_run: " + "; ".join(check_run.failures[:5]))
        kinds = {}
        for _, kind, _, _ in self.kill_log:
            kinds[kind] = kinds.get(kind, 0) + 1
        for kind in ("target", "drafter", "coordinator"):
            if kinds.get(kind, 0) < a.min_per_kind:
                self.fail("%d %s kills, want at least %d" % (kinds.get(kind, 0), kind, a.min_per_kind))
        exits = {d.name: d.exits for d in self.daemons if d.exits}
        self.say("summary: %s in %.1f min; %d kills (%s); %d generations (%d ended); %d unexpected exits %s; "
                 "%d ring checks, %d leaks; %d errors in the ledger (%d deaths); %d restarts; %d runs ended early (drained) %s, "
                 "%d daemons started again after leaving in a drain; %d group restarts because a drafter rejoined "
                 "a restarted coordinator too late" %
                 ("FAIL" if self.failures else "ok", (now() - self.t0) / 60, len(self.kill_log),
                  ", ".join("%s %d" % kv for kv in sorted(kinds.items())), self.max_gen, ended,
                  sum(len(v) for v in exits.values()), exits or "", self.ring_checks, self.leaks, n_err, self.deaths,
                  sum(d.starts - 1 for d in self.daemons), len(self.drained_early), self.drained_early or "",
                  self.operator_starts, self.late_rejoins))

    def cleanup(self):
        for d in self.daemons:
            if d.alive():
                d.proc.send_signal(signal.SIGKILL)
                d.proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--ini", required=True)
    ap.add_argument("--sock", required=True)
    ap.add_argument("--dir", required=True, help="run dir: daemon logs, soak-events.log")
    ap.add_argument("--rundir", required=True, help="cluster.runtime_dir")
    ap.add_argument("--state", required=True, help="cluster.state_dir")
    ap.add_argument("--name", required=True, help="cluster.name")
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--targets", type=int, default=2)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--min-per-kind", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gap-min", type=float, default=1.0, help="seconds between kills, at least")
    ap.add_argument("--gap-max", type=float, default=3.0)
    ap.add_argument("--restart-delay", type=float, default=1.0, help="a daemon is restarted 0.2..this s after it died")
    ap.add_argument("--leak-after", type=float, default=5.0, help="a dead owner's slot must be reclaimed within")
    ap.add_argument("--w-target", type=float, default=0.4)
    ap.add_argument("--w-drafter", type=float, default=0.35)
    ap.add_argument("--w-coord", type=float, default=0.25)
    ap.add_argument("--max-minutes", type=float, default=10)
    ap.add_argument("--minutes", type=float, default=0,
                    help="time-paced: kill for this long (and at least --kills times), then end the run after "
                         "the epochs scheduled by then (0: kills at random points of the run's progress)")
    ap.add_argument("--poll", type=float, default=0.15, help="seconds between status polls")
    ap.add_argument("--scale", type=float, default=float(os.environ.get("DFLASH_TEST_TIME_SCALE", "1")))
    a = ap.parse_args()
    s = Soak(a)
    try:
        s.run()
    finally:
        s.cleanup()
    if s.failures:
        print("FAIL: %d problems:" % len(s.failures))
        for f in s.failures[:30]:
            print("  " + f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
