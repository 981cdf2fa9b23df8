"""Markdown tables rendered from the files in results/ (study.tables.results assembles docs/results.md)."""
