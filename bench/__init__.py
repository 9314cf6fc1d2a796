"""The benchmarks: scripts, never tests, each a short script of scenarios (bench/<name>.py, its
report bench/REPORT-<name>.md), on one harness: bench/processes.py (the processes they start:
tests/processes.py's Process, shared with the test suite), bench/stats.py (percentiles, medians,
ratios: one definition each), bench/report.py (verdicts, load average, tables, the report's
section between its markers) and bench/procstat.py (the machine, for the reports)."""
