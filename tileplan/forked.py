"""One call run in a forked process (``Forked``), and how every forked child of tileplan starts
(``child_init``: the catalogue's pool workers too).

Design decision: fork, so the child starts with the caller's objects as they are in memory (a
planning problem with its memo tables, a lowered tile program) and nothing is pickled but the
result, which is small next to them. The call is deterministic code on the same objects, so its
result is the one the caller would compute; running it beside the caller's own work uses the
machine's second core (the separate QKV form's selection beside the fused one's, a tower's host
program emission beside its package files)."""

from __future__ import annotations

import ctypes
import gc
import signal

from .errors import TileplanError


def child_init() -> None:
    """A forked child runs without the cycle collector (it only computes: see ``tileplan.gcpause``),
    ignores SIGINT (the parent decides: a Ctrl-C reaches the whole process group), takes SIGTERM's
    default (the parent's handler raises an exception, which a child must not inherit), and on Linux
    dies with its parent even when the parent is killed outright."""
    gc.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)        # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass


class Forked:
    """``fn(*args)`` run in a forked process: call it for its result (then ``then`` of it); ``after`` of
    the result, when given, is worked out in that process too and kept as ``extra``. ``what`` names
    the work in the error raised when the process dies without an answer. An exception the call
    raises is raised by the caller's call."""

    def __init__(self, fn, args: tuple, what: str, then=lambda x: x, after=None):
        import multiprocessing
        self.then, self.value, self.proc, self.extra, self.what = then, None, None, None, what
        mp = multiprocessing.get_context("fork")
        self.conn, send = mp.Pipe(duplex=False)
        self.proc = mp.Process(target=_child_main, args=(send, fn, args, after), daemon=True)
        self.proc.start()
        send.close()

    @classmethod
    def done(cls, value) -> "Forked":
        """A call whose result is already known (no process)."""
        b = cls.__new__(cls)
        b.then, b.value, b.proc, b.conn, b.extra, b.what = (lambda x: x), value, None, None, None, ""
        return b

    def __call__(self):
        if self.proc is None:
            return self.value
        proc = self.proc
        try:
            ok, value, self.extra = self.conn.recv()
        except EOFError:
            proc.join()
            raise TileplanError(f"{self.what} ended without an answer ({_death(proc.exitcode)})") from None
        finally:
            self.conn.close()
            proc.join()
            self.proc = None
        if not ok:
            raise value
        self.value = self.then(value)
        return self.value

    def cancel(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join()
            self.conn.close()
            self.proc = None


def _child_main(send, fn, args, after) -> None:
    child_init()
    try:
        value = fn(*args)
        out = (True, value, after(value) if after is not None else None)
    except BaseException as e:          # (the parent raises it: a MemoryError too, as one line)
        out = (False, e, None)
    try:
        send.send(out)
    except BaseException as e:          # the answer does not pickle, or pickling it runs out of memory:
        try:                            # the parent gets that error, not a child's traceback on stderr
            send.send((False, e if isinstance(e, MemoryError) else
                       TileplanError(f"cannot pass the answer back ({type(e).__name__}: {str(e)[:200]})"), None))
        except BaseException:
            pass
    send.close()


def _death(code: int | None) -> str:
    """How a child that sent no answer ended, for the error line."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"its process was killed by {name}" + (", perhaps by the system for lack of memory"
                                                         if -code == signal.SIGKILL else "")
    return "its process died" + (f" with status {code}" if code else "")
