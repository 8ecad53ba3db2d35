"""What a round of bench/chaos.py may leave behind, each a column of its table, and found only
by what the round itself recorded: never by matching command lines across the host, where
other notebooks (and other people's tests) run their own ranks at the same time.

- **processes**: the run's rank processes (pids it recorded, its membership's), their process
  groups (a rank is the leader of its own: what it forked goes with it), and processes whose
  command line names the run's id (a fresh id per run: only this run's);
- **folders**: a rank's or task's temporary folder (``hvd_magic-<run id>-rank<k>-*``, the pickled
  job and the notebook's values in it);
- **shm**: the notebook's value files (``payload.LocalFile``: ``/dev/shm`` or the temp folder)
  that the round's notebook made, recorded as they were made;
- **parts**: the shipped packages' cache's partial folders (``NAME.part-*``) made during the
  round and still there;
- **cgroups**: the memory cgroup the round made (the oom fault);
- **jvm**: a killed notebook's Spark JVM (and on the cluster its executors); in the soak's own
  session, a Spark job of the run still active after it ended;
- **ports**: TCP ports the run's processes listened on, still listened on after it.

Each check gives the problems it found, as "leak <column>: ..." lines."""

import glob
import os
import signal
import tempfile
import time

LEAK_WAIT = 10.0      # seconds after the end for the run's processes to be gone
COLUMNS = ("processes", "folders", "shm", "parts", "cgroups", "jvm", "ports")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _command(pid, whole=False):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            return text if whole else text[:160]
    except OSError:
        return "?"


def _stat(pid, field):
    """Field `field` of process `pid`'s /proc stat (counted after its name), an int; None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[-1].split()[field])
    except (OSError, ValueError, IndexError):
        return None


def _group_of(pid):
    return _stat(pid, 3)


def _started(pid):
    """Process `pid`'s start time (ticks since boot): with the pid, it names one process."""
    return _stat(pid, 19)


def _named(run_id):
    """Pids of the processes whose command line names run `run_id` (a fresh id per run)."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if run_id.encode() in f.read():
                        found.add(int(name))
            except OSError:
                pass
    return found


def _in_groups(groups):
    """Live pids whose process group is one of `groups` ({leader pid: its start time}: groups
    the run's ranks led). A group whose id a new process took (its leader gone, every member
    gone, the pid given again: its start time differs) is another's: not looked in."""
    ours = {g for g, started in groups.items() if not _alive(g) or _started(g) == started}
    return {int(n) for n in os.listdir("/proc")
            if n.isdigit() and int(n) != os.getpid() and _group_of(int(n)) in ours}


class Record:
    """What one round made, written down as it ran: its ranks' pids and process groups, the
    ports they listened on, the notebook's value files, the cgroup of its oom fault."""

    def __init__(self):
        self.pids, self.groups = {}, {}     # pid -> its start time (a pid given again: not ours)
        self.ports, self.values = set(), set()
        self.parts_before = set(_parts())
        self.cgroup = None

    def ranks(self, pids):
        """Rank processes seen (alive now): their group if they lead one, their listening ports."""
        for pid in pids:
            if pid and pid not in self.pids and _alive(pid):
                self.pids[pid] = _started(pid)
                if _group_of(pid) == pid:
                    self.groups[pid] = self.pids[pid]
        self.ports |= _listening(self.pids)


def _listening(pids):
    """TCP ports that processes `pids` listen on."""
    import psutil
    ports = set()
    for pid in list(pids):
        try:
            ports |= {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return ports


def _listened_ports():
    """Every TCP port listened on in this network namespace (/proc/net/tcp, tcp6)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A":  # LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return ports


def _parts():
    from hvd_magic.task.caches import PART
    from hvd_magic.task.shipped import cache_root
    return glob.glob(os.path.join(cache_root(), f"*{PART}*"))


def leftovers(run, record):
    """Pids of the run's processes still alive: every rank process it had (a forked rank's
    command line is its template's; one recorded with its start time: never a process that was
    given its pid since), members of its ranks' process groups, and any process whose command
    line names the run."""
    pids = {r.pid for r in run.ranks if r.pid} | {
        c["pid"] for c in (run.membership or []) if isinstance(c.get("pid"), int)}
    pids = {p for p in pids if record.pids.get(p, _started(p)) == _started(p)} | {
        p for p, started in record.pids.items() if _started(p) == started}
    return sorted(pid for pid in pids | _in_groups(record.groups) | _named(run.id)
                  if _alive(pid))


def left_behind(leftovers_now, wait, what="processes"):
    """["leak processes: ..."] if `leftovers_now()` still names live processes after `wait`
    seconds (they are killed then, by pid: they are the run's own); else []."""
    gone_by = time.monotonic() + wait
    left = leftovers_now()
    while left and time.monotonic() < gone_by:
        time.sleep(0.2)
        left = leftovers_now()
    named = [f"{pid} ({_command(pid)})" for pid in left]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"leak {what}: {', '.join(named)} outlived the run"] if left else []


def new_parts(record):
    """The partial cache folders made since `record` began (and there now), less those being
    made now: the shipped cache is the host's, and another notebook's process may be making
    an entry while this round ends (its maker holds the entry's lock, exclusive, until the
    part is renamed into the entry: not a leak, and not this round's)."""
    return {p for p in set(_parts()) - record.parts_before if not _being_made(p)}


def _being_made(part):
    """Whether a process holds part `part`'s entry's lock exclusively (/proc/locks: read only,
    no lock taken here)."""
    from hvd_magic.task.caches import LOCK, PART
    try:
        inode = os.stat(part.split(PART)[0] + LOCK).st_ino
        with open("/proc/locks") as f:
            held = [line.split() for line in f if "->" not in line]
    except OSError:
        return False
    return any(len(fields) > 5 and fields[1] == "FLOCK" and fields[3] == "WRITE" and
               fields[5].rsplit(":", 1)[-1] == str(inode) for fields in held)


def files_left(run_id, record, temp=None, parts=None):
    """The run's folders, value files and partial cache folders still there (`parts`: those
    to look for, where they were taken earlier: a check made later, while another round runs,
    takes none of that round's for this one's)."""
    temp = temp or tempfile.gettempdir()
    problems = []
    folders = glob.glob(os.path.join(temp, f"hvd_magic-{run_id}-*"))
    if folders:
        problems.append(f"leak folders: {', '.join(sorted(folders))}")
    values = sorted(p for p in record.values if os.path.exists(p))
    if values:
        problems.append(f"leak shm: {', '.join(values)}")
    parts = sorted(new_parts(record) & (new_parts(record) if parts is None else parts))
    if parts:
        problems.append(f"leak parts: {', '.join(parts)}")
    return problems


def ports_left(record):
    held = sorted(record.ports & _listened_ports())
    return [f"leak ports: {held} still listened on"] if held else []


def cgroup_left(folder):
    """The round's cgroup removed (its process reaped first); "leak cgroups" if it stays."""
    if folder is None:
        return []
    gone_by = time.monotonic() + 10
    while time.monotonic() < gone_by:
        try:
            os.rmdir(folder)
            return []
        except FileNotFoundError:
            return []
        except OSError:  # (not empty yet: its process is being reaped)
            time.sleep(0.1)
    return [f"leak cgroups: {folder} could not be removed"]


def jobs_left(run):
    """A Spark job still active in the soak's own session after its run ended (the soak runs
    one round at a time: any active job is this round's)."""
    from pyspark import SparkContext
    sc = SparkContext._active_spark_context
    if sc is None or run.where == "driver only":
        return []
    gone_by = time.monotonic() + LEAK_WAIT
    active = sc.statusTracker().getActiveJobsIds()
    while active and time.monotonic() < gone_by:
        time.sleep(0.2)
        active = sc.statusTracker().getActiveJobsIds()
    return [f"leak jvm: Spark jobs {active} still active"] if active else []


def watch_values(record):
    """Record each value file the notebook's `payload.LocalFile` makes while `record` is watched
    (the harness's own hook: it names the file as it is made); undone by the function returned."""
    from hvd_magic import payload
    made = payload.LocalFile.__init__

    def recording(self, data):
        made(self, data)
        record.values.add(self.path)

    payload.LocalFile.__init__ = recording
    return lambda: setattr(payload.LocalFile, "__init__", made)
