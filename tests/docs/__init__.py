"""The documentation's code blocks, each run or checked as its tag says (tests/docs/blocks.py)."""
