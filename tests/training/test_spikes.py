"""Per-sample losses in the step log and ``energon-platform spikes``: a planted bad step is found,
its samples traced from the config and checkpoints with the planted ones at the top, and turned
into ``loader.exclude`` rules that ``--set loader.exclude=@FILE`` reads."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from energon_platform import cli
from energon_platform.training.model import document_losses
from energon_platform.training.resume_check.comparison import compare
from energon_platform.training.spike_samples import LogRows
from energon_platform.training.spikes import find_spikes, spike_rows
from energon_platform.training.step_log_readers import JsonLines
from energon_platform.training.step_log_writer import StepLog
from scripts.planted_spike import PLANTED_STEP

# --- per-sample losses -------------------------------------------------------------------------


def test_document_losses_are_each_documents_mean_over_its_own_targets():
    # row 0 packs two documents (positions restart at 0), row 1 holds one and padding
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]])
    loss_mask = torch.tensor([[1.0, 1, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    per_token = torch.tensor([[1.0, 3, 0, 10, 20, 0], [2, 4, 6, 0, 0, 0]]).flatten()
    got = document_losses(per_token, loss_mask, position_ids, torch.tensor([2, 1]))
    assert got.tolist() == [2.0, 15.0, 4.0]
    no_targets = document_losses(
        torch.zeros(3), torch.zeros(1, 3), torch.tensor([[0, 1, 2]]), torch.tensor([1])
    )
    assert math.isnan(no_targets.item())


def test_step_log_writes_sample_losses_aligned_with_keys(tmp_path):
    with StepLog(tmp_path / "steps.jsonl", rank=0) as log:
        log.write(1, 2.5, keys=["a", "b"], sample_losses=torch.tensor([1.0, float("nan")]))
    row = json.loads((tmp_path / "steps.jsonl").read_text())
    assert row["sample_losses"][0] == 1.0 and math.isnan(row["sample_losses"][1])


@pytest.mark.parametrize(
    "keys,losses,said",
    [
        (["a", "b"], [1.0], "1 sample_losses for 2 keys"),
        (None, [1.0], "needs keys"),
        (["a"], [float("inf")], "key 'a' is inf"),
        (["a"], ["1.0"], "key 'a' is '1.0'"),
        (["a"], [True], "key 'a' is True"),
    ],
)
def test_step_log_refuses_sample_losses_that_do_not_fit_the_keys(tmp_path, keys, losses, said):
    with pytest.raises(ValueError, match=said):
        StepLog(tmp_path / "steps.jsonl", rank=0).write(1, 2.5, keys=keys, sample_losses=losses)
    assert not (tmp_path / "steps.jsonl").exists()


def test_check_resume_comparison_ignores_sample_losses():
    straight = {s: {"step": s, "loss": 1.0, "keys": ["a"], "sample_losses": [1.0]} for s in (1, 2)}
    resumed = {s: {**row, "sample_losses": [1.5]} for s, row in straight.items()}
    assert compare(straight, resumed, 1, 2, 0.0)["passed"]


# --- find_spikes and the log rows --------------------------------------------------------------


def steady(steps, spikes=(), nans=()):
    """Rows of a loss wobbling in [4.9, 5.1], +10 at ``spikes``, NaN at ``nans``."""
    for s in range(1, steps + 1):
        loss = 5 + 0.1 * math.sin(0.7 * s) + (10 if s in spikes else 0)
        yield {"step": s, "loss": float("nan") if s in nans else loss}


def test_find_spikes_flags_rises_and_non_finite_losses_not_the_wobble():
    stretch = set(range(40, 56))  # longer than half the window
    found = list(find_spikes(steady(300, spikes=stretch | {200}, nans={100}), z=4, window=20))
    # spikes do not enter the window: a long bad stretch is flagged to its end
    assert [(s["step"], s["kind"]) for s in found] == [
        *((s, "z") for s in sorted(stretch)),
        (100, "nan"),
        (200, "z"),
    ]
    assert found[0]["median"] == pytest.approx(5, abs=0.1) and found[0]["z"] > 4
    worst = spike_rows(found, top=2)
    assert worst[0]["step"] == 100 and len(worst) == 2 and worst[1]["z"] >= found[-1]["z"]


def test_a_short_log_is_scored_from_its_tenth_step_with_the_default_window():
    """The default window (50) needs only `MIN_HISTORY` (10) losses before a step: a 16-step run
    (the demo's) has its spike at step 12 found."""
    assert [s["step"] for s in find_spikes(steady(16, spikes={12}))] == [12]
    assert [s["step"] for s in find_spikes(steady(16, spikes={10}))] == []  # 9 losses before it


def test_find_spikes_scores_nothing_before_it_has_history():
    assert list(find_spikes(steady(9, spikes={5}), window=50)) == []
    with pytest.raises(ValueError, match="--window 0"):
        list(find_spikes(steady(3), window=0))


def test_log_rows_keep_the_last_logging_of_each_step_and_count_corrupt_lines(tmp_path):
    log = tmp_path / "log.jsonl"
    rows = [{"step": s, "loss": 1.0} for s in (1, 2, 3, 4)]
    rows += [{"step": s, "loss": 2.0} for s in (3, 4, 5)]  # resumed from step 2
    lines = [json.dumps(r) for r in rows]
    lines.insert(3, "{not json")
    log.write_text("\n".join(lines) + '\n{"step": 6, "lo')
    read = LogRows(log, JsonLines())
    assert [(r["step"], r["loss"]) for r in read] == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]
    assert read.skipped == 1


def test_a_million_step_log_is_scanned_in_one_streaming_pass(tmp_path):
    log = tmp_path / "log.jsonl"
    bad = set(range(25_000, 1_000_000, 50_000))
    with open(log, "w") as f:
        f.writelines(
            f'{{"step": {r["step"]}, "loss": {r["loss"]!r}}}\n'
            for r in steady(1_000_000, spikes=bad)
        )
    assert [s["step"] for s in find_spikes(LogRows(log, JsonLines()))] == sorted(bad)


# --- the command on a run with a planted bad step ----------------------------------------------


@pytest.fixture
def run(spike_run):
    """The session's run with a planted bad step (``spike_run`` in tests/conftest.py)."""
    return spike_run


def spikes(capsys, run, *args):
    """``(status, stdout, stderr)`` of ``energon-platform spikes`` on ``run``."""
    argv = ["spikes", "--run", str(run["out"]), "--config", str(run["config"]), "--window", "10"]
    status = cli.main([*argv, *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def test_trainer_logs_one_sample_loss_per_key(run):
    rows = [json.loads(line) for line in (run["out"] / "log.jsonl").read_text().splitlines()]
    assert all(len(r["sample_losses"]) == len(r["keys"]) == 8 for r in rows)
    planted = rows[PLANTED_STEP - 1]
    losses = dict(zip(planted["keys"], planted["sample_losses"]))
    assert min(losses[k] for k in run["planted"]) > 3 * max(
        v for k, v in losses.items() if k not in run["planted"]
    )


def test_spikes_finds_the_planted_step_and_names_its_samples_at_the_top(run, capsys):
    status, out, err = spikes(capsys, run, "--json")
    assert status == 0 and "warning" not in err
    found = [json.loads(line) for line in out.splitlines()]
    assert [s["step"] for s in found] == [PLANTED_STEP]
    spike = found[0]
    assert spike["keys_agree"] is True and spike["kind"] == "z" and spike["z"] >= 4
    top = spike["samples"][:2]
    assert {s["key"] for s in top} == set(run["planted"])
    assert [s["loss_rank"] for s in top] == [1, 2]
    assert {"dataset", "shard", "epoch", "rank", "loss"} <= set(top[0])
    status, text, _ = spikes(capsys, run, "--top", "2")
    assert text.splitlines()[0].startswith(f"step {PLANTED_STEP}  loss ")
    assert all(k in text for k in run["planted"]) and len(text.splitlines()) == 4


def test_exclude_from_prints_rules_that_set_at_file_applies(run, capsys, tmp_path):
    status, out, _ = spikes(capsys, run, "--exclude-from", PLANTED_STEP, "--top", "2")
    rules = yaml.safe_load(out)
    assert status == 0
    assert rules == [{"step": PLANTED_STEP - 1, "keys": run["planted"]}]
    (tmp_path / "rules.yaml").write_text(out)
    status = cli.main(
        [
            "trace",
            "--config",
            str(run["config"]),
            "--step",
            str(PLANTED_STEP),
            "--json",
            "--set",
            f"loader.exclude=@{tmp_path / 'rules.yaml'}",
        ]
    )
    traced = json.loads(capsys.readouterr().out)
    assert status == 0
    assert sorted(x["key"] for x in traced["excluded"]) == sorted(run["planted"])


def test_spikes_warns_when_the_logs_keys_are_not_traces(run, capsys, tmp_path):
    rows = [json.loads(line) for line in (run["out"] / "log.jsonl").read_text().splitlines()]
    rows[PLANTED_STEP - 1]["keys"][0] = "not-a-key-of-this-step"
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    status, out, err = spikes(capsys, run, "--log", log, "--json")
    assert status == 0
    assert f"step {PLANTED_STEP}: the log's keys are not the ones trace computes" in err
    listing = json.loads(out)
    assert listing["keys_agree"] is False and "loss" not in listing["samples"][0]


@pytest.mark.parametrize(
    "case,said",
    [
        ("no log", "no step log there; pass --log FILE"),
        (
            "no config",
            "records no config (no run.yaml: a run of an earlier version); pass --config",
        ),
        ("no checkpoints", "the run has no checkpoint yet"),
        ("step beyond the log", "--exclude-from 99: "),
        ("unreadable @file", "--set loader.seed=@"),
    ],
)
def test_spikes_refuses_bad_inputs_in_one_line(run, capsys, tmp_path, case, said):
    argv = ["spikes", "--run", str(run["out"]), "--config", str(run["config"])]
    if case == "no log":
        argv[2] = str(tmp_path)
    elif case == "no config":  # a run folder without its record, and no --config
        (tmp_path / "log.jsonl").write_bytes((run["out"] / "log.jsonl").read_bytes())
        argv = ["spikes", "--run", str(tmp_path)]
    elif case == "no checkpoints":
        (tmp_path / "log.jsonl").write_bytes((run["out"] / "log.jsonl").read_bytes())
        argv[2] = str(tmp_path)
    elif case == "step beyond the log":
        argv += ["--exclude-from", "99"]
    else:
        argv += ["--set", f"loader.seed=@{tmp_path / 'missing.yaml'}"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


def test_spikes_counts_corrupt_lines_it_skipped(run, capsys, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text((run["out"] / "log.jsonl").read_text() + "{torn\n")
    status, out, err = spikes(capsys, run, "--log", log)
    assert status == 0 and "1 spike(s)" in out
    assert f"skipped 1 line(s) of {log} that are no step" in err


def test_a_flat_loss_scores_a_rise_with_a_finite_z():
    """A window whose MAD is 0 scored any rise at z inf; it is scored against 0.1% of its median."""
    rows = [{"step": s, "loss": 2.0} for s in range(1, 21)]
    rows += [{"step": 21, "loss": 2.02}, {"step": 22, "loss": 2.0001}]
    (found,) = find_spikes(rows, z=4, window=20)
    assert found["step"] == 21 and found["z"] == pytest.approx(10.0)


def test_log_rows_take_a_step_logged_again_at_a_resume_once_the_later(tmp_path):
    """A run logged 1-5 and resumed at 5 (its checkpoint was of step 4) logs step 5 twice: it is
    one row, the later one (a restart is a step at or below the one before)."""
    log = tmp_path / "log.jsonl"
    rows = [{"step": s, "loss": 1.0} for s in (1, 2, 3, 4, 5)] + [
        {"step": s, "loss": 2.0} for s in (5, 6)
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [(r["step"], r["loss"]) for r in LogRows(log, JsonLines())] == [
        (1, 1.0),
        (2, 1.0),
        (3, 1.0),
        (4, 1.0),
        (5, 2.0),
        (6, 2.0),
    ]


def test_spikes_says_that_top_is_not_the_worst_without_sample_losses(run, capsys, tmp_path):
    """S1: without sample_losses, --top N lists the first N samples; a note says they are not the
    step's worst."""
    rows = [json.loads(line) for line in (run["out"] / "log.jsonl").read_text().splitlines()]
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            json.dumps({k: v for k, v in r.items() if k != "sample_losses"}) + "\n" for r in rows
        )
    )
    status, out, err = spikes(capsys, run, "--log", log, "--top", "2")
    assert status == 0 and f"step {PLANTED_STEP}" in out
    assert err.count("logs no sample_losses: --top 2 lists each spike's first 2 samples") == 1
    status, out, err = spikes(capsys, run, "--top", "2")
    assert status == 0 and "sample_losses" not in err


@pytest.mark.parametrize(
    "content, fmt",
    [
        (b"", "jsonl"),
        (b"{torn\nnot json\n", "jsonl"),
        (bytes(range(256)) * 4 + b"\n", "jsonl"),
        (None, "megatron"),  # the run's own jsonl log read as another format
    ],
)
def test_spikes_refuses_a_log_without_step_rows_as_report_does(run, capsys, tmp_path, content, fmt):
    """S2: it said '0 spike(s)', exit 0, where report refuses the same log."""
    log = tmp_path / "log.jsonl"
    log.write_bytes((run["out"] / "log.jsonl").read_bytes() if content is None else content)
    status, out, err = spikes(capsys, run, "--log", log, "--log-format", fmt)
    assert status == 2 and "spike(s)" not in out
    assert f"{log}: no step rows" in err and len(err.strip().splitlines()) == 1, err
