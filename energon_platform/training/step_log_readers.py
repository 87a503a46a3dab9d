"""Readers of the step logs ``energon-platform check-resume --cmd`` understands.

One small class per format; each turns one line of a log into a row ``{"step": int, "loss":
float, ...}`` or None (a line that is not a step), and its docstring shows a sample line.
`read_steps` reads a whole log (complete lines only: a line a kill cut is not a step yet).

=============  ==========================================================================
``jsonl``      `JsonLines`: our [`StepLog`][energon_platform.training.step_log_writer.StepLog]
               (and the reference trainer's ``log.jsonl``); may carry ``keys`` and
               ``batch_sha256``, which make the check exact
``megatron``   `MegatronLog`: Megatron-LM's ``training_log`` lines (``--log-interval 1``)
``torchtitan`` `TorchtitanLog`: torchtitan's ``MetricsProcessor.log`` lines
``regex``      `RegexLog`: any line a user regex with groups ``step`` and ``loss`` matches
=============  ==========================================================================
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = [
    "FORMATS",
    "JsonLines",
    "MegatronLog",
    "TorchtitanLog",
    "RegexLog",
    "LogFormatError",
    "get_format",
    "read_steps",
    "complete_length",
]

#: a float as Python, C printf (``%E``) or torch print it, NaN and infinities included
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class LogFormatError(ValueError):
    """A log format that cannot work (a regex without the named groups, an unknown name)."""


class JsonLines:
    """One JSON object per line with at least ``step`` (int) and ``loss`` (number); other fields
    are kept (``keys``, ``batch_sha256``, ``resumed_from``...). A line that is not such an object
    (a torn line that some other writer appended to) is no step. Sample:

        {"step": 17, "loss": 7.633512, "keys": ["000000000189", "000000000147"], "batch_sha256": "8fb7d776..."}
    """

    name = "jsonl"

    def parse_line(self, line: str) -> dict | None:
        try:
            row = json.loads(line)
        except ValueError:
            return None
        if not (
            isinstance(row, dict)
            and isinstance(row.get("step"), int)
            and not isinstance(row["step"], bool)
            and isinstance(row.get("loss"), (int, float))
            and not isinstance(row["loss"], bool)
        ):
            return None
        return row


class MegatronLog:
    """Megatron-LM's per-iteration line (``megatron/training/training.py``, ``training_log``,
    printed by the last rank every ``--log-interval`` iterations: log every iteration for the
    check). The loss is the ``lm loss`` field (``loss_key``), an average over the log interval.
    Sample (one line):

         [2026-08-22 15:22:22.123456] iteration       17/      30 | consumed samples:          136 | elapsed time per iteration (ms): 812.3 | learning rate: 2.999900E-04 | global batch size:     8 | lm loss: 7.633512E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |
    """  # noqa: E501 (a log line, quoted whole)

    name = "megatron"

    def __init__(self, loss_key: str = "lm loss"):
        self.iteration = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
        self.loss = re.compile(
            r"\|\s*" + re.escape(loss_key) + r":\s*(" + NUMBER + r")\s*\|", re.IGNORECASE
        )

    def parse_line(self, line: str) -> dict | None:
        it, loss = self.iteration.search(line), self.loss.search(line)
        if not (it and loss):
            return None
        return {
            "step": int(it.group(1)),
            "loss": float(loss.group(1)),
            "train_iters": int(it.group(2)),
        }


class TorchtitanLog:
    """torchtitan's training line (``torchtitan/components/metrics.py``, ``MetricsProcessor.log``;
    colour codes and torchrun's ``[rank0]:`` prefix are ignored; ``validate step:`` lines are not
    steps). The loss is printed with 5 decimals. Sample:

        [titan] 2026-08-22 15:22:22,123 - root - INFO - step: 17  loss:  7.63351  grad_norm:  1.2345  memory:  0.00GiB(0.00%)  tps: 1,234  tflops: 0.00  mfu: 0.00%
    """  # noqa: E501 (a log line, quoted whole)

    name = "torchtitan"
    pattern = re.compile(
        r"(validate\s+)?\bstep:\s*(\d+)\s+loss:\s*(" + NUMBER + r")", re.IGNORECASE
    )

    def parse_line(self, line: str) -> dict | None:
        for m in self.pattern.finditer(_ANSI.sub("", line)):
            if not m.group(1):
                return {"step": int(m.group(2)), "loss": float(m.group(3))}
        return None


class RegexLog:
    """Lines matched (``re.search``) by a user regex with named groups ``step`` (an integer) and
    ``loss`` (a float), e.g. for nanoGPT's ``iter 17: loss 7.6335, time 812.30ms, mfu 1.20%``:

        --log-format regex --regex 'iter (?P<step>\\d+): loss (?P<loss>[-+.\\deE]+|nan)'

    Colour codes are removed first; a match whose groups do not convert is no step.
    """

    name = "regex"

    def __init__(self, pattern: str):
        try:
            self.pattern = re.compile(pattern)
        except re.error as e:
            raise LogFormatError(f"--regex {pattern!r}: not a regular expression ({e})") from None
        missing = {"step", "loss"} - set(self.pattern.groupindex)
        if missing:
            raise LogFormatError(
                f"--regex {pattern!r}: needs the named groups (?P<step>...) and (?P<loss>...); "
                f"missing {', '.join(sorted(missing))}"
            )

    def parse_line(self, line: str) -> dict | None:
        m = self.pattern.search(_ANSI.sub("", line))
        if not m:
            return None
        try:
            return {"step": int(m.group("step")), "loss": float(m.group("loss"))}
        except (TypeError, ValueError):
            return None


FORMATS = ("jsonl", "megatron", "torchtitan", "regex")


def get_format(name: str, regex: str | None = None) -> Any:
    """The reader for ``name`` (`FORMATS`); ``regex`` goes with ``regex`` only."""
    if name == "regex":
        if not regex:
            raise LogFormatError(
                "--log-format regex needs --regex PATTERN with groups (?P<step>...) and (?P<loss>...)"
            )
        return RegexLog(regex)
    if regex:
        raise LogFormatError(f"--regex goes with --log-format regex, not {name}")
    readers = {"jsonl": JsonLines, "megatron": MegatronLog, "torchtitan": TorchtitanLog}
    if name not in readers:
        raise LogFormatError(f"log format {name!r}: expected one of {', '.join(FORMATS)}")
    return readers[name]()


def complete_length(data: bytes) -> int:
    """Bytes of ``data`` up to and including its last newline (what complete lines it holds)."""
    return data.rfind(b"\n") + 1


def read_steps(path: str | Path, fmt: Any, start: int = 0) -> dict[int, dict]:
    """Rows by step from the complete lines of ``path`` from byte ``start`` on, in the order
    logged; a step logged twice keeps the last. A missing file has no steps."""
    path = Path(path)
    try:
        data = path.read_bytes()[start:]
    except FileNotFoundError:
        return {}
    rows = {}
    for line in data[: complete_length(data)].decode("utf-8", errors="replace").splitlines():
        row = fmt.parse_line(line) if line.strip() else None
        if row is not None:
            rows[row["step"]] = row
    return rows


def sample_line(reader: object) -> str | None:
    """The sample line a reader's docstring shows: the first line of the indented block after its
    line naming a "Sample"; None when it shows none."""
    lines = (type(reader).__doc__ or "").splitlines()
    after = next((i + 1 for i, line in enumerate(lines) if "Sample" in line), len(lines))
    return next((line.strip() for line in lines[after:] if line.strip()), None)
