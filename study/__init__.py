"""The study: its tables, report and figures, and the scripts that ran it and rebuild its assets. Not installed:
run from the repository root as `python -m study.<script>` (e.g. `python -m study.results_tables
--out=docs/results.md`). It uses opd_jax like any user would; nothing in opd_jax imports it (tests/test_layering.py)."""
