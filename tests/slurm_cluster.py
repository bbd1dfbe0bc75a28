"""A real SLURM cluster of two nodes on this one host, for the slow tests (GUIDE.md section 4).

`cluster` (a session fixture, see conftest.py) installs Debian's slurm-wlm and
munge when they are missing (root only), starts munged unless one is running,
writes slurm.conf under ROOT, starts slurmctld and `slurmd -N n1`, `slurmd -N n2`
(both NodeAddr=127.0.0.1 on their own ports) and waits until both nodes are idle.
At the end it cancels every job, stops every process it started (daemons,
slurmstepd, job tasks) and only those, and restores /etc/hosts.

Every process the cluster starts carries DIST_TEMPLATE_SLURM=ROOT (MARK) in its environment: the
daemons get it from us, slurmstepd from slurmd, and job tasks from the sbatch
environment built by `env()`. That is how teardown, and the start of a session
after one that was killed, find what to stop without touching anything else.
One session at a time holds LOCK (the ports are fixed): a second waits for it.

Measured on this 2-core machine: start 1.0-1.3 s with the packages installed, 10.4 s
with apt-get update and install first; stop 0.4 s without jobs. A job requeued
by `scontrol requeue` starts again about 13 s later (cred_expire=5, schedulers
every 2 s). SLURM delivered --signal=B:USR1@60 of a 3-minute job 1 to 31 s
early (its docs allow up to 60 s).
"""

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(os.environ.get("DIST_TEMPLATE_SLURM_DIR", "/tmp/dist-template-slurm"))
LOCK = Path(f"{ROOT}.lock")
MARK = "DIST_TEMPLATE_SLURM"
NODES = {"n1": 17001, "n2": 17002}
CTLD_PORT = 17000
CPUS_PER_NODE = 4  # two tasks per node, each running two processes (the host has fewer: config_overrides)
JOBS_PER_CPU = 1  # OverSubscribe=FORCE:N; more jobs at once would only share the host's 2 cores (and memory)
KILL_WAIT_S = 30  # scancel and the time limit: SIGTERM, then this long to save before SIGKILL
CRED_EXPIRE_S = 5  # a requeued job waits this long before it starts again (default 120, at least 5)
HOSTS = Path("/etc/hosts")
HOSTS_LINE = "127.0.0.1 " + " ".join(NODES) + f"  # {MARK} test cluster, removed when the tests end"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}

SLURM_CONF = """\
ClusterName=disttemplate
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire={cred_expire}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait={kill_wait}
MinJobAge=3600
InactiveLimit=0
Waittime=0
JobRequeue=1
NodeName=DEFAULT CPUs={cpus} State=UNKNOWN
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:{jobs_per_cpu}
"""


class ClusterError(RuntimeError):
    pass


def install() -> None:
    """apt-get install slurm-wlm and munge where they are missing (root only, as in CI)."""
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if os.geteuid() != 0:
        raise ClusterError("slurm-wlm and munge are missing and only root can install them (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=300", "--no-install-recommends", "slurm-wlm", "munge"],
    ):
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")


def marked_processes(exclude: tuple[int, ...] = ()) -> list[int]:
    """Pids of live processes the cluster started (their environment holds MARK=ROOT)."""
    mark = f"{MARK}={ROOT}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in exclude:
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0") and not is_zombie(proc):
                found.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return sorted(found)


def is_zombie(proc: Path) -> bool:
    return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "(ended)"


def ancestors() -> tuple[int, ...]:
    """This process and its parents: never ours to stop, whatever their environment says."""
    pids, pid = [], os.getpid()
    while pid > 1:
        pids.append(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return tuple(pids)


def stop_processes(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM, then SIGKILL after grace_s; returns the pids still alive after that (should be none)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not is_zombie(Path(f"/proc/{pid}"))]
            time.sleep(0.1)
        if not pids:
            break
    return pids


def resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
        return True
    except OSError:
        return False


class Cluster:
    """Two SLURM nodes, n1 and n2, on this host. Use start() and stop(), or the `cluster` fixture."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.conf = root / "slurm.conf"
        self.host = socket.gethostname()
        self.daemons: list[subprocess.Popen] = []
        self.lock_file = None
        self.added_hosts_line = False
        self.started_munged = False
        self.start_s = 0.0

    # --- the environment of every command -------------------------------------------------
    def env(self, base: dict | None = None, **extra: str) -> dict:
        env = dict(os.environ if base is None else base)
        env.update({"SLURM_CONF": str(self.conf), MARK: str(self.root)}, **extra)
        return env

    def command(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        result = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    # --- start and stop --------------------------------------------------------------------
    def start(self, lock_timeout_s: float = 1800) -> "Cluster":
        started = time.monotonic()
        install()
        self._lock(lock_timeout_s)  # before anything is stopped: what runs without the lock is another session's
        try:
            self._stop_stale()
            self._add_hosts_line()
            self._start_munged()
            self._write_conf()
            log = self.root / "log"
            self._spawn(["slurmctld", "-D", "-f", str(self.conf)], log / "slurmctld.out")
            for node in NODES:
                self._spawn(["slurmd", "-D", "-N", node, "-f", str(self.conf)], log / f"slurmd-{node}.out")
            self._wait_until_idle(60)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Cancel every job, stop every process the cluster started, restore /etc/hosts, release the lock."""
        if self.lock_file is None:
            return
        try:
            if self.daemons and self.daemons[0].poll() is None:
                try:  # the jobs first, so that their steps end the way SLURM ends them
                    self.command("scancel", "--full", "--user", "root", check=False)
                    self._wait_for_no_jobs(KILL_WAIT_S + 10)
                except subprocess.TimeoutExpired:
                    pass
            left = stop_processes([daemon.pid for daemon in self.daemons], grace_s=10)
            for daemon in self.daemons:
                if daemon.pid not in left:
                    daemon.wait(timeout=5)
            left += stop_processes(marked_processes(exclude=ancestors()), grace_s=5)
            self.daemons = []
            if self.started_munged:
                self._stop_munged()
            if left:
                raise ClusterError("processes of the test cluster survived SIGKILL: " + ", ".join(map(str, left)))
        finally:
            self._remove_hosts_line()
            if self.lock_file is not None:
                self.lock_file.close()
                self.lock_file = None

    def _lock(self, timeout_s: float) -> None:
        self.lock_file = open(LOCK, "w")  # noqa: SIM115 - held until stop()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.lock_file.close()
                    self.lock_file = None
                    raise ClusterError(f"another test session holds {LOCK} (its cluster uses the same ports)") from None
                time.sleep(1)

    def _stop_stale(self) -> None:
        """A session that was killed left daemons, steps, jobs, files: we hold the lock, so they are nobody's."""
        left = stop_processes(marked_processes(exclude=ancestors()), grace_s=3)
        if left:
            raise ClusterError(f"stale test cluster processes would not end: {left}")
        shutil.rmtree(self.root, ignore_errors=True)
        for folder in ("state", "spool", "log"):
            (self.root / folder).mkdir(parents=True)

    def _add_hosts_line(self) -> None:
        text = HOSTS.read_text()
        if HOSTS_LINE in text.splitlines() or all(resolves(node) for node in NODES):
            self.added_hosts_line = HOSTS_LINE in text.splitlines()  # one left by a killed session is ours
            return
        # Written in place, not replaced: /etc/hosts is often a bind mount.
        HOSTS.write_text(text + ("" if text.endswith("\n") or not text else "\n") + HOSTS_LINE + "\n")
        self.added_hosts_line = True

    def _remove_hosts_line(self) -> None:
        if self.added_hosts_line:
            lines = HOSTS.read_text().splitlines(keepends=True)
            HOSTS.write_text("".join(line for line in lines if line.rstrip("\n") != HOSTS_LINE))
            self.added_hosts_line = False

    def _munge_works(self) -> bool:
        try:
            encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
            if encoded.returncode != 0:
                return False
            return subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_munged(self) -> None:
        if self._munge_works():
            # Ours if a killed session started it (it carries the mark): then this session stops it.
            self.started_munged = any("munged" in command_line(pid) for pid in marked_processes())
            return
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_bytes(os.urandom(128))
            shutil.chown(key.parent, "munge", "munge")
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        for folder in (Path("/run/munge"), Path("/var/lib/munge"), Path("/var/log/munge")):
            folder.mkdir(parents=True, exist_ok=True)
            shutil.chown(folder, "munge", "munge")
        # munged daemonizes itself; it refuses to start over a socket left by one that was killed.
        subprocess.run(
            ["runuser", "-u", "munge", "--", "munged", "--force"], env=self.env(), check=True, capture_output=True
        )
        self.started_munged = True
        deadline = time.monotonic() + 10
        while not self._munge_works():
            if time.monotonic() > deadline:
                raise ClusterError("munged started but munge -n | unmunge fails")
            time.sleep(0.1)

    def _stop_munged(self) -> None:
        pids = [pid for pid in marked_processes() if "munged" in command_line(pid)]
        left = stop_processes(pids, grace_s=5)
        self.started_munged = False
        if left:
            raise ClusterError(f"munged ({left}) would not end")

    def _write_conf(self) -> None:
        nodes = "\n".join(
            f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port}" for node, port in NODES.items()
        )
        self.conf.write_text(
            SLURM_CONF.format(
                host=self.host,
                ctld_port=CTLD_PORT,
                cred_expire=CRED_EXPIRE_S,
                root=self.root,
                kill_wait=KILL_WAIT_S,
                cpus=CPUS_PER_NODE,
                jobs_per_cpu=JOBS_PER_CPU,
                nodes=nodes,
            )
        )

    def _spawn(self, command: list[str], log: Path) -> None:
        with open(log, "ab") as out:
            self.daemons.append(
                subprocess.Popen(command, env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def _wait_until_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        states = ""
        while time.monotonic() < deadline:
            for daemon in self.daemons:
                if daemon.poll() is not None:
                    raise ClusterError(f"{' '.join(daemon.args)} exited ({daemon.returncode}); see {self.root}/log")
            result = self.command("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            states = result.stdout.strip()
            if result.returncode == 0 and sorted(states.splitlines()) == [f"{node} idle" for node in NODES]:
                return
            time.sleep(0.2)
        raise ClusterError(f"the nodes did not become idle in {timeout_s} s (sinfo: {states!r}); see {self.root}/log")

    def _wait_for_no_jobs(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.command("squeue", "-h", "-o", "%i", check=False)
            if result.returncode == 0 and not result.stdout.strip():
                return
            time.sleep(0.5)

    # --- jobs ------------------------------------------------------------------------------
    def sbatch(self, script: str, *args: str, cwd: Path, options: tuple[str, ...] = (), env: dict | None = None) -> str:
        """Submit `script` (relative to cwd) with sbatch options and the script's arguments; returns the job id."""
        command = ["sbatch", "--parsable", *options, script, *args]
        result = subprocess.run(command, cwd=cwd, env=self.env(env), capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, StdOut, NodeList, ...); {} once purged."""
        result = self.command("scontrol", "show", "job", "-o", job_id, check=False)
        if result.returncode != 0:
            return {}
        fields = {}
        for item in result.stdout.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields

    def restarts(self, job_id: str) -> int:
        return int(self.job(job_id).get("Restarts", 0))

    def wait(self, job_id: str, timeout_s: float = 300) -> dict[str, str]:
        """Wait until the job has ended (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...); returns its last record."""
        deadline = time.monotonic() + timeout_s
        while True:
            fields = self.job(job_id)
            if not fields or fields.get("JobState") in ENDED:
                return fields
            if time.monotonic() > deadline:
                raise ClusterError(f"job {job_id} still {fields.get('JobState')} after {timeout_s} s: {fields}")
            time.sleep(0.5)

    def wait_for(self, condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.2)

    def scancel(self, job_id: str, *options: str) -> None:
        self.command("scancel", *options, job_id)


def started() -> Iterator[Cluster]:
    """Generator for a fixture: a started cluster, stopped after the yield."""
    cluster = Cluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()
