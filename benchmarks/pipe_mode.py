"""Pipe-mode and File-mode throughput of ``hora job`` channels on this machine (local source, no S3).

Writes a source of ``--size`` bytes (text lines or TFRecords), then measures: File-mode staging (copy), Pipe-mode
raw bytes through the FIFO, and records per second through :class:`hora.data.PipeDataset` in a separate reader
process. Prints one ``HORA_BENCH {json}`` line per measurement. Run it on a quiet machine::

    PYTHONPATH=src python benchmarks/pipe_mode.py --size 256MB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hora.data import encode_tfrecord
from hora.data.crc32c import IMPLEMENTATION
from hora.jobs.channels import stage_channel

SRC = str(Path(__file__).resolve().parent.parent / "src")
READER = """
import os, sys, time
from hora.data import PipeDataset
path, fmt = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if fmt == "raw":
    fd = os.open(path + "_0", os.O_RDONLY)
    n = 0
    while chunk := os.read(fd, 1 << 20):
        n += len(chunk)
else:
    n = sum(1 for _ in PipeDataset(path, record_format=fmt, timeout=600))
print(n, time.perf_counter() - t)
"""


def _size(text: str) -> int:
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    for suffix, mult in units.items():
        if text.upper().endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    return int(text)


def _write_source(path: Path, fmt: str, size: int) -> None:
    with open(path, "wb") as f:
        written = 0
        if fmt == "text":
            line = b"x" * 99 + b"\n"
            block = line * 10_000
            while written < size:
                f.write(block)
                written += len(block)
        else:
            record = encode_tfrecord(os.urandom(1000))
            block = record * 1000
            while written < size:
                f.write(block)
                written += len(block)


def _pipe(src: Path, data: Path, fmt: str) -> tuple[int, float]:
    handle = stage_channel(
        "train",
        src,
        data / "train",
        input_mode="Pipe",
        distribution="FullyReplicated",
        host_index=0,
        host_count=1,
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", READER, str(data / "train"), fmt],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=SRC),
            timeout=1800,
            check=True,
        ).stdout.split()
    finally:
        handle.close()
    return int(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="256MB", help="source size per format (default 256MB)")
    args = parser.parse_args()
    size = _size(args.size)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for fmt in ("text", "tfrecord"):
            src = root / f"source.{fmt}"
            _write_source(src, fmt, size)
            nbytes = src.stat().st_size
            t = time.perf_counter()
            stage_channel(
                "train",
                src,
                root / f"file-{fmt}",
                input_mode="File",
                distribution="FullyReplicated",
                host_index=0,
                host_count=1,
            )
            copy_s = time.perf_counter() - t
            print(
                "HORA_BENCH "
                + json.dumps(
                    {
                        "mode": "File",
                        "format": fmt,
                        "bytes": nbytes,
                        "seconds": copy_s,
                        "MB_per_s": nbytes / copy_s / 1e6,
                    }
                )
            )
            raw, raw_s = _pipe(src, root / f"pipe-raw-{fmt}", "raw")
            print(
                "HORA_BENCH "
                + json.dumps(
                    {
                        "mode": "Pipe",
                        "reader": "raw os.read",
                        "bytes": raw,
                        "seconds": raw_s,
                        "MB_per_s": raw / raw_s / 1e6,
                    }
                )
            )
            count, rec_s = _pipe(src, root / f"pipe-{fmt}", fmt)
            print(
                "HORA_BENCH "
                + json.dumps(
                    {
                        "mode": "Pipe",
                        "reader": f"PipeDataset({fmt})",
                        "records": count,
                        "seconds": rec_s,
                        "records_per_s": count / rec_s,
                        "MB_per_s": nbytes / rec_s / 1e6,
                        "crc32c": IMPLEMENTATION,
                    }
                )
            )


if __name__ == "__main__":
    main()
