"""The permissions on jobs follow the model: whoever had `idempotency.<action>_operation` (a user
or a group) has `eventbus.<action>_job`, for add, change, delete and view.

The content type of idempotency's Operation becomes the event bus's Job, and its permissions take
the job's codenames and names: the users', groups' and admin log's links to them are kept as
they are. When the job's content type exists already (a `migrate` that stopped between 0005 and
here created it), the users and groups of each old permission are given the new one instead.
Migrating back does the same the other way.
"""

from django.apps import apps as installed
from django.db import migrations

ACTIONS = ("add", "change", "delete", "view")
OLD = ("idempotency", "operation")
NEW = ("eventbus", "job")


def _models(apps):
    try:
        return apps.get_model("contenttypes", "ContentType"), apps.get_model("auth", "Permission")
    except LookupError:  # no contenttypes or no auth: no permissions to carry
        return None, None


def _move(apps, schema_editor, source, target):
    ContentType, Permission = _models(apps)
    if ContentType is None:
        return
    db = schema_editor.connection.alias
    old = ContentType.objects.using(db).filter(app_label=source[0], model=source[1]).first()
    if old is None:
        return
    new = ContentType.objects.using(db).filter(app_label=target[0], model=target[1]).first()
    if new is None:
        old.app_label, old.model = target
        old.save(update_fields=["app_label", "model"])
        for action in ACTIONS:
            Permission.objects.using(db).filter(content_type=old, codename=f"{action}_{source[1]}").update(
                codename=f"{action}_{target[1]}", name=f"Can {action} {target[1]}"
            )
        return
    for action in ACTIONS:
        was = Permission.objects.using(db).filter(content_type=old, codename=f"{action}_{source[1]}").first()
        if was is None:
            continue
        now, _ = Permission.objects.using(db).get_or_create(
            content_type=new, codename=f"{action}_{target[1]}", defaults={"name": f"Can {action} {target[1]}"}
        )
        now.user_set.add(*was.user_set.all())
        now.group_set.add(*was.group_set.all())


def forwards(apps, schema_editor):
    _move(apps, schema_editor, OLD, NEW)


def backwards(apps, schema_editor):
    _move(apps, schema_editor, NEW, OLD)


class Migration(migrations.Migration):
    dependencies = [("eventbus", "0006_job_table_and_names")]
    if installed.is_installed("django.contrib.contenttypes") and installed.is_installed(
        "django.contrib.auth"
    ):
        dependencies += [
            ("contenttypes", "0002_remove_content_type_name"),
            ("auth", "0011_update_proxy_permissions"),
        ]

    operations = [migrations.RunPython(forwards, backwards)]
