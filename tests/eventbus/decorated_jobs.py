"""A job type registered both ways: @register, and EVENTBUS["JOB_TYPES"] naming this module."""

from eventbus.jobtypes import JobType, Stage, register


@register
class Decorated(JobType):
    name = "decorated"
    stages = (Stage("only"),)

    def only(self, ctx):
        return None
