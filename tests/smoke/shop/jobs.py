"""A job type of the project's own, declared with the toolkit's public API and registered by
@register (eventbus imports every installed app's `jobs` module at startup)."""

from eventbus.jobtypes import JobType, Stage, register


@register
class Greet(JobType):
    name = "greet"
    stages = (Stage("prepare", "Preparing"), Stage("write", "Writing"))

    def prepare(self, ctx):
        return {"who": ctx.payload.get("who", "world")}

    def write(self, ctx):
        for i in range(3):
            ctx.report(done=i + 1, of=3, text=f"part {i}")
        return {"text": "hello " + ctx.results["prepare"]["who"]}

    def outcome(self, results):
        return {"text": results["write"]["text"]}
