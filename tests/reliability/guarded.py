"""Run tileplan's CLI as a hostile-input case: in its own process, under a memory limit and a
timeout, with its output captured.

Each case must end with tileplan's refusal contract (``reliability_corpus.assert_refused``) and
no hang (a timeout per case) and no memory blowup (the address space of the process that runs it
is capped by ``resource.setrlimit(RLIMIT_AS, 2 GiB)``: an attempt to allocate more fails inside
tileplan, where it must become the one-line error, not a kill).

Starting a Python interpreter and importing tileplan takes 1-2 s of CPU; a few hundred cases
would spend minutes on that alone. So one server process per test session (``Guard``) imports
tileplan once, sets the limit on itself, and forks a child per case: the child redirects its
stdout and stderr to files, changes to the case's working folder, runs ``tileplan.cli.main`` and
exits with its status. The parent kills a child that runs past its timeout (SIGKILL) and reports
``code = None``.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GiB = 1 << 30

_SERVER = r"""
import json, os, resource, sys, traceback
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import tileplan.cli
import tileplan.graph.onnx, tileplan.report.html, tileplan.sim.validate   # (imported once, shared)

def case(req):
    os.chdir(req["cwd"])
    for fd, name in ((1, "out"), (2, "err")):
        f = os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.environ.update(req["env"])
    try:
        tileplan.cli.main(req["args"])
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 99

print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 98
        try:
            code = case(req)
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(code)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class Guard:
    """One forking server; ``run(args, cwd, timeout)`` -> ``(code, stdout, stderr)``: ``code`` is
    the exit status, ``None`` when the case ran past its timeout and was killed, negative when a
    signal ended it."""

    def __init__(self, memory: int = 2 * GiB):
        self.memory = memory
        env = dict(os.environ)
        env["COLUMNS"] = "200"                # (tables as on a wide terminal, whatever runs the tests)
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(memory)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self._buf = b""
        assert self._line(120) == "ready"
        self.scratch = Path(tempfile.mkdtemp(prefix="tileplan-guard-"))
        self.count = 0

    def _line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the guard's server died")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def run(self, args: list, cwd: str | os.PathLike, timeout: float = 60.0,
            env: dict | None = None) -> tuple[int | None, str, str]:
        self.count += 1
        out, err = self.scratch / f"{self.count}.out", self.scratch / f"{self.count}.err"
        req = {"args": [str(a) for a in args], "cwd": str(cwd), "out": str(out), "err": str(err), "env": env or {}}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        pid = int(self._line(30))
        got = self._line(timeout)
        code = None
        if got is None:
            os.kill(pid, signal.SIGKILL)
            self._line(30)                    # (the server reaps it and reports the kill)
        else:
            code = int(got)
        return code, out.read_text(errors="replace"), err.read_text(errors="replace")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.scratch, ignore_errors=True)


def tree(path: Path) -> dict[str, tuple]:
    """What lies under ``path`` (relative names -> (size, mtime_ns)), to assert nothing else changed."""
    out = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(path))] = (st.st_size, st.st_mtime_ns)
    return out
