"""What a read cost the object store: requests served and bytes sent, counted by the server.

Read amplification is measured on the server side, so it counts what really crossed the wire
(HEAD, whole-object GET, ranged GET, retries), whatever the client library does underneath.
Today's reader is SeaweedFS's Prometheus endpoint (``weed server -metricsPort=PORT``): the
counters ``SeaweedFS_s3_request_total{bucket=...}`` (every S3 request on that bucket, any method
and status; SeaweedFS files HEAD under ``type="GET"``) and
``SeaweedFS_s3_bucket_traffic_sent_bytes_total{bucket=...}`` (response body bytes). A benchmark
takes :func:`seaweedfs_counters` before and after a run and divides the difference
(:meth:`StorageCounters.__sub__`) by the samples and bytes it delivered.
"""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class StorageCounters:
    """Cumulative counters of one bucket: ``requests`` served, ``bytes_out`` sent to clients,
    ``by_type``: requests per S3 method class (``GET``, ``PUT``, ``LIST``, ...)."""

    requests: int
    bytes_out: int
    by_type: tuple[tuple[str, int], ...] = ()

    def __sub__(self, before: StorageCounters) -> StorageCounters:
        types = dict(self.by_type)
        for name, n in before.by_type:
            types[name] = types.get(name, 0) - n
        return StorageCounters(
            self.requests - before.requests,
            self.bytes_out - before.bytes_out,
            tuple(sorted((k, v) for k, v in types.items() if v)),
        )


def parse_seaweedfs_metrics(text: str, bucket: str) -> StorageCounters:
    """The counters of ``bucket`` in a Prometheus text exposition from SeaweedFS."""
    requests = bytes_out = 0
    by_type: dict[str, int] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        if labels.get("bucket") != bucket:
            continue
        value = int(float(m["value"]))
        if m["name"] == "SeaweedFS_s3_request_total":
            requests += value
            by_type[labels.get("type", "?")] = by_type.get(labels.get("type", "?"), 0) + value
        elif m["name"] == "SeaweedFS_s3_bucket_traffic_sent_bytes_total":
            bytes_out += value
    return StorageCounters(requests, bytes_out, tuple(sorted(by_type.items())))


def seaweedfs_counters(metrics_url: str, bucket: str, timeout: float = 5.0) -> StorageCounters:
    """Fetch ``metrics_url`` (``http://127.0.0.1:PORT/metrics``) and return ``bucket``'s counters."""
    with urllib.request.urlopen(metrics_url, timeout=timeout) as response:
        return parse_seaweedfs_metrics(response.read().decode(), bucket)
