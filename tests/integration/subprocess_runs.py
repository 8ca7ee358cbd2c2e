"""`relax-train` as a real subprocess with its own private Ray instance, started the way a
launcher starts it, and how to find every process it started: each one inherits a marker
environment variable, and Ray's own processes (whose environment /proc may no longer show once
they renamed themselves, `ray::DashboardAgent`) refer to the run's Ray session directory."""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
# How the driver is started: as the test's own child (SIGINT handled: Ctrl-C works); by a script
# that runs it in the background of its non-interactive shell through scripts/entrypoint/local.sh
# (SIGINT ignored, as in CI steps and job scripts); or by such a script in a session of its own
# (`setsid`, as job schedulers and daemons start one).
_BACKGROUND = ["bash", str(HERE / "launch_in_background.sh")]
# "direct" resets SIGINT to its default first: a test session itself started in the background of a
# non-interactive shell (`nohup pytest ... &`) has SIGINT ignored, which its children would inherit.
_SIGINT_DEFAULT = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execvp(sys.argv[1], sys.argv[1:])"]
LAUNCHERS = {"direct": _SIGINT_DEFAULT, "background": _BACKGROUND, "setsid": ["setsid", *_BACKGROUND]}
DRIVER = "relax/entrypoints/train.py"


def marked_processes(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if f"RELAX_TEST_MARKER={marker}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def listening_sockets(pids: list[int]) -> list[tuple[int, str, str, int]]:
    """(pid, process name, address, port) of every listening TCP socket the processes hold."""
    import psutil

    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found += [(pid, proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN]
        except psutil.Error:  # gone meanwhile
            continue
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or ip).is_loopback


def ray_session_dirs(pids: list[int]) -> set[Path]:
    """The Ray session directories named on the processes' command lines."""
    dirs = set()
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        dirs |= {Path(m) for m in re.findall(r"(/[^\x00 =]*/session_\d{4}-[^/\x00 ]+)", cmdline)}
    return {d for d in dirs if d.is_dir()}


def files_containing(root: Path, secret: bytes) -> list[Path]:
    """Every readable file under `root` whose bytes contain `secret`."""
    hits = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and secret in path.read_bytes():
                hits.append(path)
        except OSError:
            continue
    return hits


def session_processes(dirs: set[Path]) -> list[int]:
    """Processes whose command line names one of the Ray session directories `dirs` or that hold a
    file under one open (this one left out)."""
    roots = [str(d) + os.sep for d in dirs]
    pids = []
    for proc in Path("/proc").iterdir() if roots else ():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            # Arguments end with NUL: `--session-dir=<dir>\0` reads as `<dir>/`.
            texts = [(proc / "cmdline").read_bytes().replace(b"\0", b"/").decode(errors="replace")]
            for fd in (proc / "fd").iterdir():
                try:
                    texts.append(os.readlink(fd))
                except OSError:
                    continue
        except OSError:
            continue
        if any(root in text for text in texts for root in roots):
            pids.append(int(proc.name))
    return pids


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return "?"


def running(pid: int) -> bool:
    """Whether process `pid` is there and not a zombie (exited, not yet reaped by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sigint_ignored(pid: int) -> bool:
    """Whether SIGINT is ignored in process `pid` (/proc/<pid>/status, SigIgn)."""
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(ignored & (1 << (signal.SIGINT - 1)))


def wait_until_gone(marker: str, timeout: float = 60.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = marked_processes(marker)
        if not left:
            return []
        time.sleep(1.0)
    return [(pid, Path(f"/proc/{pid}/cmdline").read_bytes()[:120]) for pid in marked_processes(marker)]


class Run:
    """A `relax-train` subprocess with its own marker; its output goes to a log file."""

    def __init__(self, tiny_setup, exp_dir: Path, num_rollout: int, mode: tuple[str, ...] = (),
                 args: list[str] | None = None, launch: str = "direct") -> None:
        """The default task's flags plus `mode`, or exactly `args` (then `num_rollout` is unused);
        `launch` names how the driver is started (LAUNCHERS)."""
        root = tiny_setup
        self.exp_dir, self.marker, self.log = exp_dir, uuid.uuid4().hex, exp_dir / "stdout.log"
        self.processes_before_signal = 0
        self._driver_pid: int | None = None
        self.session_dirs: set[Path] = set()  # the run's Ray session directory, once looked up (stop)
        exp_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, RELAX_TEST_MARKER=self.marker, PYTHONUNBUFFERED="1")
        env.pop("RAY_ADDRESS", None)
        flags = args if args is not None else [
            "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"), "--input-key",
            "prompt", "--label-key", "label", "--apply-chat-template", "--rm-type", "math", "--rollout-batch-size",
            "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8", "--num-rollout", str(num_rollout),
            "--progress-bar", "false", *mode]
        cmd = [*LAUNCHERS[launch], sys.executable, DRIVER, "--ray-num-cpus", "8", *flags, "--exp-dir", str(exp_dir)]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                         cwd=Path(__file__).resolve().parents[2])

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 300) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            if needle in self.output():
                return True
            time.sleep(0.5)
        return needle in self.output()

    @property
    def driver_pid(self) -> int:
        """The pid of `python3 relax/entrypoints/train.py` (a shell's child when a shell launched it)."""
        import psutil

        deadline = time.time() + 30
        while self._driver_pid is None:
            for child in [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]:
                try:
                    if child.cmdline()[1:2] == [DRIVER]:  # python3 relax/entrypoints/train.py ...
                        self._driver_pid = child.pid
                except psutil.Error:
                    continue
            if self._driver_pid is None:
                assert time.time() < deadline, "the driver process was not found"
                time.sleep(0.1)
        return self._driver_pid

    def processes(self) -> list[int]:
        """Every live process of the run: the marked ones and those of its Ray session."""
        return sorted(set(marked_processes(self.marker)) | set(session_processes(self.session_dirs)))

    def any_processes(self) -> list[int]:
        """Some live processes of the run, none if none is left (the marked ones first: reading
        every process's descriptors on each poll would slow the teardown it watches)."""
        return marked_processes(self.marker) or session_processes(self.session_dirs)

    def stop(self, sig: int, gone_within: float = 10.0, exit_timeout: float = 120.0) -> None:
        """Send `sig` to the driver, once, and watch the run go. Records what ran at the signal
        (`processes_before_signal`, `names_before_signal`, the driver's `sigint_ignored` and
        `session`), and `left`: the processes of the run still there `gone_within` seconds after
        it (pid, name); `exit_s`, `gone_s`: seconds from the signal to the driver's exit and to
        no process of the run left (None: still there at `gone_within`)."""
        self.session_dirs = ray_session_dirs(marked_processes(self.marker))
        before = self.processes()
        self.processes_before_signal, self.names_before_signal = len(before), {process_name(p) for p in before}
        self.sigint_ignored, self.session = sigint_ignored(self.driver_pid), os.getsid(self.driver_pid)
        os.kill(self.driver_pid, sig)
        start = time.monotonic()
        self.exit_s = self.gone_s = None
        while time.monotonic() < start + gone_within:
            if self.exit_s is None and not running(self.driver_pid):
                self.exit_s = time.monotonic() - start
            if not self.any_processes():
                self.gone_s = time.monotonic() - start
                break
            time.sleep(0.25)
        self.left = [(pid, process_name(pid)) for pid in self.processes()]
        self.proc.wait(timeout=exit_timeout)

    def kill_if_running(self) -> None:
        """After a failed test: SIGKILL the driver and its launcher, if still there."""
        if self.proc.poll() is None:
            if self._driver_pid is not None:
                try:
                    os.kill(self._driver_pid, signal.SIGKILL)
                except OSError:
                    pass
            self.proc.kill()
            self.proc.wait(timeout=30)
