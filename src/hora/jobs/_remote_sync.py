"""What a job's supervisor runs on a remote host over SSH or a Ray host's agent (:mod:`hora.jobs.remote_hosts`):
``python -m hora.jobs._remote_sync COMMAND ...``, one command per SSH session, its answer on stdout.

- ``probe JOB_DIR PEER``: create the job's directory; print (JSON) its absolute path, the interface and address
  this host reaches ``PEER`` through (``ip -o route get PEER``), its CPU and GPU counts (the GPUs that
  ``CUDA_VISIBLE_DEVICES`` leaves, when set).
- ``manifest JOB_DIR HOST``: print the manifest of this host's cache of ``HOST``'s tree (``<work_dir>/.cache/HOST``,
  what the last push left there), so the supervisor sends only what changed.
- ``apply JOB_DIR HOST``: read a tar from stdin: ``tree/...`` into the cache, ``hora/...`` into the job's ``hora/``,
  ``delete.json`` (paths the cache must lose), ``times.json`` (the shipped files' mtimes in ns); then copy the
  cache to the job's ``hosts/HOST`` tree (with empty ``model/`` and ``output/``).
- ``stage JOB_DIR HOST``: fetch the job's ``s3://`` File channels (listed on stdin, with the S3 variables).
- ``pipe JOB_DIR HOST``: feed the job's Pipe channels for one attempt, until the end of stdin.
- ``reset JOB_DIR HOST``: empty ``model/`` and ``output/`` for a retry.
- ``pack JOB_DIR HOST ATTEMPT``: write a tar of ``model/``, ``output/``, ``checkpoints/`` and the attempt's records.
- ``clean WORK_DIR [JOB]``: remove one job's directory, or the whole work dir (cache included).

Nothing secret passes here: the job's secret reaches the ranks only through hora run's agent, on its stdin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path, PurePosixPath

from hora.config.variables import environment
from hora.jobs.remote_spec import manifest

CACHE = ".cache"


def _dir(arg: str) -> Path:
    return Path(os.path.expanduser(arg))


def _cache(job_dir: Path, host: str) -> Path:
    return job_dir.parent / CACHE / host


def _route(peer: str) -> tuple[str, str]:
    """(interface, source address) of this host's route towards ``peer``."""
    out = subprocess.run(["ip", "-o", "route", "get", peer], capture_output=True, text=True, timeout=10)
    words = out.stdout.split()
    if out.returncode != 0 or "dev" not in words:
        raise SystemExit(f"cannot tell the route to {peer}: {out.stderr.strip() or out.stdout.strip()}")
    dev = words[words.index("dev") + 1]
    src = words[words.index("src") + 1] if "src" in words else ""
    return dev, src


def probe(job_dir: Path, peer: str) -> None:
    for sub in ("hora", "logs"):
        (job_dir / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    dev, src = _route(peer)
    gpus = len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()])
    visible = environment().get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # what this host's processes may use (a Ray host: its bundle's GPUs)
        gpus = min(gpus, len([d for d in visible.split(",") if d.strip()]))
    print(json.dumps({"dir": str(job_dir.resolve()), "interface": dev, "address": src,
                      "cpus": os.cpu_count() or 1, "gpus": gpus}))


def _safe(member: tarfile.TarInfo) -> bool:
    path = PurePosixPath(member.name)
    return (member.isfile() or member.isdir()) and not path.is_absolute() and ".." not in path.parts


def apply(job_dir: Path, host: str) -> None:
    cache, tree = _cache(job_dir, host), job_dir / "hosts" / host
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    times: dict[str, int] = {}  # the shipped files' modification times to the nanosecond (tar keeps less)
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
        for member in tar:
            if not _safe(member):
                raise SystemExit(f"refused the tar member {member.name!r}")
            top, _, rest = member.name.partition("/")
            if member.name in ("delete.json", "times.json"):
                f = tar.extractfile(member)
                listed = json.loads(f.read() if f else b"[]")
                if member.name == "times.json":
                    times = listed
                    continue
                for name in listed:
                    if ".." not in PurePosixPath(name).parts:
                        (cache / name).unlink(missing_ok=True)
            elif top in ("tree", "hora") and rest:
                member.name = rest
                tar.extract(member, cache if top == "tree" else job_dir / "hora", set_attrs=True)
    for name, ns in times.items():
        if ".." not in PurePosixPath(name).parts and (cache / name).is_file():
            os.utime(cache / name, ns=(ns, ns))
    shutil.copytree(cache, tree, dirs_exist_ok=True)  # copy2: sizes and mtimes as shipped
    _sent(job_dir, host).unlink(missing_ok=True)
    reset(job_dir, host)  # model/ and output/ there, empty


def stage(job_dir: Path, host: str) -> None:
    """The job's ``s3://`` File channels, fetched by this host itself (its share of a ShardedByS3Key channel):
    stdin holds them, the host's index and count, and the S3 variables (endpoint, credentials) to use."""
    from hora.jobs.channels import stage_channel

    job = json.loads(sys.stdin.buffer.read())
    if job.get("env"):  # hora's S3 client reads them from the environment: a child of ours gets them
        child = [sys.executable, "-m", "hora.jobs._remote_sync", "stage", str(job_dir), host]
        done = subprocess.run(child, input=json.dumps({**job, "env": {}}).encode(), env={**environment(), **job["env"]})
        raise SystemExit(done.returncode)
    for ch in job["channels"]:
        stage_channel(ch["name"], ch["uri"], job_dir / "hosts" / host / "input" / "data" / ch["name"],
                      input_mode="File", distribution=ch["distribution"], host_index=job["index"],
                      host_count=job["count"])


def _first_line() -> bytes:
    """The first line of stdin, read unbuffered: what follows (the end of stdin) stays for a later read."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            break
        line += chunk
    return line


def pipe(job_dir: Path, host: str, argv: list[str]) -> None:
    """Feed the job's Pipe channels on this host for one attempt: the first line of stdin lists them (with the S3
    variables; this process re-executes itself with them in its environment, the list on its command line, which
    holds no secret); each channel's FIFOs are created in the host's tree and fed as the script reads; ``ready``
    is printed; at the end of stdin (the attempt is over) the feeders stop and each failure is printed as JSON."""
    from hora.jobs.channels import stage_channel

    if not argv:
        job = json.loads(_first_line())
        if job.get("env"):
            env = {**environment(), **job["env"]}
            os.execve(sys.executable, [sys.executable, "-m", "hora.jobs._remote_sync", "pipe", str(job_dir), host,
                                       json.dumps({**job, "env": {}})], env)
    else:
        job = json.loads(argv[0])
    data = job_dir / "hosts" / host / "input" / "data"
    handles = [stage_channel(ch["name"], ch["uri"], data / ch["name"], input_mode="Pipe",
                             distribution=ch["distribution"], host_index=job["index"], host_count=job["count"])
               for ch in job["channels"]]
    print("ready", flush=True)
    while os.read(0, 4096):
        pass
    for handle in handles:
        handle.close()
        if handle.error is not None:
            print(json.dumps({"channel": handle.name, "error": str(handle.error)}), flush=True)


def reset(job_dir: Path, host: str, checkpoints: bool = False) -> None:
    """Empty model/ and output/ (a retry), and checkpoints/ too for a new instance (a spot reclaim: the supervisor
    then pushes the checkpoints restored from checkpoint_path)."""
    tree = job_dir / "hosts" / host
    for name in ("model", "output", *(("checkpoints",) if checkpoints else ())):
        shutil.rmtree(tree / name, ignore_errors=True)
    if checkpoints:
        _sent(job_dir, host).unlink(missing_ok=True)
    for sub in ("model", "output/data", "output/intermediate", "checkpoints"):
        (tree / sub).mkdir(parents=True, exist_ok=True)


def pack(job_dir: Path, host: str, attempt: str) -> None:
    """model/, output/, checkpoints/ and the attempt's records as a tar on stdout; attempt ``-``: checkpoints/
    only (the periodic sync of a spot job's checkpoints while it runs)."""
    tree, cache = job_dir / "hosts" / host, _cache(job_dir, host)
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        for name in ("model", "output") if attempt != "-" else ():
            if (tree / name).is_dir():
                tar.add(tree / name, arcname=f"tree/{name}")
        # checkpoints/: only what changed since the last pack, or since the push restored every host's checkpoints
        # here (an untouched copy of another host's file must not come back as this host's, see _stage.py)
        sent = _sent(job_dir, host)
        known = json.loads(sent.read_text()) if sent.is_file() else manifest(cache / "checkpoints")
        now = manifest(tree / "checkpoints")
        for rel, meta in sorted(now.items()):
            if tuple(known.get(rel, ())) != meta:
                tar.add(tree / "checkpoints" / rel, arcname=f"tree/checkpoints/{rel}")
        records = job_dir / "hora" / f"attempt-{attempt}"
        if attempt != "-" and records.is_dir():
            tar.add(records, arcname=f"hora/attempt-{attempt}")
    sys.stdout.flush()
    sent.write_text(json.dumps({**known, **now}))  # only once the whole tar went out


def _sent(job_dir: Path, host: str) -> Path:
    """The checkpoints a pack sent last (a new push or a new instance starts again from the shipped ones)."""
    return job_dir / "hora" / f"checkpoints-sent-{host}.json"


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "probe":
        probe(_dir(args[0]), args[1])
    elif command == "manifest":
        print(json.dumps(manifest(_cache(_dir(args[0]), args[1]))))
    elif command == "apply":
        apply(_dir(args[0]), args[1])
    elif command == "stage":
        stage(_dir(args[0]), args[1])
    elif command == "pipe":
        pipe(_dir(args[0]), args[1], args[2:])
    elif command == "reset":
        reset(_dir(args[0]), args[1], checkpoints=args[2:] == ["checkpoints"])
    elif command == "pack":
        pack(_dir(args[0]), args[1], args[2])
    elif command == "clean":
        root = _dir(args[0])
        target = root / args[1] if len(args) > 1 else root
        shutil.rmtree(target, ignore_errors=True)
        print(json.dumps({"removed": str(target)}))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
