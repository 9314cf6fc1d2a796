"""Kept for imports of `eventbus.stages` (a project annotating a stage's `ctx` with
`StageContext`): the code lives in eventbus.job.stages, the room of running jobs."""

from eventbus.job.stages import StageContext

__all__ = ["StageContext"]
