"""``loader.executor: ray`` on a real two-node Ray cluster: the cases of `ray_executor_cases`
(digests across executors and resumes, a killed actor, a stuck sample, an address that does not
answer, a node that reads other data, a lost cluster, no Ray import or process left) run in a
pytest process of their own, started from the repository: the cluster's nodes and their workers
start from a fresh interpreter, not from a test process that many other tests ran in before (its
first actors there could die before they started)."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO

CASES = REPO / "tests" / "loader" / "ray_executor_cases.py"


def test_the_ray_executor_cases_pass_in_a_process_of_their_own():
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
