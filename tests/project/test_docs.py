"""The documentation: a short README that opens with the two commands, a docs site that builds
strictly (no broken links, no missing pages, the API reference importable), code blocks that are
either run by a test or marked illustrative, and a measurements page rendered from benchmark JSON."""

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
RENDER = REPO / "scripts" / "render_measurements.py"


def test_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text()
    assert len(text) <= 15_000, (
        f"README.md is {len(text)} characters (at most 15,000: the rest belongs in docs/)"
    )
    lines = text.splitlines()
    assert lines[0].startswith("# ")
    body = [line for line in lines[1:] if line.strip()]
    assert body[0].startswith("```"), (
        "the first thing after the title is the code block of the two commands"
    )
    assert re.match(r"make demo\s+#\s*\S", body[1]), (
        f"first command: `make demo  # explanation`, got {body[1]!r}"
    )
    assert re.match(r"make test\s+#\s*\S", body[2]), (
        f"second command: `make test  # explanation`, got {body[2]!r}"
    )
    assert body[3] == "```"


def test_readme_links_into_docs_exist():
    text = README.read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links, "the README links into docs/"
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, f"README links to missing pages: {missing}"


def test_readme_quotes_no_benchmark_figure():
    text = README.read_text()
    figures = re.findall(r"\d[\d.,]*\s*(?:samples/s|clips/s|ms\b|MiB|GiB|×)|\b\d\.\d+×", text)
    assert not figures, f"README quotes figures {figures}: they belong on docs/measurements.md"


def code_blocks(text: str):
    """(info string, first line, the line before the fence) of every fenced block."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if m:
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            blocks.append((m.group(2), lines[i + 1] if i + 1 < len(lines) else "", before))
            i = j + 1
        else:
            i += 1
    return blocks


def test_every_command_or_code_block_is_tested_or_marked_illustrative():
    unmarked = []
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        for lang, first, before in code_blocks(page.read_text()):
            if lang not in ("bash", "python", "yaml", "json", "sh"):
                continue  # text: help output, diagrams
            if first.startswith("make "):
                continue  # the README's two commands: `make test` is the test run itself
            marks = (first + " " + before).lower()
            if not any(m in marks for m in ("illustrative", "run by")):
                unmarked.append(f"{page.relative_to(REPO)}: ```{lang} {first[:60]}")
    assert not unmarked, "blocks neither run by a test nor marked illustrative:\n" + "\n".join(
        unmarked
    )


@pytest.mark.slow
def test_mkdocs_build_is_strict_and_clean(site):
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "load_state_dict" in api and "StepLog" in api, "the API reference renders the docstrings"
    for page in (
        "convert",
        "balance",
        "measurements",
        "reference/cli",
        "reference/config",
        "reference/state",
    ):
        assert (site / page / "index.html").is_file(), page


def render(tmp_path, *args):
    return subprocess.run(
        [sys.executable, str(RENDER), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def test_measurements_without_json_say_how_to_produce_them(tmp_path):
    out = tmp_path / "m.md"
    empty = tmp_path / "bench-none.json"
    r = render(tmp_path, "--out", out, empty)
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    from importlib import util

    spec = util.spec_from_file_location("render_measurements", RENDER)
    mod = util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    page = mod.render({})
    assert "No benchmark JSON" in page and "--json bench-balance.json" in page


def test_measurements_render_one_run_per_benchmark(tmp_path):
    old = {
        "date": "2026-01-01T00:00:00+00:00",
        "machine": {"cpus": 2},
        "load_before": [0.5, 0.4, 0.3],
        "ratios": {"d_over_b": 0.9},
    }
    new = {
        "date": "2026-02-01T00:00:00+00:00",
        "machine": {"cpus": 4},
        "load_before": [1.5, 1.0, 0.7],
        "load_after": [2.0, 1.1, 0.8],
        "ratios": {"d_over_b": 1.07},
        "rate": 123.0,
        "targets": [{"target": "d/b >= 1.0", "value": 1.07, "met": True}],
    }
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "bench-loader.json").write_text(json.dumps(old))
    (tmp_path / "bench-loader.json").write_text(json.dumps(new))
    (tmp_path / "bench-bad.json").write_text("{not json")
    out = tmp_path / "m.md"
    r = render(
        tmp_path, "--out", out, tmp_path / "a" / "bench-loader.json", tmp_path / "bench-loader.json"
    )
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert page.count("## loader") == 1 and "2026-02-01" in page and "2026-01-01" not in page
    assert (
        "cpus 4" in page and "1.5, 1, 0.7 before" in page and "| ratios › d over b | 1.07 |" in page
    )
    assert "| d/b | 1.07 | higher | d/b >= 1.0 | yes |" in page and "| rate | 123 |" in page
    r = render(tmp_path, "--out", out, tmp_path / "bench-bad.json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bench-bad.json" in r.stderr
