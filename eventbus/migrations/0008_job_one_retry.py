"""A job has at most one retry: the UNIQUE constraint job_one_retry on Job.retry_of (where set).

A database may hold jobs retried more than once, from before the constraint: each keeps the
link of its oldest retry (by acceptance, then id), and its later retries are unlinked (their
retry_of set to null; the jobs themselves and their stage records stay). Migrating back drops
the constraint and links nothing again.
"""

from django.db import migrations, models


def unlink_later_retries(apps, schema_editor):
    Job = apps.get_model("eventbus", "Job")
    jobs = Job.objects.using(schema_editor.connection.alias)
    retried_twice = (
        jobs.filter(retry_of__isnull=False)
        .values("retry_of")
        .annotate(retries=models.Count("pk"))
        .filter(retries__gt=1)
        .values_list("retry_of", flat=True)
    )
    for old_id in list(retried_twice):
        later = jobs.filter(retry_of=old_id).order_by("accepted_at", "pk").values_list("pk", flat=True)[1:]
        jobs.filter(pk__in=list(later)).update(retry_of=None)


class Migration(migrations.Migration):
    dependencies = [("eventbus", "0007_job_permissions")]

    operations = [
        migrations.RunPython(unlink_later_retries, migrations.RunPython.noop, elidable=True),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(retry_of__isnull=False), fields=("retry_of",), name="job_one_retry"
            ),
        ),
    ]
