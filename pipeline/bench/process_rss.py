"""Peak resident memory of a process tree, sampled, and split by the role each process plays in a
Spark application (the benchmarks' one way of measuring memory)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

SAMPLE_S = 0.2
MB = 2**20


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    ppid: int
    cmdline: str
    rss: int


EXECUTOR_MARK = "CoarseGrainedExecutorBackend"


def rss_by_role(root: int, processes: Iterable[ProcessSample]) -> dict[str, int]:
    """One sample's resident bytes by role: ``driver_python`` (``root``), ``driver_jvm`` (every other
    process not under an executor: the driver's JVM, with the local cluster's master and workers in it)
    and ``executor:<pid>`` per executor JVM with the Python workers it forked."""
    by_pid = {p.pid: p for p in processes}

    def role(p: ProcessSample) -> str:
        if p.pid == root:
            return "driver_python"
        at: ProcessSample | None = p
        while at is not None and at.pid != root:
            if EXECUTOR_MARK in at.cmdline:
                return f"executor:{at.pid}"
            at = by_pid.get(at.ppid)
        return "driver_jvm"

    out: dict[str, int] = {}
    for p in by_pid.values():
        out[role(p)] = out.get(role(p), 0) + p.rss
    return out


class TreePeaks:
    """Peak RSS per role (:func:`rss_by_role`) of a process tree, sampled in a thread; also ``driver``
    (its Python process and JVM together) and ``total`` (the whole tree)."""

    def __init__(self, root: int, interval_s: float = SAMPLE_S) -> None:
        self.root = root
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _samples(self) -> list[ProcessSample]:
        try:
            top = psutil.Process(self.root)
            tree = [top, *top.children(recursive=True)]
        except psutil.Error:
            return []
        out = []
        for p in tree:
            try:
                out.append(ProcessSample(p.pid, p.ppid(), " ".join(p.cmdline()), p.memory_info().rss))
            except psutil.Error:
                pass  # ended between the listing and the read
        return out

    def _run(self, interval_s: float) -> None:
        while not self._stop.is_set():
            roles = rss_by_role(self.root, self._samples())
            roles["total"] = sum(roles.values())
            roles["driver"] = roles.get("driver_python", 0) + roles.get("driver_jvm", 0)
            for name, rss in roles.items():
                self.peaks[name] = max(self.peaks.get(name, 0), rss)
            self._stop.wait(interval_s)

    def __enter__(self) -> TreePeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def mb(self, role: str) -> float:
        return round(self.peaks.get(role, 0) / MB, 1)

    def executor_mb(self) -> list[float]:
        return sorted((round(v / MB, 1) for k, v in self.peaks.items() if k.startswith("executor:")), reverse=True)




class PeakRss(TreePeaks):
    """Peak resident memory of this process and all its children (JVM, Python workers), together."""

    def __init__(self, interval_s: float = SAMPLE_S) -> None:
        super().__init__(os.getpid(), interval_s)

    @property
    def peak_mb(self) -> float:
        return self.peaks.get("total", 0) / MB


class OwnPeak:
    """This process's resident growth over a block, from the kernel's own high-water mark (exact,
    however short the block: a sampler every 0.2 s misses a lookup of a few milliseconds).
    ``with OwnPeak() as peak: ...`` then ``peak.growth_mb``: the peak during the block over the
    resident size at its start (Linux: the mark is reset through /proc/self/clear_refs)."""

    def __enter__(self) -> OwnPeak:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM to the current RSS
        self.start = _status_kb("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        self.growth_mb = (_status_kb("VmHWM") - self.start) / 1024


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))
