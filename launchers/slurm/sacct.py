"""`sacct` stand-in for the single-node dev/CI SLURM cluster (which has no slurmdbd, so the real sacct fails).

start.sh puts a wrapper named `sacct` that runs this file on PATH (<state>/bin). It answers the subset of sacct
that submitit (and a developer) uses, e.g. submitit's poll

    sacct -o JobID,State,NodeList --parsable2 -j 12 -j 13

by combining two sources:
  * `scontrol -o show job`: every job slurmctld still holds (pending, running, and finished ones for
    MinJobAge seconds, 3600 in our slurm.conf);
  * the jobcomp/filetxt log (JobCompLoc in slurm.conf): one line per job, written when the job ends -- this
    also covers jobs that have left slurmctld's memory, and gives the final state of a job that scontrol
    still shows as COMPLETING (scontrol hides the base state behind that flag; real sacct shows e.g.
    CANCELLED at once, and submitit counts COMPLETING as "not done").
A job id that neither source knows although a later id exists was lost (controller state wiped): it is
reported FAILED so that a waiting sweep ends instead of polling forever. If slurmctld is unreachable, only
the jobcomp log answers (and unknown jobs are left out, i.e. "not known yet", like real sacct).

Stdlib only; runs with any python3 >= 3.8.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

FIELDS = [  # canonical sacct names we can answer
    "JobID", "JobIDRaw", "JobName", "State", "ExitCode", "NodeList", "Partition", "User", "Submit",
    "Start", "End", "Elapsed", "Timelimit", "AllocCPUS", "NNodes", "WorkDir", "Reason",
]
WIDTH = {"JobID": 12, "JobIDRaw": 12, "JobName": 10, "NodeList": 15, "Submit": 19, "Start": 19, "End": 19}
# scontrol prints a flag instead of the base state while these are set
FLAG_STATES = {"COMPLETING", "SIGNALING", "STAGE_OUT"}
KEY = re.compile(r"^[A-Z][A-Za-z0-9_:/]*=")


def parse_record(line: str) -> dict[str, str]:
    """`Key=value Key2=value two ...` -> dict; a token that does not start a new Key= continues the value."""
    rec: dict[str, str] = {}
    key = None
    for tok in line.strip().split(" "):
        if KEY.match(tok):
            key, _, val = tok.partition("=")
            rec[key] = val
        elif key is not None:
            rec[key] += " " + tok
    return rec


def read_conf(path: str) -> dict[str, str]:
    conf: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if "=" in line and " " not in line.split("=", 1)[0]:
                    k, v = line.split("=", 1)
                    conf.setdefault(k.lower(), v.strip())
    except OSError:
        pass
    return conf


def live_jobs() -> list[dict[str, str]] | None:
    """All jobs slurmctld holds, or None if it cannot be asked."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"sacct (stand-in): scontrol failed: {e}", file=sys.stderr)
        return None
    if out.returncode != 0:
        print(f"sacct (stand-in): scontrol failed: {out.stderr.strip()}", file=sys.stderr)
        return None
    return [parse_record(ln) for ln in out.stdout.splitlines() if ln.startswith("JobId=")]


def finished_jobs(path: str | None) -> list[dict[str, str]]:
    if not path or not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        return [parse_record(ln) for ln in f if ln.startswith("JobId=")]


def elapsed(start: str, end: str) -> str:
    import datetime as dt

    try:
        s = dt.datetime.fromisoformat(start)
        e = dt.datetime.fromisoformat(end)
    except ValueError:
        return ""
    secs = max(0, int((e - s).total_seconds()))
    d, secs = divmod(secs, 86400)
    h, secs = divmod(secs, 3600)
    m, secs = divmod(secs, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{secs:02d}"


class Job:
    def __init__(self, live: dict[str, str] | None, done: dict[str, str] | None, lost_id: str | None = None):
        self.live, self.done = live, done
        self.rec = live or done or {"JobId": lost_id or ""}
        self.lost = live is None and done is None

    @property
    def job_id(self) -> int:
        return int(self.rec.get("JobId", "0") or 0)

    def sort_key(self) -> tuple[int, int]:
        if self.array:
            a, t = self.array
            return (int(a), int(t) if t.isdigit() else -1)
        return (self.job_id, -1)

    @property
    def array(self) -> tuple[str, str] | None:
        a, t = self.rec.get("ArrayJobId"), self.rec.get("ArrayTaskId")
        return (a, t) if a and t is not None and a != "(null)" else None

    def state(self) -> str:
        if self.lost:
            return "FAILED"
        if self.live is not None:
            s = self.live.get("JobState", "UNKNOWN")
            if s in FLAG_STATES:
                return self.done.get("JobState", "COMPLETING") if self.done else "COMPLETING"
            return {"CONFIGURING": "RUNNING", "REQUEUE_FED": "REQUEUED", "REQUEUE_HOLD": "REQUEUED",
                    "RESV_DEL_HOLD": "PENDING"}.get(s, s)
        return self.done.get("JobState", "UNKNOWN") if self.done else "UNKNOWN"

    def field(self, name: str) -> str:
        r = dict(self.live or {})
        if self.done and (self.live is None or self.live.get("JobState") in FLAG_STATES):
            r.update(self.done)  # final values (EndTime, ExitCode) of a job slurmctld is still cleaning up
        if name == "JobID":
            if self.array:
                a, t = self.array
                if re.fullmatch(r"\d+", t):
                    return f"{a}_{t}"
                # pending remainder of an array: scontrol already writes the throttle, e.g. 0-2%1
                return f"{a}_[{t}]"
            return str(self.job_id)
        if name == "JobIDRaw":
            return str(self.job_id)
        if name == "State":
            return self.state()
        if name == "NodeList":
            v = r.get("NodeList", "")
            return "None assigned" if v in ("", "(null)") else v
        if name == "User":
            return re.sub(r"\(.*\)$", "", r.get("UserId", ""))
        if name == "Elapsed":
            if "RunTime" in r:
                return r["RunTime"]
            return elapsed(r.get("StartTime", ""), r.get("EndTime", ""))
        if name == "AllocCPUS":
            return r.get("NumCPUs", r.get("ProcCnt", ""))
        if name == "NNodes":
            return r.get("NumNodes", r.get("NodeCnt", ""))
        if name == "Reason" and self.lost:
            return "job unknown to slurmctld and to the jobcomp log"
        key = {"JobName": "Name" if self.live is None else "JobName", "Submit": "SubmitTime",
               "Start": "StartTime", "End": "EndTime", "Timelimit": "TimeLimit"}.get(name, name)
        v = r.get(key, "")
        return "" if v == "(null)" else v


def wanted(job: Job, sel: str) -> bool:
    """Does `-j sel` (e.g. 12, 12_3, 12.batch) select this job?"""
    sel = sel.split(".", 1)[0]
    main, _, task = sel.partition("_")
    if not task:
        return str(job.job_id) == main or (job.array is not None and job.array[0] == main)
    if job.array is None or job.array[0] != main:
        return False
    t = job.array[1].split("%", 1)[0]
    for part in t.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi or lo).isdigit() and int(lo) <= int(task) <= int(hi or lo):
            return True
    return False


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sacct", description="sacct stand-in (see launchers/slurm/sacct.py)")
    p.add_argument("-o", "--format", action="append", default=[])
    p.add_argument("-j", "--jobs", action="append", default=[])
    p.add_argument("-P", "--parsable2", action="store_true")
    p.add_argument("-p", "--parsable", action="store_true")
    p.add_argument("--delimiter", default="|")
    p.add_argument("-n", "--noheader", action="store_true")
    p.add_argument("-X", "--allocations", action="store_true")  # we only ever print allocations
    p.add_argument("-a", "--allusers", action="store_true")  # single-user dev cluster: no-op
    p.add_argument("-S", "--starttime")  # accepted, not applied
    p.add_argument("-E", "--endtime")  # accepted, not applied
    p.add_argument("-u", "--user", "--uid")  # accepted, not applied
    p.add_argument("-M", "--clusters")  # accepted, not applied
    args = p.parse_args(argv)

    fmt = ",".join(args.format) or "JobID,JobName,Partition,AllocCPUS,State,ExitCode"
    fields = []
    for f in fmt.split(","):
        f = f.strip().split("%", 1)[0]
        if not f:
            continue
        canon = {x.lower(): x for x in FIELDS}.get(f.lower())
        if canon is None:
            print(f"sacct (stand-in): Invalid field requested: \"{f}\" (supported: {','.join(FIELDS)})",
                  file=sys.stderr)
            return 1
        fields.append(canon)

    conf = read_conf(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    live = live_jobs()
    done_by_id: dict[str, dict[str, str]] = {}
    for rec in finished_jobs(conf.get("jobcomploc")):
        done_by_id[rec.get("JobId", "")] = rec  # the last line wins (a requeued job ends more than once)
    live_by_id = {r.get("JobId", ""): r for r in (live or [])}
    jobs = sorted((Job(live_by_id.get(i), done_by_id.get(i)) for i in set(live_by_id) | set(done_by_id)),
                  key=Job.sort_key)

    sels = [s for j in args.jobs for s in j.split(",") if s]
    if sels:
        chosen = [job for job in jobs if any(wanted(job, s) for s in sels)]
        if live is not None:  # ids below the highest known one that nobody knows were lost
            top = max((job.job_id for job in jobs), default=0)
            for s in sels:
                main_id = s.split(".", 1)[0].split("_", 1)[0]
                if main_id.isdigit() and int(main_id) < top and not any(wanted(job, s) for job in jobs):
                    chosen.append(Job(None, None, lost_id=main_id))
    else:
        chosen = jobs

    rows = [[job.field(f) for f in fields] for job in chosen]
    if args.parsable or args.parsable2:
        d = args.delimiter
        tail = d if args.parsable else ""
        if not args.noheader:
            print(d.join(fields) + tail)
        for row in rows:
            print(d.join(row) + tail)
    else:
        widths = [WIDTH.get(f, 10) for f in fields]
        fit = lambda v, w: v.rjust(w) if len(v) <= w else v[: w - 1] + "+"  # noqa: E731
        if not args.noheader:
            print(" ".join(fit(f, w) for f, w in zip(fields, widths)))
            print(" ".join("-" * w for w in widths))
        for row in rows:
            print(" ".join(fit(v, w) for v, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
