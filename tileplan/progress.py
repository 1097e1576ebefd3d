"""One progress display for the ``tileplan`` commands: named stages, their times, and a bar where
the amount of work is known before the stage starts.

The stages, in the order a compile meets them::

    import      the process start and reading the input (a model file, a torch factory, a package)
    catalogues  costing the GEMM catalogues (a bar: one unit per GEMM, fractions as its chunks finish)
    selection   whole-graph selection and the plan's detailed estimate
    lowering    the tile program
    package     the package's files written
    simulation  the run on the IPU model
    report      the result printed and written

Where the display goes:

- stderr is a terminal: a live rich display, one row per stage with its elapsed time; the stage
  with a known total draws a bar with its ETA. Names are printed as text (``markup=False``), never
  read as markup.
- stderr is not a terminal (a CI log, a pipe): one line per finished stage,
  ``stage lowering: 1.23 s``.
- ``--quiet``, or ``TILEPLAN_PROGRESS=off`` in the environment (a script that reads stderr whole): none.

Design decision: the stage is one mechanism. ``stage(name)`` both moves the display on and records
what the command is doing, which the command line's one-line out-of-memory or killed-worker error
names (``activity()``); there is no second marker to keep in step.

Design decision: a bar starts only with its total known. The catalogue stage counts GEMM catalogues
(known from the graph before planning); each catalogue's own chunk ticks move its unit by fractions,
so a catalogue whose detailed work adds units never makes the bar's total grow. When the planner
also plans the fused Q/K/V form (``planner.qkv``), the fused GEMM's catalogue is costed after the
graph's own have all finished: its time counts as selection. (A unit the total did not count would
grow the total by one rather than run the bar past its end; the graph's GEMMs are all counted.)

Design decision: "compiled ... in X s" is the whole command's time, measured from the process
start (``process_start``: the kernel's record of it in ``/proc/self/stat``), so the interpreter
start and the imports a torch factory needs are in it; where that record is missing (not Linux, or
the command run in-process by a test), from the moment ``begin`` was called.
"""

from __future__ import annotations

import os
import sys
import time

STAGES = {    # stage -> what the command is doing in it (the one-line machine errors name it)
    "import": "loading the input",
    "catalogues": "planning (costing the GEMM catalogues)",
    "selection": "planning (selection)",
    "lowering": "lowering the plan",
    "package": "writing the package",
    "simulation": "running the IPU model",
    "report": "writing the report",
    "bench": "benchmarking",
    "calibration": "calibrating",
}


def process_start() -> float | None:
    """The process's start on the ``time.monotonic()`` clock: its start time in clock ticks since
    boot (field 22 of ``/proc/self/stat``) against the boot-based uptime. Both count from boot, so
    their difference is the process's age (to the clock tick, 10 ms). None where unavailable."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])      # fields from the 3rd: starttime is the 22nd
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.monotonic() - age if 0 <= age < 86400 * 365 else None


class Display:
    """The display of one command run (``begin``); ``mode`` is ``"bar"``, ``"lines"`` or ``"off"``."""

    def __init__(self, start: float, mode: str):
        self.start, self.mode = start, mode
        self.name: str | None = None
        self.since = start
        self.total: float | None = None
        self.fractions: dict[str, float] = {}
        self.live = None
        self.task = None

    # ---- stages --------------------------------------------------------------
    def stage(self, name: str, total: float | None = None) -> None:
        """End the current stage (its line, or its row's final time) and start ``name``."""
        if name == self.name:
            return
        now = time.monotonic()
        self._end(now)
        self.name, self.since, self.total = name, now, total
        self.fractions = {}
        if self.mode == "bar":
            self._live().start()
            self.task = self.live.add_task(name, total=total, start=True)

    def advance(self, key: str, fraction: float) -> None:
        """Unit ``key`` of the current stage is ``fraction`` done (0..1); the bar shows the sum, which
        never decreases."""
        if key not in self.fractions and self.total is not None and len(self.fractions) >= self.total:
            self.total += 1                  # (a unit the total did not count: see the module docstring)
        # never backwards: a catalogue's own total grows when its detailed work starts (and a pooled
        # one's when another part reports), which would move its fraction back
        self.fractions[key] = max(self.fractions.get(key, 0.0), min(max(fraction, 0.0), 1.0))
        if self.live is not None and self.task is not None:
            self.live.update(self.task, completed=sum(self.fractions.values()), total=self.total)

    def complete(self) -> bool:
        """Every unit of the current stage's total done."""
        return self.total is not None and sum(f >= 1.0 for f in self.fractions.values()) >= self.total

    def finish(self, ok: bool = True) -> None:
        """The command ended: its last stage's line when it succeeded; the live display stopped."""
        if ok:
            self._end(time.monotonic())
        self.name = None
        if self.live is not None:
            self.live.stop()
            self.live = None

    def seconds(self) -> float:
        """The command's time so far (from the process start, ``process_start``)."""
        return time.monotonic() - self.start

    # ---- output --------------------------------------------------------------
    def _end(self, now: float) -> None:
        if self.name is None:
            return
        if self.mode == "lines":
            sys.stderr.write(f"stage {self.name}: {now - self.since:.2f} s\n")
            sys.stderr.flush()
        elif self.live is not None and self.task is not None:
            whole = self.total or 1                  # a finished stage shows full, its time frozen
            self.live.update(self.task, total=whole, completed=whole)
            self.live.stop_task(self.task)
            self.task = None

    def settle(self) -> None:
        """The command prints its result now: a live display ends first (its rows stay, the
        current stage's time frozen), so the output is not drawn over."""
        if self.live is not None:
            self._end(time.monotonic())
            self.live.stop()
            self.live = None
            self.mode = "off" if self.mode == "bar" else self.mode

    def _live(self):
        if self.live is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn
            self.live = Progress(TextColumn("{task.description:<11}", markup=False), BarColumn(),
                                 TaskProgressColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=False)
        return self.live


_display = Display(time.monotonic(), "off")


def begin(quiet: bool = False, in_process: bool = False) -> Display:
    """Start the display of one command: the ``import`` stage, timed from the process start (from
    now when ``in_process``: a command run by a caller that started long before)."""
    global _display
    _display.finish(ok=False)
    start = None if in_process else process_start()
    _display = Display(start if start is not None else time.monotonic(), "off")
    _display.stage("import")
    _display.since = _display.start          # (the import stage began with the process)
    return _display


def show(quiet: bool) -> None:
    """The command's options are known: the mode of the display (``--quiet``: off)."""
    if quiet or os.environ.get("TILEPLAN_PROGRESS", "").lower() in ("off", "0", "no"):
        mode = "off"
    else:
        mode = "bar" if sys.stderr.isatty() else "lines"
    d = _display
    d.mode = mode
    if mode == "bar" and d.name is not None and d.live is None:
        d._live().start()
        d.task = d.live.add_task(d.name, total=d.total, start=True)
        d.live.tasks[-1].start_time = d.live.get_time() - (time.monotonic() - d.since)


def stage(name: str, total: float | None = None) -> None:
    """The command moves on to stage ``name`` (one of ``STAGES``)."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}")
    _display.stage(name, total)


def current() -> Display:
    return _display


def activity() -> str:
    """What the command is doing now, for the one-line machine errors (``out of memory while ...``)."""
    return STAGES.get(_display.name or "", "starting")


def catalogue_ticks(gemms: int):
    """The planner's ``progress(op, done, total)`` callback: the catalogues stage with ``gemms``
    units, then the selection stage once every catalogue is done."""
    stage("catalogues", gemms)

    def tick(op: str, done: int, total: int) -> None:
        d = _display
        if d.name == "catalogues":
            d.advance(op, done / total if total else 1.0)
            if d.complete():
                d.stage("selection")

    if gemms == 0:
        stage("selection")
    return tick
