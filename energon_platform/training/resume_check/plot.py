"""``OUT/loss.png``: both runs' loss, their difference, and a balanced run's per-rank cost."""

from __future__ import annotations

from pathlib import Path


def plot(straight: dict[int, dict], resumed: dict[int, dict], resume_step: int, path: Path) -> None:
    import matplotlib

    # pyplot only once a chart is drawn: the backend must be set before its import
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(straight)
    # loader.balance: a panel of per-rank cost
    balanced = [s for s in steps if "rank_cost" in straight[s]]
    fig, axes = plt.subplots(
        3 if balanced else 2,
        1,
        figsize=(8, 8 if balanced else 6),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1, 1] if balanced else [3, 1]},
    )
    ax, bx = axes[0], axes[1]
    if balanced:
        axes[2].plot(
            balanced,
            [straight[s]["rank_cost"] for s in balanced],
            color="teal",
            label="max/mean rank cost",
        )
        axes[2].axhline(1.0, color="gray", ls=":")
        axes[2].set_ylabel("rank cost")
        axes[2].legend()
    ax.plot(steps, [straight[s]["loss"] for s in steps], label="uninterrupted", lw=2)
    rs = sorted(resumed)
    ax.plot(rs, [resumed[s]["loss"] for s in rs], "--", label="killed + resumed", lw=1.5)
    ax.axvline(resume_step, color="gray", ls=":", label=f"resumed from step {resume_step}")
    ax.set_ylabel("loss")
    ax.legend()
    common = [s for s in steps if s in resumed]
    bx.plot(
        common, [abs(straight[s]["loss"] - resumed[s]["loss"]) for s in common], color="crimson"
    )
    bx.set_ylabel("|Δloss|")
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
