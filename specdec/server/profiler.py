"""The server's /start_profile and /stop_profile (SGLang's routes and fields): a profile of the
engine's steps, taken where they run (the engine's loop, in its own process), written to files.

    activities    CPU, GPU   torch.profiler over the steps: a Chrome / Perfetto trace
                             (``<name>.trace.json.gz``) and its ops table by own time (``<name>.ops.txt``)
                  MEM        the CUDA allocator's history (``<name>.memory.pickle``, for
                             pytorch.org/memory_viz)
                  HOST       (ours) the engine loop's Python functions, cProfile's own and cumulative
                             time (``<name>.host.txt``): where a step's host time goes
                  default: CPU and GPU (CPU alone without CUDA), as SGLang's
    start_step    begin after this many more engine steps (default: with the next one)
    num_steps     stop after this many steps and write the files (default: at /stop_profile)
    output_dir    where (default: $SPECDEC_TORCH_PROFILER_DIR, else /tmp)
    profile_prefix, with_stack, record_shapes: as SGLang's

``<name>`` is ``[<profile_prefix>-]<profile id>-TP-0``: the engine's rank 0, the process that
schedules; under tensor parallelism the other ranks are not profiled, so SGLang's
``merge_profiles`` and ``profile_by_stage`` are refused (400), and so are RPD (ROCm) and GPU or MEM
on an engine without CUDA. A second /start_profile while one runs, or /stop_profile while none
does, is a 409.
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import logging
import os
import pstats
import time
from pathlib import Path
from typing import Callable

import torch

logger = logging.getLogger(__name__)

ACTIVITIES = ("CPU", "GPU", "MEM", "HOST")
PROFILER_DIR_ENV = "SPECDEC_TORCH_PROFILER_DIR"
TABLE_ROWS = 60  # rows of the ops table and of each cProfile listing
MEMORY_ENTRIES = 100_000  # allocator events the MEM history keeps


class ProfileConflict(RuntimeError):
    """/start_profile while a profile runs, /stop_profile while none does (HTTP 409)."""


@dataclasses.dataclass
class ProfileOptions:
    """One /start_profile request's fields (validated by ``StepProfiler.start``)."""
    output_dir: str | None = None
    start_step: int | None = None
    num_steps: int | None = None
    activities: list[str] | None = None
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_prefix: str | None = None


class StepProfiler:
    """Profiles the engine loop's steps between ``start`` and ``stop`` (or ``num_steps``).

    Only the thread that runs the loop calls it: ``start`` / ``stop`` between steps (the loop's
    calls), ``after_step`` after each step."""

    def __init__(self, *, cuda: Callable[[], bool]) -> None:
        """``cuda()``: whether the engine runs on CUDA (asked when a profile starts)."""
        self.cuda = cuda
        self._options: ProfileOptions | None = None
        self._base: Path | None = None  # the files' path without their suffix
        self._wait = 0  # steps before the profile begins
        self._steps: int | None = None  # steps it lasts (None: until stop)
        self._torch: torch.profiler.profile | None = None
        self._host: cProfile.Profile | None = None
        self._running = False
        self._profiled = 0  # steps profiled so far

    @property
    def active(self) -> bool:
        """Whether a profile is requested and not yet written (begun or waiting for its start step)."""
        return self._options is not None

    def start(self, options: ProfileOptions) -> str:
        """Arm a profile; what it will write, as a message. ValueError names a field it cannot honor,
        ProfileConflict says that one already runs."""
        if self.active:
            raise ProfileConflict("a profile is already running: call /stop_profile first")
        activities = self._activities(options)
        if options.start_step is not None and options.start_step < 0:
            raise ValueError(f"start_step: {options.start_step}: expected >= 0")
        if options.num_steps is not None and options.num_steps < 1:
            raise ValueError(f"num_steps: {options.num_steps}: expected >= 1")
        out = Path(options.output_dir or os.environ.get(PROFILER_DIR_ENV) or "/tmp")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"output_dir: {out}: {e.strerror or e}") from None
        name = f"{time.time():.6f}-TP-0"
        self._base = out / (f"{options.profile_prefix}-{name}" if options.profile_prefix else name)
        self._options = dataclasses.replace(options, activities=activities)
        self._wait, self._steps = options.start_step or 0, options.num_steps
        if self._wait == 0:
            try:
                self._begin()
            except BaseException:
                self._end()
                raise
        return (f"Start profiling ({', '.join(activities)}) at step +{self._wait}"
                f"{f' for {self._steps} steps' if self._steps else ''}: {self._base}.*\n")

    def stop(self) -> list[str]:
        """End the profile now and write its files; their paths. ProfileConflict if none runs."""
        if not self.active:
            raise ProfileConflict("no profile is running: call /start_profile first")
        return self._end()

    def after_step(self) -> None:
        """Count an engine step: begin or end the profile at its step."""
        if self._options is None:
            return
        if not self._running:
            self._wait -= 1
            if self._wait <= 0:
                try:
                    self._begin()
                except Exception:  # noqa: BLE001 — as a write that fails: logged, the step goes on
                    logger.exception("the profile could not begin")
                    self._end()
            return
        self._profiled += 1
        if self._steps is not None and self._profiled >= self._steps:
            steps = self._profiled
            try:
                logger.info("profile of %d steps written: %s", steps, ", ".join(self._end()))
            except Exception:  # noqa: BLE001 — a profile that cannot be written must not fail the step
                logger.exception("the profile of %d steps could not be written", steps)

    # ------------------------------------------------------------ internals
    def _activities(self, options: ProfileOptions) -> list[str]:
        cuda = self.cuda()
        asked = options.activities if options.activities is not None else ["CPU", "GPU"] if cuda else ["CPU"]
        if not asked:
            raise ValueError("activities: empty: give some of " + ", ".join(ACTIVITIES))
        for a in asked:
            if a not in ACTIVITIES:
                raise ValueError(f"activities: {a!r}: expected some of {', '.join(ACTIVITIES)}"
                                 + (" (RPD is ROCm's)" if a == "RPD" else ""))
            if a in ("GPU", "MEM") and not cuda:
                raise ValueError(f"activities: {a} needs an engine on CUDA")
        return list(dict.fromkeys(asked))

    def _begin(self) -> None:
        options = self._options
        kinds = {"CPU": torch.profiler.ProfilerActivity.CPU, "GPU": torch.profiler.ProfilerActivity.CUDA}
        traced = [kinds[a] for a in options.activities if a in kinds]
        if "MEM" in options.activities:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_ENTRIES)
        if traced:
            self._torch = torch.profiler.profile(activities=traced, with_stack=bool(options.with_stack),
                                                 record_shapes=bool(options.record_shapes))
            self._torch.start()
        if "HOST" in options.activities:
            self._host = cProfile.Profile()
            self._host.enable()
        self._running, self._profiled = True, 0

    def _end(self) -> list[str]:
        """Stop what runs and write its files (the profiler is idle afterwards, written or not)."""
        try:
            return self._write_all()
        finally:
            self._options, self._torch, self._host, self._running = None, None, None, False

    def _write_all(self) -> list[str]:
        files = []
        if self._running:
            if self._host is not None:
                self._host.disable()
                files.append(self._write(".host.txt", _host_report(self._host)))
            if self._torch is not None:
                self._torch.stop()
                files.append(self._write(".ops.txt", self._torch.key_averages().table(
                    sort_by="self_device_time_total" if "GPU" in self._options.activities else "self_cpu_time_total",
                    row_limit=TABLE_ROWS)))
                path = f"{self._base}.trace.json.gz"
                self._torch.export_chrome_trace(path)
                files.append(path)
            if "MEM" in self._options.activities:
                path = f"{self._base}.memory.pickle"
                torch.cuda.memory._dump_snapshot(path)
                torch.cuda.memory._record_memory_history(enabled=None)
                files.append(path)
        return files

    def _write(self, suffix: str, text: str) -> str:
        path = f"{self._base}{suffix}"
        Path(path).write_text(text)
        return path


def _host_report(host: cProfile.Profile) -> str:
    """cProfile's top functions by own time, then by cumulative time."""
    out = io.StringIO()
    stats = pstats.Stats(host, stream=out)
    for key in ("tottime", "cumulative"):
        out.write(f"==== by {key}\n")
        stats.sort_stats(key).print_stats(TABLE_ROWS)
    return out.getvalue()
