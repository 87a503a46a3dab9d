"""``energon-platform check-resume``: does a killed-and-resumed run train exactly like one that
never stopped?

Runs the trainer twice as separate processes (``torchrun`` when ``--nproc > 1``): once straight
through, once killed with SIGKILL while step K is in progress (after step K-1 was logged, before
step K is) and resumed from its latest checkpoint, optionally with another number of ranks or
workers. Compares every step after the resume point: the global batch's sample keys, the sha256
of its tensors, and the loss. Writes ``OUT/report.json`` and ``OUT/loss.png``; the verdict fails
on any difference of keys or tensors, on a loss difference above ``tolerance`` (0 by default:
on CPU, same layout, the loss must be bit-identical), on a missing step, and when the resumed
process did not really continue from the checkpoint: nothing was restored (no checkpoint was
complete at the kill: ``"restored": false``), or it logged steps before the resume point (it
restarted from step 0, which on a deterministic run would otherwise pass unnoticed).

`check_resume_cmd` runs the same check on any training command (``check-resume --cmd``):
``{out}`` in the commands becomes a folder per run (an absolute path, quoted for the shell where
the placeholder stands: bare, in ``'...'`` or in ``"..."``), steps are read from the run's log in
one of the formats of `energon_platform.training.step_log_readers`, counted from 1, or from 0
when the uninterrupted run's first logged step is 0 (then ``--steps N`` are steps 0..N-1). The resume
point is where the resumed command's log starts: it must be after the first step, right after a
step the killed run logged or earlier, and match the ``resumed_from`` the log states, if it
states one (the steps done before its first row: that row's step, less 1 in a log counted from
1). The verdict is
exact (keys, batch digests, loss with tolerance 0) when every compared row carries ``keys`` and
``batch_sha256``, and by the loss alone (|Δloss| <= 0.01, the seed's criterion) otherwise.

Both forms write only into an ``--out`` that is new, empty, or one an earlier check made
(`claim_out`); anything else in it is
refused before a run starts.

The package, one module per job (import the names below from the package itself):

* `trainer`: the check on the reference trainer.
* `command`: the check on any training command.
* `processes`: starting, running and killing runs.
* `trainer_log`: reading the reference trainer's log.
* `out_folder`: claiming ``--out``, writing the report.
* `comparison`: comparing the runs' steps.
* `plot`: ``loss.png``.
* `verdict`: the verdict line.
* `options`: the rules of the command's options.
"""

from __future__ import annotations

from energon_platform.training.resume_check.command import (
    SEED_TOLERANCE,
    CommandSpec,
    check_resume_cmd,
)
from energon_platform.training.resume_check.comparison import balance_summary, compare
from energon_platform.training.resume_check.plot import plot
from energon_platform.training.resume_check.processes import (
    LogTail,
    RunFailed,
    kill_tree,
    kill_when,
    launch,
    run_command,
)
from energon_platform.training.resume_check.trainer import (
    RunSpec,
    check_resume,
    run_killed,
    trainer_command,
)
from energon_platform.training.resume_check.trainer_log import count_lines, read_log
from energon_platform.training.resume_check.verdict import verdict

__all__ = [
    "RunSpec",
    "check_resume",
    "CommandSpec",
    "check_resume_cmd",
    "SEED_TOLERANCE",
    "RunFailed",
    "verdict",
    "compare",
    "balance_summary",
    "plot",
    "read_log",
    "count_lines",
    "trainer_command",
    "run_killed",
    "run_command",
    "launch",
    "kill_tree",
    "kill_when",
    "LogTail",
]
