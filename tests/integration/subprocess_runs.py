"""`relax-train` as a real subprocess with its own private Ray instance, and how to find every
process it started: each one inherits a marker environment variable."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path


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
                 args: list[str] | None = None) -> None:
        """The default task's flags plus `mode`, or exactly `args` (then `num_rollout` is unused)."""
        root = tiny_setup
        self.exp_dir, self.marker, self.log = exp_dir, uuid.uuid4().hex, exp_dir / "stdout.log"
        self.processes_before_signal = 0
        exp_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, RELAX_TEST_MARKER=self.marker, PYTHONUNBUFFERED="1")
        env.pop("RAY_ADDRESS", None)
        flags = args if args is not None else [
            "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "train.jsonl"), "--input-key",
            "prompt", "--label-key", "label", "--apply-chat-template", "--rm-type", "math", "--rollout-batch-size",
            "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8", "--num-rollout", str(num_rollout),
            "--progress-bar", "false", *mode]
        cmd = [sys.executable, "relax/entrypoints/train.py", "--ray-num-cpus", "8", *flags, "--exp-dir", str(exp_dir)]
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
