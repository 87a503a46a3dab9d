"""A training run as one HTML page a person reads in the browser (``energon-platform report``).

`build_report` reads a run folder's ``log.jsonl`` (the reference trainer's, or any
`StepLog`) and writes ONE self-contained file: every chart an inline SVG
drawn by matplotlib, every picture a ``data:`` URI, the style inline, and a Content-Security-Policy
that forbids any other fetch, so it opens offline and reaches no server. It holds:

* the loss curve, spikes marked at their exact step and loss (and a second run's loss with
  ``compare_run``), the learning rate when logged;
* per-rank cost (max/mean) and padding over steps for balanced runs;
* per-dataset samples consumed and samples excluded over steps for blends;
* a panel per spike: each of its samples as the model sees it (drawn by
  `preview`: image thumbnails and VLM tiles, a clip's frames, an
  audio sample's log-mel spectrogram, a point cloud from three sides), with its decoded text, token
  count, key and per-sample loss; media are read from the run config's datasets by key.

Curves longer than `BUCKETS` points are reduced to the minimum and maximum of each of
`BUCKETS` buckets, every spike kept exact, so the page stays small for millions of steps.
"""

from __future__ import annotations

import base64
import html
import inspect
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from energon_platform.config import RunConfig, load_config
from energon_platform.loader.datasets import open_datasets
from energon_platform.loader.key_index import KeyIndex
from energon_platform.loader.run_plan import build_encoder
from energon_platform.tools.preview import contact_sheet, doc_texts
from storage.outputs import write_atomic

__all__ = ["BUCKETS", "ReportError", "RunLog", "build_report", "read_run_log", "reduce_curve"]

#: Buckets a curve is reduced to (each keeps its minimum and maximum point).
BUCKETS = 2000
#: Spikes that get a panel of samples, and samples drawn per spike (the rest are listed by key).
MAX_PANELS = 12
MAX_SAMPLES = 8

#: Nothing but the page's own inline style and data URIs may load.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


class ReportError(ValueError):
    """A run folder the report cannot be built from (no folder, no log, no step in it): one line."""


@dataclass
class RunLog:
    """The columns of a step log, one entry per step in step order (a step logged twice, as after
    a resume, keeps its last row). Missing values are NaN; ``samples`` is per dataset the samples
    consumed up to and including the step, ``excluded`` per dataset those excluded in it."""

    path: Path
    steps: np.ndarray
    loss: np.ndarray
    lr: np.ndarray
    rank_cost: np.ndarray
    padding: np.ndarray
    #: the least rank cost max/mean any dealing of the step's batch reaches (NaN: not logged)
    rank_cost_bound: np.ndarray = field(default_factory=lambda: np.array([]))
    samples: dict[str, np.ndarray] = field(default_factory=dict)
    excluded: dict[str, np.ndarray] = field(default_factory=dict)
    #: per dataset, its blend weight at each step (``blend_weights``; a blend's runs)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    #: per dataset, the mean loss of its samples at each step (from ``keys``/``sample_losses``)
    dataset_loss: dict[str, np.ndarray] = field(default_factory=dict)
    corrupt: int = 0  #: lines that are not a step row (skipped)


def _step_row(line: bytes) -> dict | None:
    """The JSON object of ``line`` if it has an integer ``step`` and a numeric ``loss``."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    ok = (
        isinstance(row, dict)
        and type(row.get("step")) is int
        and isinstance(row.get("loss"), (int, float))
        and not isinstance(row["loss"], bool)
    )
    return row if ok else None


def _number(row: dict, name: str) -> float:
    value = row.get(name)
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else np.nan
    )


def _per_dataset(rows: list[dict], field_name: str, value: Any) -> dict[str, np.ndarray]:
    """Per dataset name found in ``row[field_name]`` (a dict), ``value(entry)`` per row, NaN when
    the row has no entry for it."""
    names = sorted({n for r in rows if isinstance(r.get(field_name), dict) for n in r[field_name]})
    out = {}
    for name in names:
        column = np.full(len(rows), np.nan)
        for i, r in enumerate(rows):
            entry = r.get(field_name)
            if isinstance(entry, dict) and name in entry:
                column[i] = value(entry[name])
        out[name] = column
    return out


def _dataset_losses(row: dict) -> dict[str, float]:
    """Per dataset (the ``DATASET:`` of a blend's keys), the mean of the row's sample losses."""
    keys, losses = row.get("keys"), row.get("sample_losses")
    if not isinstance(keys, list) or not isinstance(losses, list) or len(keys) != len(losses):
        return {}
    sums: dict[str, list[float]] = {}
    for key, loss in zip(keys, losses):
        if isinstance(key, str) and ":" in key and isinstance(loss, (int, float)):
            if math.isfinite(loss):
                sums.setdefault(key.split(":", 1)[0], []).append(float(loss))
    return {name: sum(v) / len(v) for name, v in sums.items()}


def _samples_of(entry: Any) -> float:
    return float(entry["samples"]) if isinstance(entry, dict) and "samples" in entry else np.nan


def _count(entry: Any) -> float:
    return float(entry) if isinstance(entry, (int, float)) else np.nan


def read_run_log(run_dir: str | Path) -> RunLog:
    """The `RunLog` of ``run_dir/log.jsonl``; lines that are not step rows are counted in
    ``corrupt`` and skipped. `ReportError` when the folder, the log or every step is missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run folder; pass the --out folder of a training run")
    path = run_dir / "log.jsonl"
    if not path.is_file():
        raise ReportError(f"{path}: no step log in the run folder; train the run first")
    by_step: dict[int, dict] = {}
    corrupt = 0
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            row = _step_row(line)
            if row is None:
                corrupt += 1
            else:
                by_step[row["step"]] = row
    if not by_step:
        raise ReportError(f"{path}: no step rows ({corrupt} corrupt lines skipped)")
    rows = [by_step[s] for s in sorted(by_step)]
    return RunLog(
        path=path,
        steps=np.array([r["step"] for r in rows], dtype=np.int64),
        loss=np.array([float(r["loss"]) for r in rows]),
        lr=np.array([_number(r, "lr") for r in rows]),
        rank_cost=np.array([_number(r, "rank_cost") for r in rows]),
        padding=np.array([_number(r, "padding") for r in rows]),
        rank_cost_bound=np.array([_number(r, "rank_cost_bound") for r in rows]),
        samples=_per_dataset(rows, "datasets", _samples_of),
        excluded=_per_dataset(rows, "excluded", _count),
        weights=_per_dataset(rows, "blend_weights", _count),
        dataset_loss=_per_dataset([{"by": _dataset_losses(r)} for r in rows], "by", _count),
        corrupt=corrupt,
    )


def reduce_curve(
    y: np.ndarray, buckets: int = BUCKETS, keep: np.ndarray | None = None
) -> np.ndarray:
    """Indices into ``y`` that draw it faithfully with at most ``2 * buckets`` points plus ``keep``:
    all of them when ``y`` is that short, else each bucket's minimum and maximum (NaN points are
    neither), and every index of ``keep``; sorted, unique."""
    n = len(y)
    keep = np.asarray(keep if keep is not None else [], dtype=np.int64)
    if n <= 2 * buckets:
        return np.arange(n)
    size = -(-n // buckets)
    padded = np.full(size * buckets, np.nan)
    padded[:n] = y
    grid = padded.reshape(buckets, size)
    valid = ~np.isnan(grid)
    lows = np.where(valid, grid, np.inf).argmin(axis=1)
    highs = np.where(valid, grid, -np.inf).argmax(axis=1)
    starts = np.arange(buckets) * size
    picked = np.concatenate([starts + lows, starts + highs, keep])
    return np.unique(picked[picked < n])


# --- charts --------------------------------------------------------------------------------------


def _svg(fig: Any) -> str:
    """``fig`` as an inline ``<svg>`` element (no XML prolog), the figure closed. matplotlib's
    own path simplification is off: the points drawn are exactly those `reduce_curve` kept."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "path.simplify": False}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _figure(title: str, ylabel: str) -> tuple[Any, Any]:
    import matplotlib

    # pyplot only once a chart is drawn: the backend must be set before its import
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _plot(ax: Any, steps: np.ndarray, y: np.ndarray, label: str, keep=None, **style: Any) -> None:
    idx = reduce_curve(y, keep=keep)
    ax.plot(steps[idx], y[idx], label=label, linewidth=0.9, **style)


def _legend(ax: Any, *twins: Any) -> None:
    """One legend for the curves of ``ax`` and of its twin axes, below the chart and outside its
    axes (inside, wherever it went, it hid some curve: a spike, a dataset's weight)."""
    handles, labels = ax.get_legend_handles_labels()
    for twin in twins:
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=min(len(labels), 4),
        fontsize=8,
        frameon=False,
    )


def _spike_index(log: RunLog, spikes: list[dict]) -> np.ndarray:
    """Row indices of the spikes' steps in ``log`` (steps not logged are left out)."""
    wanted = np.array(sorted({int(s["step"]) for s in spikes}), dtype=np.int64)
    pos = np.searchsorted(log.steps, wanted)
    pos = pos[pos < len(log.steps)]
    return pos[np.isin(log.steps[pos], wanted)]


def loss_chart(log: RunLog, spikes: list[dict], compare: RunLog | None = None) -> str:
    """The loss over steps, spikes marked red at their exact step and loss; ``compare``'s loss
    drawn against it."""
    fig, ax = _figure("Loss", "loss")
    marked = _spike_index(log, spikes)
    _plot(ax, log.steps, log.loss, log.path.parent.name, keep=marked, color="tab:blue")
    if compare is not None:
        _plot(
            ax,
            compare.steps,
            compare.loss,
            f"{compare.path.parent.name} (compared)",
            color="tab:orange",
            alpha=0.8,
        )
    if len(marked):
        ax.scatter(log.steps[marked], log.loss[marked], color="red", s=18, zorder=3, label="spikes")
    _legend(ax)
    return _svg(fig)


def lr_chart(log: RunLog) -> str:
    fig, ax = _figure("Learning rate", "lr")
    _plot(ax, log.steps, log.lr, "lr", color="tab:green")
    return _svg(fig)


def balance_chart(log: RunLog) -> str:
    """Per-rank cost (max/mean, 1 is perfect) beside its lower bound, and padding fraction over
    steps."""
    fig, ax = _figure("Balance: per-rank cost (max/mean) and padding", "rank cost")
    _plot(ax, log.steps, log.rank_cost, "rank cost max/mean", color="tab:purple")
    if len(log.rank_cost_bound) and not np.isnan(log.rank_cost_bound).all():
        _plot(ax, log.steps, log.rank_cost_bound, "lower bound", color="tab:purple", linestyle=":")
    right = ax.twinx()
    right.set_ylabel("padding")
    _plot(right, log.steps, log.padding, "padding", color="tab:gray")
    _legend(ax, right)
    return _svg(fig)


def datasets_chart(log: RunLog) -> str:
    """Samples consumed per dataset (cumulative) and, when any, samples excluded per step."""
    title = "Blend: samples consumed per dataset" + (", excluded per step" if log.excluded else "")
    fig, ax = _figure(title, "samples (total)")
    for name, column in log.samples.items():
        _plot(ax, log.steps, column, name)
    twins = [ax.twinx()] if log.excluded else []
    for right in twins:
        right.set_ylabel("excluded per step")
        for name, column in log.excluded.items():
            _plot(right, log.steps, column, f"{name} excluded", linestyle="--")
    _legend(ax, *twins)
    return _svg(fig)


def mixing_chart(log: RunLog) -> str:
    """The blend's weights over steps (``loader.blend_adapt`` moves them) beside each dataset's
    mean sample loss, one colour per dataset."""
    fig, ax = _figure("Mixing: blend weights (solid) and per-dataset loss (dashed)", "weight")
    right = ax.twinx()
    right.set_ylabel("mean sample loss")
    for i, (name, column) in enumerate(log.weights.items()):
        colour = f"C{i % 10}"
        _plot(ax, log.steps, column, f"{name} weight", color=colour)
        if name in log.dataset_loss:
            _plot(
                right,
                log.steps,
                log.dataset_loss[name],
                f"{name} loss",
                color=colour,
                linestyle="--",
                alpha=0.6,
            )
    _legend(ax, right)
    return _svg(fig)


def _weights_move(log: RunLog) -> bool:
    return any(len(set(c[~np.isnan(c)].tolist())) > 1 for c in log.weights.values())


def charts(log: RunLog, spikes: list[dict], compare: RunLog | None) -> list[tuple[str, str]]:
    """``(id, svg)`` of each chart the log has data for, loss first."""
    out = [("chart-loss", loss_chart(log, spikes, compare))]
    if not np.isnan(log.lr).all():
        out.append(("chart-lr", lr_chart(log)))
    if not (np.isnan(log.rank_cost).all() and np.isnan(log.padding).all()):
        out.append(("chart-balance", balance_chart(log)))
    if len(log.samples) > 1 or log.excluded:
        out.append(("chart-datasets", datasets_chart(log)))
    if _weights_move(log):
        out.append(("chart-mixing", mixing_chart(log)))
    return out


# --- samples -------------------------------------------------------------------------------------


class SampleReader:
    """Samples of a run config's datasets by key, encoded by its encoder (evaluation mode: no
    augmentation) and drawn as `contact_sheet` draws them."""

    def __init__(self, config: Any):

        cfg = config if isinstance(config, RunConfig) else load_config(config)
        self.datasets = open_datasets(str(cfg.data.path), cfg.data.train_split)
        self.encoder = build_encoder(cfg, training=False)
        self._indexes: dict[int, Any] = {}

    def _entry(self, sample: dict) -> tuple[int, str]:
        """``(dataset number, key as stored)`` of a spike sample (``dataset`` and a logged key)."""
        names = self.datasets.names
        key = str(sample["key"])
        name = sample.get("dataset")
        if self.datasets.metadataset and name is None:
            name, _, key = key.partition(":")
        elif self.datasets.metadataset and key.startswith(f"{name}:"):
            key = key[len(name) + 1 :]
        if name is None or not self.datasets.metadataset:
            return 0, key
        return (names.index(name), key) if name in names else (-1, key)

    def encoded(self, sample: dict) -> Any | None:
        """The sample encoded as a batch of one, or None when its dataset has no such key."""
        dataset, key = self._entry(sample)
        if dataset < 0:
            return None
        if dataset not in self._indexes:
            self._indexes[dataset] = KeyIndex(self.datasets.entries[dataset].source)
        index = self._indexes[dataset].index(key)
        if index is None:
            return None
        source = self.datasets.entries[dataset].source
        doc = self.encoder.encode_sample(source.load(index, self.encoder.decoder))
        out = self.encoder.encode_batch(self.encoder.batch([doc]))
        return next(out) if inspect.isgenerator(out) else out

    def draw(self, sample: dict) -> tuple[bytes, str, int] | None:
        """``(PNG bytes, decoded text, token count)`` of the sample, None when not found."""
        batch = self.encoded(sample)
        if batch is None:
            return None
        buf = io.BytesIO()
        contact_sheet(self.encoder, [batch], 1).save(buf, format="PNG", optimize=True)
        return buf.getvalue(), doc_texts(self.encoder, batch)[0], int(batch.doc_lengths[0])


# --- the page ------------------------------------------------------------------------------------

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; }
figure.chart svg { max-width: 100%; height: auto; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #ddd; }
.spike { border-top: 2px solid #c33; margin-top: 18px; }
.sample { display: inline-block; vertical-align: top; margin: 6px; max-width: 520px; }
.sample img { max-width: 100%; border: 1px solid #ddd; }
.sample figcaption { font-size: 12px; color: #444; word-break: break-word; }
.note { color: #a40; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else _e(value)


def _sample_caption(sample: dict, text: str | None, tokens: int | None) -> str:
    where = ", ".join(
        f"{name} {_e(sample[name])}"
        for name in ("dataset", "shard", "epoch", "rank")
        if name in sample
    )
    loss = f" — loss <b>{_fmt(sample['loss'])}</b>" if "loss" in sample else ""
    parts = [f"<code>{_e(sample['key'])}</code>{loss}", where]
    if text is not None:
        parts.append(f"{tokens} tokens: “{_e(text[:300])}”")
    return "<br>".join(p for p in parts if p)


def _sample_figure(sample: dict, reader: SampleReader | None) -> str:
    drawn = reader.draw(sample) if reader is not None else None
    if drawn is None:
        missing = (
            "" if reader is None else '<br><span class="note">not found in the datasets</span>'
        )
        return (
            f'<figure class="sample"><figcaption>{_sample_caption(sample, None, None)}'
            f"{missing}</figcaption></figure>"
        )
    png, text, tokens = drawn
    src = "data:image/png;base64," + base64.b64encode(png).decode()
    return (
        f'<figure class="sample"><img alt="{_e(sample["key"])}" src="{src}">'
        f"<figcaption>{_sample_caption(sample, text, tokens)}</figcaption></figure>"
    )


def spike_panel(spike: dict, reader: SampleReader | None) -> str:
    """One spike: its step, loss and z, then its first `MAX_SAMPLES` samples drawn (all
    of them captioned when no ``reader``), highest per-sample loss first, the rest counted."""
    samples = sorted(spike.get("samples", []), key=lambda s: -float(s.get("loss", float("-inf"))))
    shown = samples[:MAX_SAMPLES]
    more = len(samples) - len(shown)
    head = f"Step {_e(spike['step'])}: loss {_fmt(float(spike['loss']))}"
    if spike.get("z") is not None:
        head += f" (z = {_fmt(float(spike['z']))})"
    elif spike.get("kind") == "nan":
        head += " (not a finite loss)"
    body = "".join(_sample_figure(s, reader) for s in shown)
    tail = f"<p>and {more} more samples</p>" if more > 0 else ""
    return f'<section class="spike" id="spike-{_e(spike["step"])}"><h3>{head}</h3>{body}{tail}</section>'


def _shown(folder: Path, base: Path | None) -> str:
    """``folder`` as the page names it: relative to ``base`` (the report's own folder), so that a
    report names no machine's absolute paths; as given when there is no ``base``."""
    return str(folder) if base is None else os.path.relpath(folder.resolve(), base)


def _summary(
    log: RunLog, spikes: list[dict], compare: RunLog | None, base: Path | None = None
) -> str:
    rows = [
        ("run", _shown(log.path.parent, base)),
        ("steps", f"{int(log.steps[0])} … {int(log.steps[-1])} ({len(log.steps)} logged)"),
        ("last loss", _fmt(float(log.loss[-1]))),
        ("spikes", len(spikes)),
    ]
    if compare is not None:
        rows.append(("compared with", _shown(compare.path.parent, base)))
    if log.corrupt:
        rows.append(("corrupt lines skipped", log.corrupt))
    return (
        "<table>"
        + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )


def render_page(
    log: RunLog,
    spikes: list[dict],
    compare: RunLog | None,
    reader: SampleReader | None,
    base: Path | None = None,
) -> str:
    """The report's HTML (see the module doc); ``base``: the folder the page is written to, the
    run folders it names are relative to it."""
    figures = "".join(
        f'<figure class="chart" id="{cid}">{svg}</figure>'
        for cid, svg in charts(log, spikes, compare)
    )
    ordered = list(spikes)  # worst first, as given (the spikes command's order)
    panels = "".join(spike_panel(s, reader) for s in ordered[:MAX_PANELS])
    if len(ordered) > MAX_PANELS:
        rest = ", ".join(_e(s["step"]) for s in ordered[MAX_PANELS:])
        panels += f"<p>Spikes without a panel (lower z): steps {rest}</p>"
    spikes_html = f"<h2>Spikes</h2>{panels}" if spikes else "<h2>Spikes</h2><p>No spikes.</p>"
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>{GENERATOR}"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>Run report: {_e(log.path.parent.name)}</title><style>{STYLE}</style></head><body>"
        f"<h1>Run report: {_e(log.path.parent.name)}</h1>{_summary(log, spikes, compare, base)}"
        f"<h2>Curves</h2>{figures}{spikes_html}</body></html>\n"
    )


#: The mark of a page this module wrote: the only existing file ``report --out`` replaces.
GENERATOR = '<meta name="generator" content="energon-platform report">'


def is_report(path: Path) -> bool:
    """Whether ``path`` is a report this module wrote (its `GENERATOR` mark in the head)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"<!DOCTYPE html>") and GENERATOR.encode() in head


def build_report(
    run_dir: str | Path,
    out_path: str | Path,
    spikes: list[dict] | None = None,
    compare_run: str | Path | None = None,
    config: Any = None,
) -> dict:
    """Write the report of ``run_dir`` to ``out_path`` (one self-contained HTML file; module doc).

    ``spikes``: ``[{"step", "loss", "z", "samples": [{"dataset", "key", "shard", "epoch", "rank",
    "loss"?}]}]``, worst first (``z`` None for a NaN/inf step); ``compare_run``: another run folder
    whose loss is drawn against this one; ``config``: the run config (path, dict or RunConfig) whose
    datasets and encoder draw the spikes' samples (without it, samples are listed by key only).
    `ReportError` for a missing run folder or log, or one with no step. Returns ``{"path", "bytes",
    "steps", "spikes", "corrupt"}``."""
    log = read_run_log(run_dir)
    compare = read_run_log(compare_run) if compare_run is not None else None
    spikes = list(spikes or [])
    reader = SampleReader(config) if config is not None and spikes else None
    out = Path(out_path)
    page = render_page(log, spikes, compare, reader, base=out.parent.resolve())
    with write_atomic(out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return {
        "path": str(out),
        "bytes": out.stat().st_size,
        "steps": len(log.steps),
        "spikes": len(spikes),
        "corrupt": log.corrupt,
    }
