"""The admin of jobs and stage records (eventbus.admin): read-only, a failed stage's traceback
shown to whoever has the model's view permission, and nothing at all without it; the job actions
need the change permission."""

import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from eventbus.job import runs
from eventbus.models import StageRecord

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed_stage(redis_client, make_job, tmp_path):
    job = make_job("staged", {"log": str(tmp_path / "log"), "raise": "card declined"})
    assert runs.run(str(job.id)) == "FAILED"
    return StageRecord.objects.get(job=job, stage="second")


def staff(django_user_model, name, *codenames):
    user = django_user_model.objects.create_user(name, password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_the_view_permission_shows_a_failed_stage_and_its_traceback(failed_stage, django_user_model):
    client = staff(django_user_model, "viewer", "view_stagerecord")
    page = client.get(f"/admin/eventbus/stagerecord/{failed_stage.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<pre>Traceback (most recent call last):" in html and "ValueError: card declined" in html
    assert "raise ValueError(ctx.payload[&quot;raise&quot;])" in html  # escaped, as all of it
    assert 'name="_save"' not in html  # read-only: no save button
    job_id = str(failed_stage.job_id)
    listing = client.get("/admin/eventbus/stagerecord/", {"q": job_id[:8], "stage": "second"})
    assert listing.status_code == 200 and f"/admin/eventbus/stagerecord/{failed_stage.pk}/change/" in (
        listing.content.decode()
    )
    other = client.get("/admin/eventbus/stagerecord/", {"q": "0000dead"})
    assert f"/admin/eventbus/stagerecord/{failed_stage.pk}/change/" not in other.content.decode()


def test_without_the_view_permission_staff_get_403(failed_stage, django_user_model):
    client = staff(django_user_model, "ops")
    assert client.get(f"/admin/eventbus/stagerecord/{failed_stage.pk}/change/").status_code == 403
    assert client.get("/admin/eventbus/stagerecord/").status_code == 403


def test_no_add_no_change_and_delete_only_with_its_permission(failed_stage, django_user_model):
    viewer = staff(django_user_model, "viewer", "view_stagerecord", "change_stagerecord")
    assert viewer.get("/admin/eventbus/stagerecord/add/").status_code == 403
    page = f"/admin/eventbus/stagerecord/{failed_stage.pk}/change/"
    assert viewer.post(page, {"stage": "forged", "attempts": 9}).status_code == 403
    assert (
        viewer.post(f"/admin/eventbus/stagerecord/{failed_stage.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    listing = viewer.post(
        "/admin/eventbus/stagerecord/", {"action": "delete_selected", "_selected_action": [failed_stage.pk]}
    )
    assert listing.status_code == 200  # "no action selected": the delete action is not offered
    assert StageRecord.objects.get(pk=failed_stage.pk).stage == "second"
    deleter = staff(django_user_model, "deleter", "view_stagerecord", "delete_stagerecord")
    assert (
        deleter.post(f"/admin/eventbus/stagerecord/{failed_stage.pk}/delete/", {"post": "yes"}).status_code
        == 302
    )
    assert not StageRecord.objects.filter(pk=failed_stage.pk).exists()


# The job actions of the job admin (eventbus.admin, eventbus.services) ------------------------

JOBS = "/admin/eventbus/job/"


def job_action(client, action, *jobs):
    return client.post(JOBS, {"action": action, "_selected_action": [job.pk for job in jobs]}, follow=True)


@pytest.mark.django_db(transaction=True)  # cancel_job's final event is published on commit
def test_the_job_actions_need_the_change_permission(broker, make_job, django_user_model):
    from eventbus.models import Job

    pending = make_job("flaky", {"log": "/dev/null", "api": "x"})
    failed = make_job("flaky", {"log": "/dev/null", "api": "x"}, state=Job.State.FAILED)
    viewer = staff(django_user_model, "viewer", "view_job")
    for action, job in (("cancel_jobs", pending), ("retry_jobs", failed)):
        assert job_action(viewer, action, job).status_code == 200  # "no action selected"
    assert Job.objects.get(pk=pending.pk).state == Job.State.PENDING
    assert not Job.objects.filter(retry_of=failed).exists()

    changer = staff(django_user_model, "changer", "view_job", "change_job")
    assert b"Cancelled 1 job(s); 1 had ended." in job_action(changer, "cancel_jobs", pending, failed).content
    assert Job.objects.get(pk=pending.pk).state == Job.State.CANCELLED
    page = job_action(changer, "retry_jobs", failed, pending).content
    assert b"Retried 2 job(s)." in page  # the cancelled one too
    assert job_action(changer, "retry_jobs", failed).content.count(b"Retried 0 job(s).") == 1  # once each
    retry = Job.objects.get(retry_of=failed)
    assert (retry.idem_key, retry.owner_id) == (f"retry:{failed.id}", failed.owner_id)


# A job's page and the job list (eventbus.admin's JobAdmin, eventbus.selectors) ----------------


@pytest.fixture
def failed_job(redis_client, make_job, tmp_path):
    """A staged job run to FAILED in its second stage, with an error that is markup."""
    from eventbus.models import Job

    job = make_job("staged", {"log": str(tmp_path / "log"), "raise": "<script>alert(1)</script>"})
    assert runs.run(str(job.id)) == "FAILED"
    return Job.objects.get(pk=job.pk)


def test_a_jobs_page_shows_its_stages_as_a_timeline_its_events_and_its_retry_chain(
    failed_job, django_user_model
):
    from eventbus.services import retry_job

    retry, _ = retry_job(failed_job.id, key="admin-retry")
    viewer = staff(django_user_model, "viewer", "view_job")
    page = viewer.get(f"{JOBS}{failed_job.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    timeline = html[
        html.index("<th>next attempt</th>") : html.index("</table>", html.index("<th>next attempt</th>"))
    ]
    rows = [row for row in timeline.split("<tr>")[1:]]
    assert [row.split("</td><td>")[1:3] for row in rows] == [
        ["First (first)", "COMPLETED"],
        ["Second (second)", "FAILED"],
        ["Third (third)", "PENDING"],
    ]
    assert "ValueError: &lt;script&gt;alert(1)&lt;/script&gt;" in rows[1]
    assert "<script>alert(1)</script>" not in html  # escaped everywhere: the payload too
    # Its events: the first stage's (recorded), then the final FAILED one (Redis).
    events = html[html.index("<th>seq</th>") :]
    assert "<td>10</td><td>first</td>" in events and "<td>51</td><td>done (Redis)</td>" in events
    assert "alice (user " in html  # whose keyspace, not only "t:1"
    assert f'href="{JOBS}{retry.pk}/change/"' in html  # retried by
    retried = viewer.get(f"{JOBS}{retry.pk}/change/").content.decode()
    assert f'href="{JOBS}{failed_job.pk}/change/"' in retried  # retry of
    # The retry's key is in its owner's scope (-:<pk>): the owner is shown, not the raw scope.
    assert f"alice (user {retry.owner_id})" in retried and f"-:{retry.owner_id}" not in retried
    # The retry reused the first stage: COMPLETED there too, the others not run yet.
    assert "<td>First (first)</td><td>COMPLETED</td>" in retried
    assert "<td>Second (second)</td><td>PENDING</td>" in retried


def test_the_job_list_filters_by_state_and_type_without_a_query_per_row(
    failed_job, make_job, django_user_model
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from eventbus.models import Job

    viewer = staff(django_user_model, "viewer", "view_job")

    def listing(**filters):
        with CaptureQueriesContext(connection) as queries:
            page = viewer.get(JOBS, filters)
        assert page.status_code == 200
        return {str(job.pk) for job in page.context["cl"].result_list}, len(queries)

    shown, few = listing()
    assert shown == {str(failed_job.pk)}
    others = [make_job("flaky", {"api": "x"}) for _ in range(5)]
    shown, many = listing()
    assert len(shown) == 6 and many == few  # the owner column's users come in the page's query
    assert listing(state="FAILED")[0] == {str(failed_job.pk)}
    assert listing(domain="flaky")[0] == {str(o.pk) for o in others}
    assert listing(domain="flaky", state="FAILED")[0] == set()
    page = viewer.get(JOBS).content.decode()
    assert "By job type" in page
    for column in ("Owner", "State", "Domain", "Accepted at", "Duration"):
        assert column in page
    assert Job.objects.count() == 6


def test_a_jobs_page_shows_the_start_of_a_large_events_data(make_job, redis_client, django_user_model):
    job = make_job("staged", {"log": "/dev/null"})
    StageRecord.objects.create(
        job=job,
        stage="first",
        attempts=1,
        events=[["first", 10, {"text": "x" * 5000 + "TAIL-OF-DATA"}]],
    )
    page = staff(django_user_model, "viewer", "view_job").get(f"{JOBS}{job.pk}/change/")
    html = page.content.decode()
    assert page.status_code == 200 and "<td>10</td><td>first</td>" in html
    assert "x" * 150 in html and "TAIL-OF-DATA" not in html and "…" in html
    assert "<td>First (first)</td><td>RUNNING</td>" in html  # started, neither finished nor failed


def test_the_admin_index_lists_jobs_under_jobs(django_user_model):
    client = staff(django_user_model, "viewer", "view_job", "view_stagerecord", "view_deadletter")
    html = client.get("/admin/").content.decode()
    app = html[html.index('<div class="app-eventbus module') :]  # the eventbus app's section
    app = app[: app.index("</table>")]
    assert re.search(r'<a href="/admin/eventbus/" class="section"[^>]*>Jobs</a>', app), app  # its name
    assert f'<a href="{JOBS}">Jobs</a>' in app and "Stage records" in app and "Dead letters" in app
    assert "Operations" not in html and "/admin/idempotency/operation/" not in html
    assert client.get(JOBS).status_code == 200


# The job list's order, a job's page read-only for everyone --------------------------------------


def test_the_job_list_is_newest_first_whatever_the_ids(make_job, django_user_model):
    import uuid
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    # Ids in the opposite order of their acceptance, and two jobs accepted at the same moment.
    oldest = make_job(id=uuid.UUID(int=2**128 - 1), accepted_at=now - timedelta(minutes=3))
    middle = make_job(id=uuid.UUID(int=2**127), accepted_at=now - timedelta(minutes=1))
    newest = make_job(id=uuid.UUID(int=1), accepted_at=now)
    twin = make_job(id=uuid.UUID(int=2), accepted_at=now)
    page = staff(django_user_model, "viewer", "view_job").get(JOBS)
    shown = [job.pk for job in page.context["cl"].result_list]
    assert shown == [twin.pk, newest.pk, middle.pk, oldest.pk]
    html = page.content.decode()
    assert html.index(str(twin.pk)[:8]) < html.index(str(oldest.pk)[:8])  # as rendered, too


def job_page(client, job):
    page = client.get(f"{JOBS}{job.pk}/change/")
    assert page.status_code == 200
    return page.content.decode()


@pytest.mark.parametrize(
    "codenames",
    [("view_job",), ("view_job", "change_job"), ("view_job", "change_job", "delete_job")],
    ids=["view", "view+change", "view+change+delete"],
)
def test_a_jobs_page_has_no_save_and_no_delete_and_refuses_a_post(make_job, django_user_model, codenames):
    from eventbus.models import Job

    job = make_job(state=Job.State.FAILED)
    client = staff(django_user_model, "member", *codenames)
    html = job_page(client, job)
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert 'class="deletelink"' not in html and f"{job.pk}/delete/" not in html
    assert "View job" in html  # Django's read-only page, not "Change job"
    forged = client.post(f"{JOBS}{job.pk}/change/", {"state": "COMPLETED"})
    assert forged.status_code == 403
    assert Job.objects.get(pk=job.pk).state == Job.State.FAILED


def test_a_superusers_job_page_has_no_save_or_delete_either(make_job, django_user_model):
    root = django_user_model.objects.create_superuser("root", password="x")
    client = Client()
    client.force_login(root)
    html = job_page(client, make_job())
    assert 'name="_save"' not in html and 'class="deletelink"' not in html


def test_the_change_permission_still_brings_the_actions_and_nothing_else(make_job, django_user_model):
    viewer = staff(django_user_model, "viewer", "view_job")
    changer = staff(django_user_model, "changer", "view_job", "change_job")
    deleter = staff(django_user_model, "deleter", "view_job", "delete_job")

    def actions(client):
        form = client.get(JOBS).context["action_form"]
        return set() if form is None else {value for value, _ in form.fields["action"].choices if value}

    assert actions(viewer) == set()
    assert actions(changer) == {"cancel_jobs", "retry_jobs", "signal_jobs"}
    assert actions(deleter) == {"delete_selected"}  # deleting stays the model's delete permission
    job = make_job()
    assert viewer.post(f"{JOBS}{job.pk}/delete/", {"post": "yes"}).status_code == 403


def test_a_failed_jobs_end_is_labelled_ended_at(make_job, django_user_model):
    from django.utils import timezone

    from eventbus.models import Job

    job = make_job(state=Job.State.FAILED, completed_at=timezone.now())
    html = job_page(staff(django_user_model, "viewer", "view_job"), job)
    assert "Ended at:" in html and "Completed at" not in html
    ended = html[html.index("Ended at:") : html.index("Duration:")]
    assert str(timezone.localtime(job.completed_at).year) in ended and "+00:00" not in ended
