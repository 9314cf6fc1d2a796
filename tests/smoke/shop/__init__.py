"""The smoke project's own app: a DRF view marked for idempotency (views.py, written from the
README's "A view of your own" by smoke.py) and a job type of its own, written as a team adopting
the toolkit would write them (tests/smoke/run_smoke.sh)."""
