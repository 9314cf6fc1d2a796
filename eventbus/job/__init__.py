"""Running jobs: their stages (stages) and the one writer of stage records (stagerecords), one run
at a time under its lease (runs), the one writer of a job's state (lifecycle), recovery and the
sweep that leave no job stranded (recovery, sweep), the per-user limits (limits), cancellation,
retention, and the supervisor of `manage.py run_jobs` (supervisor). Named `job`, not `jobs`:
Django's autodiscover_modules("jobs") imports every app's `jobs` module. The public face of jobs
is at the package's top: eventbus.services, eventbus.selectors, eventbus.jobtypes. See
docs/design/code-map.md."""
