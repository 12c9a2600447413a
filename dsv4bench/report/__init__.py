"""Run directories rendered for people: one self-contained index.html, a lossless results.csv,
and run-against-run comparison (build.write_report is the entry point; docs/reports.md)."""
