"""``check-resume --cmd`` on any training command: the step log helper, the log readers,
argument errors, and the README's worked examples, each passing on a correct loop and failing on
one that skips restoring the loader."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from energon_platform import cli
from energon_platform.training.resume_check import CommandSpec, LogTail, check_resume_cmd, verdict
from energon_platform.training.step_log_readers import (
    JsonLines,
    MegatronLog,
    RegexLog,
    TorchtitanLog,
    read_steps,
    sample_line,
)
from energon_platform.training.step_log_writer import StepLog, batch_digest
from scripts.bench.data import coco_dataset
from tests.helpers import REPO
from tests.helpers import run_configs as configs
from tests.helpers.cli import run_cli, run_python
from tests.helpers.trainer_examples import assert_sample_losses_fit, example

PY = shlex.quote(sys.executable)


# ---------------------------------------------------------------- the log readers and StepLog


@pytest.mark.parametrize(
    "reader,step,loss",
    [
        (JsonLines(), 17, 7.633512),
        (MegatronLog(), 17, 7.633512),
        (TorchtitanLog(), 17, 7.63351),
        (RegexLog(r"iter (?P<step>\d+): loss (?P<loss>[-+.\deE]+|nan)"), 17, 7.6335),
    ],
    ids=["jsonl", "megatron", "torchtitan", "regex"],
)
def test_each_reader_parses_the_sample_line_of_its_docstring(reader, step, loss):
    line = (
        sample_line(reader)
        if not isinstance(reader, RegexLog)
        else "iter 17: loss 7.6335, time 812.30ms, mfu 1.20%"
    )
    row = reader.parse_line(line)
    assert row["step"] == step and row["loss"] == pytest.approx(loss)
    assert reader.parse_line("loading checkpoint from iter_0000010 ...") is None


def test_readers_ignore_what_is_not_a_training_step():
    titan = TorchtitanLog()
    assert (
        titan.parse_line("[titan] x - root - INFO - validate step: 10  loss: 7.1000  memory: 1GiB")
        is None
    )
    colored = "[rank0]:[titan] t - root - INFO - \x1b[31mstep:  3  \x1b[32mloss:  6.50000  \x1b[39m"
    assert titan.parse_line(colored) == {"step": 3, "loss": 6.5}
    megatron = MegatronLog()
    assert (
        megatron.parse_line(
            " [t] iteration        3/      10 | consumed samples: 12 | lm loss: NAN |"
        )["loss"]
        != 0
    )
    assert (
        megatron.parse_line(
            " [t] iteration        3/      10 | consumed samples: 12 | loss scale: 1.0 |"
        )
        is None
    )
    assert (
        JsonLines().parse_line('{"step": 3, "los') is None
        and JsonLines().parse_line('{"step": "3", "loss": 1}') is None
    )


def test_step_log_rank_zero_only_fsynced_rows_and_torn_line_cut(tmp_path):
    import torch

    path = tmp_path / "steps.jsonl"
    StepLog(path, rank=1).write(1, 9.0)
    assert not path.exists()  # other ranks write nothing
    with StepLog(path, rank=0) as log:
        log.write(
            1,
            torch.tensor(2.5),
            keys=["a", "b"],
            batch={"tokens": torch.arange(4), "images": torch.ones(1, 2)},
        )
        log.write(2, 2.25, resumed_from=0)
    # a kill in the middle of a line
    path.write_bytes(path.read_bytes() + b'{"step": 3, "loss": 2.')
    assert sorted(read_steps(path, JsonLines())) == [1, 2]  # the torn line is no step
    with StepLog(path) as log:
        log.write(3, 2.0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert (
        [r["step"] for r in rows] == [1, 2, 3]
        and rows[0]["keys"] == ["a", "b"]
        and rows[1]["resumed_from"] == 0
    )
    assert rows[0]["batch_sha256"] == batch_digest(
        {"images": torch.ones(1, 2), "tokens": torch.arange(4)}
    )
    with pytest.raises(ValueError, match="step must be an integer"):
        StepLog(path).write(2.0, 1.0)


def test_batch_digest_sees_values_shapes_and_dtypes():
    import torch

    t = torch.arange(6)
    digests = {
        batch_digest(x)
        for x in (t, t.reshape(2, 3), t.float(), t + 1, [t], (t,), [batch_digest(t)])
    }
    assert len(digests) == 6  # a list and a tuple of the same tensors are the same batch
    assert batch_digest(t.reshape(3, 2).t()) == batch_digest(t.reshape(3, 2).t().contiguous())
    with pytest.raises(TypeError, match="cannot digest"):
        batch_digest(object())


def test_log_tail_reads_only_new_complete_lines(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text(" [t] iteration 1/ 9 | lm loss: 1.0 |\n")
    tail = LogTail(path, MegatronLog())
    assert tail.steps() == set()  # what was there before is not the new run's
    with open(path, "a") as f:
        f.write(" [t] iteration 2/ 9 | lm loss: 1.0 |\n [t] iteration 3/ 9 | lm lo")
    assert tail.steps() == {2}
    with open(path, "a") as f:
        f.write("ss: 1.0 |\n")
    assert tail.steps() == {2, 3}


def test_the_check_resume_process_starts_without_importing_torch():
    """check-resume runs in the suite and in users' jobs around every trainer it checks: its own
    process reads logs and checkpoint metadata only, so it must not pay torch's import (about
    1.5 s of CPU) at each start (the checkpoint module imports torch where it loads tensors)."""
    code = (
        "import sys; import energon_platform.training.resume_check\n"
        "from energon_platform.cli import main\n"
        "status = main(['check-resume', '--steps', '6', '--kill-at', '4'])\n"
        "print(status, 'torch' in sys.modules)"
    )
    r = run_python(code)
    # the whole command: its argument check, and main()'s own imports (the errors it catches)
    assert r.stdout.strip() == "2 False", r.stdout + r.stderr


# ---------------------------------------------------------------- argument errors: one line, exit 2


def main_error(capsys, *argv) -> str:
    assert cli.main(list(map(str, argv))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("energon-platform check-resume: error: "), err
    return err[0]


GOOD = [
    "--cmd",
    "train --out {out}",
    "--resume-cmd",
    "train --out {out} --resume",
    "--steps",
    6,
    "--kill-at",
    4,
]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--steps", 6, "--kill-at", 4], "give --config FILE"),
        (
            ["--cmd", "train --out {out}", "--steps", 6, "--kill-at", 4],
            "--cmd and --resume-cmd go together",
        ),
        (
            ["--resume-cmd", "train --out {out}", "--steps", 6, "--kill-at", 4],
            "--cmd and --resume-cmd go together",
        ),
        (GOOD + ["--config", "run.yaml"], "two forms of the check"),
        (
            [
                "--cmd",
                "train",
                "--resume-cmd",
                "train --resume --out {out}",
                "--steps",
                6,
                "--kill-at",
                4,
            ],
            "--cmd must contain {out}",
        ),
        (
            [
                "--cmd",
                "train --out {out}",
                "--resume-cmd",
                "train --resume",
                "--steps",
                6,
                "--kill-at",
                4,
            ],
            "--resume-cmd must contain {out}",
        ),
        (GOOD + ["--log", "steps.jsonl"], "--log must contain {out}"),
        (GOOD + ["--log-format", "regex"], "needs --regex"),
        (GOOD + ["--log-format", "regex", "--regex", r"step (?P<step>\d+)"], "missing loss"),
        (GOOD + ["--log-format", "regex", "--regex", "(?P<step>"], "not a regular expression"),
        (
            GOOD + ["--log-format", "megatron", "--regex", "x"],
            "--regex goes with --log-format regex",
        ),
        (GOOD + ["--nproc", 2], "--nproc goes with --config"),
        (GOOD + ["--set", "loader.seed=1"], "--set goes with --config"),
        (GOOD[:-1] + [7], "--kill-at must be between 2 and --steps (6)"),
        (
            ["--config", "run.yaml", "--log-format", "megatron", "--steps", 6, "--kill-at", 4],
            "--log-format goes with --cmd",
        ),
    ],
    ids=[
        "no-form",
        "no-resume-cmd",
        "no-cmd",
        "both-forms",
        "cmd-without-out",
        "resume-without-out",
        "log-without-out",
        "regex-missing",
        "regex-groups",
        "regex-syntax",
        "regex-wrong-format",
        "nproc",
        "set",
        "kill-at",
        "log-format-with-config",
    ],
)
def test_argument_errors_are_one_line_and_exit_2(capsys, tmp_path, argv, needle):
    line = main_error(capsys, "check-resume", "--out", tmp_path / "check", *argv)
    assert needle in line, line
    assert not (tmp_path / "check").exists()  # nothing ran


# ---------------------------------------------------------------- the machinery, on a fake trainer

FAKE = textwrap.dedent("""
    # a stand-in trainer without torch: 'loss' and 'batch' are functions of the step
    import sys, time
    from pathlib import Path
    from energon_platform.training.step_log_writer import StepLog
    out, steps, resume = Path(sys.argv[1]), int(sys.argv[2]), "--resume" in sys.argv
    start = int((out / "ckpt").read_text()) if resume and (out / "ckpt").exists() else 0
    if "--resume-elsewhere" in sys.argv:  # reads a checkpoint no killed run wrote
        start = steps - 1
    log = StepLog(out / "steps.jsonl")
    for step in range(start + 1, steps + 1):
        time.sleep(0.05)
        if step % 2 == 0:  # the checkpoint of a step is complete before the step is logged
            (out / "ckpt.tmp").write_text(str(step))
            (out / "ckpt.tmp").replace(out / "ckpt")
        extra = {"resumed_from": start} if step == start + 1 and resume else {}
        log.write(step, 1.0 / step, keys=[f"k{step}"], batch=f"b{step}", **extra)
        print(f"iter {step}: loss {1.0 / step:.6f}", flush=True)
""")


@pytest.fixture
def fake(tmp_path) -> str:
    path = tmp_path / "fake_trainer.py"
    path.write_text(FAKE)
    return f"{PY} {shlex.quote(str(path))} {{out}} 10"


def test_fake_trainer_passes_exactly_and_writes_report_and_plot(fake, tmp_path):
    result = check_resume_cmd(
        CommandSpec(fake, fake + " --resume", 10), 7, tmp_path / "check", log=lambda *_: None
    )
    assert result["passed"] and result["mode"] == "exact" and result["tolerance"] == 0.0, verdict(
        result
    )
    assert (
        result["resume_step"] == 6
        and result["steps_compared"] == 4
        and result["resumed_from_logged"] == 6
    )
    assert result["kill_landed_mid_step"] and result["killed_after_logged_step"] == 6
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert report["passed"] and report["commands"]["straight"] != report["commands"]["killed"]
    assert (tmp_path / "check" / "loss.png").stat().st_size > 10_000
    result = check_resume_cmd(
        CommandSpec(
            fake,
            fake + " --resume",
            10,
            log_format="regex",
            regex=r"iter (?P<step>\d+): loss (?P<loss>\S+)",
        ),
        7,
        tmp_path / "check",
        log=lambda *_: None,
    )
    assert result["passed"] and result["mode"] == "loss" and result["tolerance"] == 0.01, verdict(
        result
    )


def test_a_reused_uninterrupted_run_is_compared_with_and_not_run_again(fake, tmp_path):
    quiet = {"log": lambda *_: None}
    first = check_resume_cmd(CommandSpec(fake, fake + " --resume", 10), 7, tmp_path / "a", **quiet)
    straight = tmp_path / "a" / "straight" / "out" / "steps.jsonl"
    mtime = straight.stat().st_mtime_ns
    broken = CommandSpec(fake, fake, 10)  # starts over: must fail against the reused run
    again = check_resume_cmd(broken, 7, tmp_path / "b", straight_from=tmp_path / "a", **quiet)
    assert first["passed"] and not again["passed"], verdict(again)
    assert again["straight_from"] == str(tmp_path / "a") and again["resumed_steps_logged"] == 10
    assert again["commands"]["straight"] == first["commands"]["straight"]
    assert straight.stat().st_mtime_ns == mtime  # the earlier run was only read
    assert not any((tmp_path / "b" / "straight" / "out").iterdir())  # and no new one ran
    ok = check_resume_cmd(
        CommandSpec(fake, fake + " --resume", 10),
        5,
        tmp_path / "c",
        straight_from=tmp_path / "a",
        **quiet,
    )
    assert ok["passed"] and ok["resume_step"] == 4, verdict(ok)


def test_a_moved_earlier_check_is_reused_and_space_around_the_command_does_not_count(
    fake, tmp_path
):
    """M7: a check folder moved elsewhere was refused as "another command" (its recorded command
    held the old folder), and so was a --cmd with a trailing space."""
    quiet = {"log": lambda *_: None}
    check_resume_cmd(CommandSpec(fake, fake + " --resume", 10), 7, tmp_path / "a", **quiet)
    (tmp_path / "a").rename(tmp_path / "moved")
    again = check_resume_cmd(
        CommandSpec(fake + " ", fake + " --resume", 10),
        7,
        tmp_path / "b",
        straight_from=tmp_path / "moved",
        **quiet,
    )
    assert again["passed"] and again["straight_from"] == str(tmp_path / "moved"), verdict(again)


@pytest.mark.parametrize(
    "earlier, spec, needle",
    [
        ("b", ("{fake}", 10), "no readable report.json"),
        ("a", ("{fake} --other", 10), "its uninterrupted run ran another command"),
        ("a", ("{fake}", 12), "logged steps up to 10; --steps 12 compares up to step 12"),
        ("c", ("{fake}", 10), "that is --out itself"),
    ],
    ids=["no-report", "another-command", "too-few-steps", "the-out-itself"],
)
def test_a_straight_run_that_cannot_be_reused_is_refused_in_one_line(
    fake, tmp_path, earlier, spec, needle
):
    check_resume_cmd(CommandSpec(fake, fake + " --resume", 10), 7, tmp_path / "a", log=print)
    (tmp_path / "b").mkdir()
    if earlier == "c":
        (tmp_path / "c").mkdir()
    cmd, steps = spec[0].format(fake=fake), spec[1]
    r = run_cli(
        "check-resume", "--cmd", cmd, "--resume-cmd", cmd + " --resume", "--steps", steps,
        "--kill-at", 7, "--out", tmp_path / "c", "--straight-from", tmp_path / earlier,
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize(
    "resume,needle",
    [
        ("", "it restored nothing (if the trainer had saved no checkpoint by step"),
        (" --resume --resume-elsewhere", "which the killed run never logged"),
    ],
    ids=["started-over", "another-runs-checkpoint"],
)
def test_a_resume_that_did_not_continue_the_killed_run_fails(fake, tmp_path, resume, needle):
    result = check_resume_cmd(
        CommandSpec(fake, fake + resume, 10), 7, tmp_path / "check", log=lambda *_: None
    )
    assert not result["passed"] and needle in verdict(result), verdict(result)


def test_a_log_without_steps_is_reported_with_the_expected_line(fake, tmp_path):
    r = run_cli(
        "check-resume",
        "--cmd",
        fake,
        "--resume-cmd",
        fake + " --resume",
        "--steps",
        "10",
        "--kill-at",
        "7",
        "--log-format",
        "megatron",
        "--out",
        tmp_path / "check",
        timeout=300,
    )
    assert r.returncode == 1 and "logged no step that --log-format megatron recognises" in r.stderr
    assert "iteration       17/      30 |" in r.stderr  # the sample line shows what was expected


# ---------------------------------------------------------------- the README's worked examples


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    data = coco_dataset(tmp_path_factory.getbasetemp())
    path = tmp_path_factory.mktemp("cmd-cfg") / "run.yaml"
    return configs.write_config(path, configs.run_config(data, train={"steps": 8}))


def check(tmp_path, *args, name: str = "check"):
    r = run_cli("check-resume", "--out", tmp_path / name, *args, timeout=600, cwd=REPO)
    path = tmp_path / name / "report.json"
    assert path.exists(), (
        f"check-resume exited {r.returncode} without a report:\n{r.stdout}\n{r.stderr[-4000:]}"
    )
    return r, json.loads(path.read_text())


@pytest.mark.slow
def test_example_our_trainer_config_form(config_file, tmp_path):
    r, report = check(tmp_path, "--config", config_file, "--steps", 6, "--kill-at", 5)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr[-3000:]
    assert (
        report["keys_identical"]
        and report["tensors_identical"]
        and report["max_abs_loss_diff"] == 0.0
    )


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["jsonl", "torchtitan"])
def test_example_torchtitan_style_loop(config_file, tmp_path, fmt):
    """DCP checkpoints of model, optimizer and loader; exact through StepLog (two ranks), by the loss
    through torchtitan's own lines; the loop that skips restoring the loader fails either way."""
    nproc = 2 if fmt == "jsonl" else 1
    cmd = example("torchtitan_style_loop.py", config_file, "--out {out} --steps 8", nproc=nproc)
    r, report = check(
        tmp_path,
        "--cmd",
        cmd,
        "--resume-cmd",
        cmd + " --resume",
        "--steps",
        8,
        "--kill-at",
        6,
        "--log-format",
        fmt,
    )
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr[-3000:]
    assert report["mode"] == ("exact" if fmt == "jsonl" else "loss") and report["restored"]
    # killed once step 5 is logged: the loop may still complete step 6's checkpoint before it dies
    assert report["resume_step"] in (4, 5, 6)
    assert report["steps_compared"] == 8 - report["resume_step"]
    if fmt == "jsonl":
        assert (
            report["keys_identical"]
            and report["tensors_identical"]
            and report["max_abs_loss_diff"] == 0.0
        )
        assert report["resumed_from_logged"] == report["resume_step"]
        # the loss: the mean over the 2 ranks of each one's token mean over its half
        assert_sample_losses_fit(report["logs"]["straight"], config_file, group=2)
    r, report = check(
        tmp_path,
        "--cmd",
        cmd,
        "--resume-cmd",
        cmd + " --resume --skip-loader-restore",
        "--steps",
        8,
        "--kill-at",
        6,
        "--log-format",
        fmt,
        "--straight-from",
        tmp_path / "check",
        name="broken",
    )
    assert r.returncode == 1 and "FAIL" in r.stdout and not report["passed"], (
        r.stdout + r.stderr[-3000:]
    )
    if fmt == "jsonl":
        assert report["keys_identical"] is False and report["tensors_identical"] is False
    else:
        assert report["max_abs_loss_diff"] > 0.01


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["megatron", "regex"])
def test_example_megatron_style_loop(config_file, tmp_path, fmt):
    """Our Megatron provider driven as Megatron-LM does; its iteration lines read as Megatron's
    (or with a user regex); the loop that skips restoring the data loader fails."""
    cmd = example("megatron_style_loop.py", config_file, "--save {out} --train-iters 12")
    form = (
        ["--log-format", "megatron"]
        if fmt == "megatron"
        else [
            "--log-format",
            "regex",
            "--regex",
            r"iteration +(?P<step>\d+)/.*\| lm loss: (?P<loss>\S+) \|",
        ]
    )
    r, report = check(
        tmp_path,
        "--cmd",
        cmd,
        "--resume-cmd",
        cmd + " --load {out}",
        "--steps",
        12,
        "--kill-at",
        6,
        *form,
    )
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr[-3000:]
    assert (
        report["mode"] == "loss"
        and report["tolerance"] == 0.01
        and report["max_abs_loss_diff"] < 1e-6
    )
    # an iteration takes milliseconds here: the kill lands in step 6 or a little later
    assert (
        report["restored"] and report["resume_step"] % 2 == 0 and 4 <= report["resume_step"] <= 10
    )
    assert report["steps_compared"] == 12 - report["resume_step"]
    # Megatron's layout, in the run's {out}
    assert sorted((tmp_path / "check" / "killed" / "out").glob("iter_*"))
    assert_sample_losses_fit(tmp_path / "check" / "straight" / "out" / "steps.jsonl", config_file)
    r, report = check(
        tmp_path,
        "--cmd",
        cmd,
        "--resume-cmd",
        cmd + " --load {out} --skip-loader-restore",
        "--steps",
        12,
        "--kill-at",
        6,
        *form,
        "--straight-from",
        tmp_path / "check",
        name="broken",
    )
    assert r.returncode == 1 and "FAIL" in r.stdout and report["max_abs_loss_diff"] > 0.01, (
        r.stdout + r.stderr[-3000:]
    )
