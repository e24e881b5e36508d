"""Bad input and failures end with clear errors on every rank, never a hang and never a leftover process."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time

import pytest

from hora._runtime.auth import Role, new_secret
from hora._runtime.connections import PeerListener, connect_peers
from support.harness import Launch, Launches, run_failing, run_ranks, stderr_of
from support.parts import Part
from workers.failures import (
    asleep_worker,
    attack_worker,
    duplicate_name_worker,
    killed_peer_worker,
    late_worker,
    mismatch_worker,
    raising_worker,
    silent_connections_worker,
)

MISMATCHES = {
    "shape": "allreduce 'grad.fc1' has shape (4, 3) on rank 0 but (4, 2) on ranks 1, 2; all ranks must submit the same shape.",
    "dtype": "allreduce 'w' has dtype float32 on ranks 0, 2 but float64 on rank 1; all ranks must submit the same dtype.",
    "op": "allreduce 'w' has op Sum on rank 0 but Max on ranks 1, 2; all ranks must submit the same op.",
    "root": "broadcast 'b' has root_rank 0 on rank 0 but 1 on ranks 1, 2; all ranks must submit the same root_rank.",
    "scale": "allreduce 's' has prescale_factor 1.0 on ranks 0, 2 but 2.0 on rank 1; all ranks must submit the same prescale_factor.",
    "trailing": "allgather 'ag' has trailing dimensions (all but the first) (1,) on ranks 0, 2 but (2,) on rank 1; all ranks must submit the same trailing dimensions.",
    "kind": "collective 'k' has operation allreduce on rank 0 but allgather on ranks 1, 2; all ranks must submit the same operation.",
    "ndim": "alltoall 'a2a' has number of dimensions 2 on rank 0 but 1 on ranks 1, 2; all ranks must submit the same number of dimensions.",
}


@pytest.fixture(scope="module")
def mismatches() -> Launches:
    """Every kind of mismatch on 3 ranks, one launch per transport; each kind on a fresh group (support/parts.py)."""
    return Launches(*(Launch(3, [Part(f"{t} {kind}", mismatch_worker, (kind,)) for kind in MISMATCHES],
                             {"transport": t}) for t in ("shm", "tcp")))


@pytest.mark.parametrize("kind", list(MISMATCHES))
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_mismatch_raises_the_same_clear_error_on_every_rank(mismatches, kind, transport):
    results = mismatches(f"{transport} {kind}")
    for name, message, elapsed in results:
        assert name == "MismatchError"
        assert message.startswith(MISMATCHES[kind]), message
        # caught by the negotiation, not by the stall inspector (which would take its 60 s check time)
        assert elapsed < 60, f"the mismatch took {elapsed:.2f}s to be reported"
    assert len({m for _, m, _ in results}) == 1, "every rank must get the same message"


def test_duplicate_name_in_flight_raises():
    message, _ = run_ranks(duplicate_name_worker, 2)
    assert "a collective named 'dup' is already in flight on rank 0" in message


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("victim", [0, 1])
def test_peer_killed_mid_allreduce(tmp_path, transport, victim):
    result = run_failing(killed_peer_worker, 3, str(tmp_path), victim, transport, timeout=60, grace_period=3)
    assert result.root_cause is not None and result.root_cause.rank == victim
    assert result.root_cause.returncode == -9 and "SIGKILL" in result.report()
    killed_at = float((tmp_path / "killed_at").read_text())
    for r in {0, 1, 2} - {victim}:
        report = tmp_path / f"survivor.{r}"
        assert report.exists(), f"rank {r} never raised PeerLostError:\n{stderr_of(result, r)}"
        detected, message = report.read_text().split("\n", 1)
        assert float(detected) - killed_at < 5.0, f"rank {r} noticed the loss after {float(detected) - killed_at:.1f}s"
        assert "rank" in message and ("died" in message or "left" in message or "failed" in message or "closed" in message), message


@pytest.mark.parametrize("code", [0, 7])
def test_worker_exception_is_the_root_cause(code):
    result = run_failing(raising_worker, 3, code, timeout=60)
    assert result.root_cause is not None and result.root_cause.rank == 1, result.report()
    if code:
        assert result.exit_code == code
    else:
        assert result.exit_code == 1
        assert "ValueError: boom from rank 1" in result.report()
    assert all(c is not None for c in result.returncodes)
    # the survivors say what happened to rank 1, in which collective, and where to look
    how = "ended" if code else "ended with an uncaught exception"
    for r in (0, 2):
        err = stderr_of(result, r)
        assert "allreduce 'never-completes' cannot complete: the script of rank 1 (host " in err, err
        assert f") {how} while this rank was still in a collective with it; the root cause is in that rank's output" in err, err


def test_after_a_stall_the_rank_the_others_waited_for_is_the_root_cause():
    result = run_failing(asleep_worker, 3, stall_check_time=1.0, stall_shutdown_time=2.0, timeout=60)
    assert result.root_cause is not None and result.root_cause.rank == 2, result.report()
    report = result.report()
    assert "the other ranks waited for rank 2 until the stall shutdown" in report
    assert "rank 2 never submitted 'waits.for.rank2'" in report


def test_rank_that_never_arrives_is_named():
    result = run_failing(late_worker, 2, start_timeout=2, timeout=60)
    err = stderr_of(result, 0)
    assert "RendezvousError" in err and "rank 1 never arrived at the rendezvous within 2s" in err, err
    assert result.root_cause is not None and result.root_cause.rank == 0


def test_attacks_on_the_rendezvous_port_are_rejected_and_the_job_still_runs():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # the launcher (this process) hosts the store
    assert run_ranks(attack_worker, 2) == [True, True]
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 256, f"the launcher grew by {grown_mib:.0f} MiB: a 2**31 frame must not be allocated"


def test_peer_listener_rejects_attacks_and_still_accepts_the_real_peer():
    secret = new_secret()
    listener = PeerListener("127.0.0.1", secret)
    host, port = listener.address
    listener.start_accepting({(Role.DATA, 1)}, time.monotonic() + 60)
    try:
        # garbage, wrong secret, unauthenticated huge length, an unexpected role and rank
        with socket.create_connection((host, port)) as s:
            s.sendall(b"\x00" * 64)
            s.settimeout(20)
            assert s.recv(4096) is not None
        from hora.errors import HoraError

        with pytest.raises(HoraError):
            connect_peers([(0, host, port)], Role.DATA, 1, new_secret(), time.monotonic() + 10)
        with socket.create_connection((host, port)) as s:
            s.recv(37)
            s.sendall((2**31).to_bytes(8, "big") + b"\1" * 64)
        stray = connect_peers([(0, host, port)], Role.CONTROL, 5, secret, time.monotonic() + 10)  # not expected
        socks = connect_peers([(0, host, port)], Role.DATA, 1, secret, time.monotonic() + 10)
        accepted = listener.wait()
        assert set(accepted) == {(Role.DATA, 1)}
        assert listener.rejected >= 4
        for s in [*accepted.values(), *socks.values(), *stray.values()]:
            s.close()
    finally:
        listener.close()


def test_rendezvous_port_in_use_is_a_clear_error():
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        proc = subprocess.run([sys.executable, "-m", "hora", "run", "-np", "2", "--rendezvous-port", str(port), "true"],
                              capture_output=True, text=True, timeout=60)
    finally:
        holder.close()
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "already in use" in proc.stderr.lower()




def test_silent_connections_to_every_listener_do_not_block_the_start():
    """Three silent connections to the store and to each rank's peer listener (issue 19, item 1): each handshake
    has a deadline of its own, so the real peers are authenticated beside them and the job runs; the drops are
    not printed one WARNING line each."""
    results = run_ranks(silent_connections_worker, 3, 3, transport="tcp", timeout=60)
    assert results == [(True, 6)] * 3
