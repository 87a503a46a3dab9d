"""The benchmarks: each module measures ours and the alternative side by side in one run, prints a
table and, with ``--json PATH``, writes its record for the measurements page
(``scripts/render_measurements.py``).

Run from the repository root as modules, e.g. ``python -m scripts.bench.loader --json
bench-loader.json``; a benchmark's child processes are started the same way
(``[sys.executable, "-m", "scripts.bench.NAME", ...]`` with ``cwd`` the repository). What they share
(the repository's path, timing, the JSON record with the machine and its load average) is in
:mod:`scripts.bench.common`; :mod:`scripts.bench.data` builds the small converted corpora the
benchmarks and the tests use."""
