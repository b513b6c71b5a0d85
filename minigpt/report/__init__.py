"""Offline HTML pages of runs: one run's report (reports/report.html, the `report` stage) and a comparison of
several runs (`python -m minigpt.report compare <exp or rev> …`). Inline SVG and CSS only: they open from disk."""
