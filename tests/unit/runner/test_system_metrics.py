"""The system metrics sampler's arithmetic, against real /proc reads: traffic, CPU work and disk writes this test
makes itself show up in the counters and the rates; memory agrees with the kernel's own page count."""

from __future__ import annotations

import os
import socket
import sys
import threading

import pytest

from hora.runner.system_metrics import (
    METRIC_NAMES,
    SECTOR_BYTES,
    SystemMetricsLog,
    SystemSampler,
    rates,
    read_counters,
    whole_disk,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="system metrics read Linux's /proc")


def _values(samples):
    assert [name for _, name, _ in samples] == list(METRIC_NAMES)
    assert len({t for t, _, _ in samples}) == 1
    return {name: value for _, name, value in samples}


def test_loopback_traffic_raises_both_network_counters_and_the_rates_are_their_differences():
    sent = 8 << 20
    before = read_counters()
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as client:
        peer, _ = server.accept()
        received = 0

        def drain():
            nonlocal received
            while chunk := peer.recv(1 << 16):
                received += len(chunk)

        reader = threading.Thread(target=drain)
        reader.start()
        client.sendall(b"x" * sent)
        client.shutdown(socket.SHUT_WR)
        reader.join()
        peer.close()
    after = read_counters()
    assert received == sent
    # loopback counts every byte once sent and once received (other processes only add to the counters)
    assert after.network_transmit - before.network_transmit >= sent
    assert after.network_receive - before.network_receive >= sent
    values = _values(rates(before, after))
    seconds = after.monotonic - before.monotonic
    assert values["network_transmit_bytes_per_second"] == pytest.approx(
        (after.network_transmit - before.network_transmit) / seconds)
    assert values["network_receive_bytes_per_second"] * seconds >= sent * (1 - 1e-9)


def test_a_busy_loop_raises_the_busy_ticks_and_cpu_percent_is_busy_over_total():
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    before = read_counters()
    start = os.times()
    while (os.times().user + os.times().system) - (start.user + start.system) < 0.5:  # CPU time, not wall time
        sum(range(1000))
    after = read_counters()
    busy = after.cpu_busy - before.cpu_busy
    # this process alone used 0.5 s of CPU; the host's busy ticks include it (a tick of rounding per CPU)
    assert busy >= 0.5 * ticks_per_second - os.cpu_count()
    values = _values(rates(before, after))
    assert values["cpu_percent"] == pytest.approx(100.0 * busy / (after.cpu_total - before.cpu_total))
    assert 0 < values["cpu_percent"] <= 100


def test_memory_is_the_kernels_total_less_what_is_available():
    counters = read_counters()
    assert counters.memory_total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < counters.memory_available < counters.memory_total
    values = _values(rates(counters, counters))
    assert values["memory_used_bytes"] == counters.memory_total - counters.memory_available
    assert values["memory_percent"] == pytest.approx(100.0 * values["memory_used_bytes"] / counters.memory_total)
    # no interval, no throughput: the rates are zero, not a division by zero
    assert values["cpu_percent"] == 0 and values["network_receive_bytes_per_second"] == 0


def _disk_of(path) -> str | None:
    """The whole disk holding ``path``'s file system, or None (tmpfs, overlay on no block device)."""
    dev = os.stat(path).st_dev
    link = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if not os.path.exists(link):
        return None
    real = os.path.realpath(link)
    name = os.path.basename(real)
    if os.path.exists(os.path.join(real, "partition")):
        name = os.path.basename(os.path.dirname(real))
    return name if whole_disk(name) else None


def test_a_synced_write_raises_disk_writes_of_whole_disks(tmp_path):
    disk = _disk_of(tmp_path)
    if disk is None:
        pytest.skip(f"{tmp_path} is not on a whole disk (tmpfs or a virtual device)")
    size = 16 << 20
    before = read_counters()
    with open(tmp_path / "blob", "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    after = read_counters()
    assert after.disk_write - before.disk_write >= size
    assert (after.disk_write - before.disk_write) % SECTOR_BYTES == 0
    values = _values(rates(before, after))
    assert values["disk_write_bytes_per_second"] * (after.monotonic - before.monotonic) >= size * (1 - 1e-9)


def test_partitions_and_loop_devices_are_not_whole_disks():
    with open("/proc/diskstats") as f:
        names = [line.split()[2] for line in f]
    for name in names:
        if os.path.exists(f"/sys/class/block/{name}/partition") or name.startswith(("loop", "ram", "zram")):
            assert not whole_disk(name), name
    assert not whole_disk("no-such-disk")


def test_the_sampler_batches_and_flushes_a_last_sample_at_stop():
    batches = []
    sampler = SystemSampler(0.01, batches.append, flush_every=3600).start()
    while not sampler._pending:  # at least one sample taken, none flushed (the flush is an hour away)
        threading.Event().wait(0.01)
    assert batches == []
    sampler.stop()
    assert len(batches) == 1 and len(batches[0]) % len(METRIC_NAMES) == 0 and len(batches[0]) >= 2 * len(METRIC_NAMES)
    times = [t for t, _, _ in batches[0]]
    assert times == sorted(times)
    assert not sampler._thread.is_alive()


def test_a_failing_sink_does_not_stop_sampling():
    calls = []

    def sink(batch):
        calls.append(len(batch))
        raise OSError("disk full")

    sampler = SystemSampler(0.01, sink, flush_every=0.01).start()
    while len(calls) < 3:
        threading.Event().wait(0.01)
    sampler.stop()
    assert not sampler._thread.is_alive() and len(calls) >= 3


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        SystemSampler(0, lambda batch: None)


def test_the_log_appends_this_hosts_samples_and_the_batches_of_remote_hosts(tmp_path):
    import json

    path = tmp_path / "system.jsonl"
    log = SystemMetricsLog.open(str(path), 0.01)
    assert log is not None and SystemMetricsLog.open(None, 0.01) is None and SystemMetricsLog.open("", 0.5) is None
    log.write("node2", [[1.5, "cpu_percent", 7.0]])  # a remote agent's batch, as JSON decodes it
    log.write("node9", [None, ["x"]])  # a malformed one: dropped, said once, not raised into the frame reader
    log.close()
    log.write("node3", [[2.5, "cpu_percent", 1.0]])  # after close (a straggler): dropped, not an error
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == {"time": 1.5, "host": "node2", "name": "cpu_percent", "value": 7.0}
    own = lines[1:]
    assert own and {s["host"] for s in own} == {socket.gethostname()}
    assert [s["name"] for s in own] == list(METRIC_NAMES) * (len(own) // len(METRIC_NAMES))
    assert not log._sampler._thread.is_alive()


def test_a_log_that_cannot_be_opened_and_elastic_jobs_are_refused_naming_the_setting(tmp_path):
    from hora.errors import ConfigError
    from hora.runner import run_command

    with pytest.raises(ConfigError, match=r"--system-metrics .* cannot be opened for appending"):
        SystemMetricsLog.open(str(tmp_path / "missing" / "m.jsonl"), 0.5)
    with pytest.raises(ConfigError, match="not supported for elastic jobs"):
        run_command(["true"], np=1, elastic={"min_np": 1, "max_np": 2}, system_metrics=str(tmp_path / "m.jsonl"))
    assert not (tmp_path / "m.jsonl").exists()
