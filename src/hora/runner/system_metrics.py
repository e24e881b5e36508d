"""System metrics of one host: CPU, memory, network and disk throughput, sampled from ``/proc`` (SageMaker
Debugger's system monitoring, without its dependency on psutil).

Linux only: on another system :func:`read_counters` (and so :meth:`SystemSampler.start`) raises
:class:`~hora.errors.UnsupportedError` naming the system. Every value is for the whole host as the sampling
process sees it: CPU and memory of the machine, the network of the process's network namespace (each ``hora job``
host has its own, so each host's agent samples its own), the disks of the machine.

:class:`SystemSampler` is a daemon thread that reads the counters every ``interval`` seconds and hands batches of
``(time, name, value)`` to a sink every ``flush_every`` seconds (so a store is written a few times a minute, not
twice a second); :meth:`SystemSampler.stop` takes a last sample and flushes what is left.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hora.errors import ConfigError, UnsupportedError

__all__ = ["METRIC_NAMES", "Counters", "Sample", "SystemMetricsLog", "SystemSampler", "rates", "read_counters"]

log = logging.getLogger(__name__)

#: Every metric a sample holds, in this order.
METRIC_NAMES = (
    "cpu_percent",
    "memory_percent",
    "memory_used_bytes",
    "network_receive_bytes_per_second",
    "network_transmit_bytes_per_second",
    "disk_read_bytes_per_second",
    "disk_write_bytes_per_second",
)
#: /proc/diskstats counts sectors of 512 bytes whatever the device's own sector size (the kernel's block layer).
SECTOR_BYTES = 512
#: Block devices whose I/O is the I/O of another device (a loop device's file lives on a disk; a RAM disk is
#: memory): not counted, so a byte is counted once.
_NOT_DISKS = ("loop", "ram", "zram")

#: A batch of samples: (time since the epoch, metric name, value).
Sample = tuple[float, str, float]


@dataclass(frozen=True)
class Counters:
    """One read of the host's counters; two reads give the rates between them (:func:`rates`)."""

    monotonic: float  # seconds (time.monotonic), for the interval
    time: float  # seconds since the epoch, the sample's timestamp
    cpu_busy: int  # USER_HZ ticks over every CPU: all but idle and iowait
    cpu_total: int  # USER_HZ ticks over every CPU
    memory_total: int  # bytes (MemTotal)
    memory_available: int  # bytes (MemAvailable)
    network_receive: int  # bytes received, every interface of this network namespace
    network_transmit: int  # bytes sent
    disk_read: int  # bytes read, whole disks
    disk_write: int  # bytes written, whole disks


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _cpu() -> tuple[int, int]:
    """(busy, total) ticks from /proc/stat's ``cpu`` line: user nice system idle iowait irq softirq steal (guest
    time is already inside user and nice, so it is not added again)."""
    for line in _read("/proc/stat").splitlines():
        if line.startswith("cpu "):
            ticks = [int(v) for v in line.split()[1:9]]
            total = sum(ticks)
            return total - ticks[3] - ticks[4], total
    raise OSError("/proc/stat has no 'cpu' line")


def _memory() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo."""
    fields = {}
    for line in _read("/proc/meminfo").splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            fields[name] = int(rest.split()[0]) * 1024  # kB
    return fields["MemTotal"], fields["MemAvailable"]


def _network() -> tuple[int, int]:
    """(received, sent) bytes over every interface of this process's network namespace, from /proc/net/dev."""
    receive = transmit = 0
    for line in _read("/proc/net/dev").splitlines()[2:]:
        _, _, values = line.partition(":")
        fields = values.split()
        receive += int(fields[0])
        transmit += int(fields[8])
    return receive, transmit


def whole_disk(name: str) -> bool:
    """Whether the block device ``name`` (as /proc/diskstats spells it) is a whole disk: listed in /sys/block (a
    partition is not), not a loop device or RAM disk, and not stacked on other disks (device-mapper, md: their
    I/O is counted on the disks below)."""
    if name.startswith(_NOT_DISKS):
        return False
    entry = os.path.join("/sys/block", name.replace("/", "!"))
    if not os.path.isdir(entry):
        return False
    try:
        return not os.listdir(os.path.join(entry, "slaves"))
    except OSError:
        return True


def _disks() -> tuple[int, int]:
    """(read, written) bytes over the whole disks, from /proc/diskstats (sectors read is field 6, written 10)."""
    read = written = 0
    for line in _read("/proc/diskstats").splitlines():
        fields = line.split()
        if len(fields) >= 10 and whole_disk(fields[2]):
            read += int(fields[5]) * SECTOR_BYTES
            written += int(fields[9]) * SECTOR_BYTES
    return read, written


def read_counters() -> Counters:
    """The host's counters now.

    Raises:
        UnsupportedError: not on Linux (there is no /proc to read).
    """
    if not sys.platform.startswith("linux"):
        raise UnsupportedError(
            f"system metrics are read from Linux's /proc, and this is {sys.platform}; leave the system metrics "
            "off here (hora run without --system-metrics, a job with profiler_config: {disable_profiler: true})"
        )
    busy, total = _cpu()
    memory_total, available = _memory()
    receive, transmit = _network()
    disk_read, disk_write = _disks()
    return Counters(time.monotonic(), time.time(), busy, total, memory_total, available, receive, transmit,
                    disk_read, disk_write)


def rates(before: Counters, after: Counters) -> list[Sample]:
    """The metrics over the interval from ``before`` to ``after``, stamped with ``after``'s time: CPU use (0-100)
    and throughputs over the interval, memory as it is at ``after``. A counter that went backwards (an interface
    removed, a counter reset) gives 0, not a negative rate."""
    seconds = max(after.monotonic - before.monotonic, 1e-9)
    ticks = after.cpu_total - before.cpu_total
    cpu = 100.0 * max(after.cpu_busy - before.cpu_busy, 0) / ticks if ticks > 0 else 0.0
    used = after.memory_total - after.memory_available

    def per_second(now: int, then: int) -> float:
        return max(now - then, 0) / seconds

    values = (
        min(cpu, 100.0),
        100.0 * used / after.memory_total if after.memory_total else 0.0,
        float(used),
        per_second(after.network_receive, before.network_receive),
        per_second(after.network_transmit, before.network_transmit),
        per_second(after.disk_read, before.disk_read),
        per_second(after.disk_write, before.disk_write),
    )
    return [(after.time, name, value) for name, value in zip(METRIC_NAMES, values)]


class SystemSampler:
    """A daemon thread sampling this host every ``interval`` seconds and handing the samples to ``sink`` in
    batches, every ``flush_every`` seconds and once more at :meth:`stop`.

    A failing sink (a full disk under the job store) is logged once and its batch dropped; sampling goes on, so a
    transient problem loses only its own batch.
    """

    def __init__(self, interval: float, sink: Callable[[list[Sample]], None], flush_every: float = 5.0,
                 name: str = "hora-system-metrics") -> None:
        if not interval > 0:
            raise ValueError(f"the sampling interval must be > 0 seconds, got {interval!r}")
        self.interval = interval
        self.flush_every = max(flush_every, interval)
        self._sink = sink
        self._stop = threading.Event()
        self._pending: list[Sample] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._last: Counters | None = None
        self._sink_failed = False

    def start(self) -> SystemSampler:
        """Take the first reading (raising UnsupportedError off Linux) and start sampling."""
        self._last = read_counters()
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sampling: one last sample (the interval since the previous one), then flush what is pending."""
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(timeout)

    def _sample(self, last: Counters) -> Counters:
        now = read_counters()
        self._pending.extend(rates(last, now))
        return now

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            self._sink(batch)
        except Exception as exc:  # the sink is the caller's (a store, a file): never end sampling for it
            if not self._sink_failed:
                log.warning("hora: could not record %d system metric samples: %s", len(batch), exc)
                self._sink_failed = True

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_every
        last = self._last
        if last is None:  # start() reads the first counters before starting the thread
            return
        try:
            while not self._stop.wait(self.interval):
                last = self._sample(last)
                if time.monotonic() >= next_flush:
                    self._flush()
                    next_flush = time.monotonic() + self.flush_every
            self._sample(last)
        except OSError as exc:  # /proc unreadable mid-run (should not happen): keep what was sampled
            log.warning("hora: system metrics stopped: %s", exc)
        finally:
            self._flush()


class SystemMetricsLog:
    """``hora run --system-metrics FILE``: one JSON line a sample, ``{"time", "host", "name", "value"}``, appended
    to FILE from the launching host's own sampler (:meth:`start`) and from the remote hosts' agents, whose batches
    the launcher hands to :meth:`write` as they arrive.

    Raises:
        ConfigError: FILE cannot be opened for appending (named, with the setting).
    """

    def __init__(self, path: str, interval: float, host: str) -> None:
        self.path = os.path.abspath(path)
        self.interval = interval
        self.host = host
        self._lock = threading.Lock()
        try:
            self._file = open(self.path, "a")  # noqa: SIM115 - closed by close(), after the last host's batch
        except OSError as exc:
            raise ConfigError(
                f"--system-metrics {path!r} (HORA_SYSTEM_METRICS) cannot be opened for appending: {exc.strerror}; "
                "name a file in a directory that exists and that you may write"
            ) from None
        self._sampler: SystemSampler | None = None
        self._failed = False

    @classmethod
    def open(cls, path: str | None, interval: float) -> SystemMetricsLog | None:
        """The log of ``path`` with this host (``socket.gethostname()``) sampled from now on; None without a path."""
        return cls(path, interval, socket.gethostname()).start() if path else None

    def start(self) -> SystemMetricsLog:
        """Sample this host until :meth:`close`."""
        try:
            self._sampler = SystemSampler(self.interval, lambda batch: self.write(self.host, batch)).start()
        except BaseException:  # not Linux: nothing sampled, nothing left open
            self.close()
            raise
        return self

    def write(self, host: str, batch: list[Sample]) -> None:
        """Append ``host``'s samples (from a remote agent, a list of ``[time, name, value]``). Never raises: a
        malformed batch or a failed write (a full disk) is logged once and dropped, and the job goes on."""
        try:
            lines = "".join(
                json.dumps({"time": float(t), "host": host, "name": str(name), "value": float(value)}) + "\n"
                for t, name, value in batch
            )
        except (TypeError, ValueError):
            self._problem(f"a malformed batch of system metrics from {host} was dropped")
            return
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.write(lines)
                self._file.flush()
            except OSError as exc:
                self._problem(f"cannot append system metrics to {self.path}: {exc.strerror or exc}")

    def _problem(self, message: str) -> None:
        if not self._failed:
            self._failed = True
            log.warning("hora run: %s (said once)", message)

    def close(self) -> None:
        """The launching host's last sample, then the file closed (the remote hosts' sessions have ended)."""
        if self._sampler is not None:
            self._sampler.stop()
        with self._lock:
            try:
                self._file.close()
            except OSError as exc:  # the last flush (a full disk)
                self._problem(f"cannot append system metrics to {self.path}: {exc.strerror or exc}")
