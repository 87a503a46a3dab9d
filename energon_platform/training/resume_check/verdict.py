"""The one-paragraph verdict ``check-resume`` prints from a report."""

from __future__ import annotations


def _judged(result: dict) -> str:
    if result.get("mode") == "loss":
        return (
            f"max |Δloss|={result['max_abs_loss_diff']:.3g} (tolerance {result['tolerance']:g}; the log carries "
            f"no keys and batch digests, so the loss alone is judged)"
        )
    return (
        f"keys identical={result['keys_identical']}, tensors identical={result['tensors_identical']}, "
        f"max |Δloss|={result['max_abs_loss_diff']:.3g} (tolerance {result['tolerance']:g})"
    )


def verdict(result: dict) -> str:
    head = "PASS" if result["passed"] else "FAIL"
    base = result.get("first_step", 1)
    text = (
        f"{head}: {result['steps_compared']} steps compared after resuming from step {result['resume_step']} "
        f"(killed during step {result['kill_at']}{'; the log counts steps from 0' if base == 0 else ''}): "
        f"{_judged(result)}"
    )
    if result["missing_steps"]:
        sides = {r["missing"] for r in result["rows"] if "missing" in r}
        text += (
            f"; steps {result['missing_steps'][:3]}{'...' if len(result['missing_steps']) > 3 else ''} missing "
            f"from the {' and '.join(sorted(sides))} run's log"
        )
    if result["resumed_steps_before_resume_point"]:
        text += (
            f"; the resumed run logged steps {result['resumed_steps_before_resume_point'][:3]}... before the "
            f"resume point: it started over instead of continuing"
        )
    if result.get("form") == "cmd" and not result["restored"]:
        if not result["resumed_steps_logged"]:
            text += "; the resume command logged no step"
        elif result["resume_step"] <= 0:
            text += (
                f"; the resume command started again from step {result.get('first_resumed_step', base)}: it "
                f"restored nothing (if the trainer had saved no checkpoint by step "
                f"{result['killed_after_logged_step']}, where the kill came, pick a --kill-at after "
                f"its first checkpoint; otherwise --resume-cmd does not load one)"
            )
        elif result["resume_step"] + base - 1 > max(
            result["killed_after_logged_step"], result["kill_at"]
        ):
            text += (
                f"; it resumed after step {result['resume_step'] + base - 1}, which the killed run never logged "
                f"(it stopped after step {result['killed_after_logged_step']}): does --resume-cmd read another "
                f"run's checkpoints?"
            )
        else:
            text += (
                f"; its log says resumed_from={result['resumed_from_logged']}, but its first step is "
                f"{result['resume_step'] + base} (resumed_from={result['resume_step']} expected): it did not "
                f"continue from the checkpoint it names"
            )
    elif not result.get("restored", True):
        text += (
            "; NO loader state was restored (no checkpoint was complete at the kill)"
            if not result["resume_step"]
            else "; the resumed run did not report continuing from that checkpoint"
        )
    return text
