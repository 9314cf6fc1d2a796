"""Durable stages in the admin (eventbus.admin): the action "Send a signal" (the change
permission, a page of its own, one signal per page shown), and a job's page with its parent, its
children, its waiting stage and the signals sent to it (their own view permission); the list's
WAITING filter."""

import re

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from eventbus import admin as job_admin
from eventbus.models import Job, JobSignal, StageRecord

pytestmark = pytest.mark.django_db

JOBS = "/admin/eventbus/job/"


def staff(django_user_model, name, *codenames):
    user = django_user_model.objects.create_user(name, password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    client.user = user
    return client


def ask(client, *jobs):
    """The action chosen on the list: its page (or the list again, with a message)."""
    return client.post(JOBS, {"action": "signal_jobs", "_selected_action": [job.pk for job in jobs]})


def send(client, page, *, signal="approve", payload="{}"):
    """Submit the action's page as shown: its hidden fields (the key, the jobs), the choices."""
    form = page.context["form"]
    data = {
        "action": "signal_jobs",
        "_selected_action": [str(job.pk) for job in page.context["jobs"]],
        "key": form["key"].value(),
        "signal": signal,
        "payload": payload,
        "send": "Send the signal",
    }
    return client.post(JOBS, data, follow=True)


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.fixture
def approval(make_job):
    return make_job("approval", {"amount": 5}, state=Job.State.WAITING)


def test_without_the_change_permission_there_is_no_page_and_no_signal(approval, django_user_model):
    viewer = staff(django_user_model, "viewer", "view_job")
    assert ask(viewer, approval).context.get("form") is None  # the list again: no such action
    submitted = viewer.post(
        JOBS,
        {
            "action": "signal_jobs",
            "_selected_action": [approval.pk],
            "signal": "approve",
            "key": "k",
            "send": "1",
        },
    )
    assert submitted.status_code == 200 and submitted.context.get("form") is None
    assert not JobSignal.objects.exists()


def test_the_action_asks_which_signal_and_sends_it_once_per_page(approval, django_user_model):
    operator = staff(django_user_model, "operator", "view_job", "change_job")
    page = ask(operator, approval)
    assert page.status_code == 200
    assert [value for value, _ in page.context["form"].fields["signal"].choices] == ["approve", "reject"]
    html = page.content.decode()
    assert str(approval.pk) in html and 'name="payload"' in html and 'type="hidden" name="key"' in html
    key = page.context["form"]["key"].value()
    assert key.startswith("admin:")

    done = send(operator, page, payload='{"by": "ops"}')
    assert done.redirect_chain[-1][0].endswith(JOBS)
    assert "Sent the signal approve to 1 job(s)." in messages_of(done)
    sent = JobSignal.objects.get(job=approval)
    assert (sent.name, sent.payload, sent.idem_key, sent.sent_by) == (
        "approve",
        {"by": "ops"},
        key,
        operator.user,
    )

    # The same page submitted again (a double click, a resend): the same signal, not a refusal.
    again = send(operator, page, payload='{"by": "ops"}')
    assert "Sent the signal approve to 1 job(s) (1 sent before with this key)." in messages_of(again)
    # A page shown anew has a key of its own: the job has that signal already.
    other = ask(operator, approval)
    assert other.context["form"]["key"].value() != key
    refused = messages_of(send(operator, other, payload='{"by": "someone else"}'))
    assert any("has been sent the signal 'approve' already" in text for text in refused), refused
    assert JobSignal.objects.filter(job=approval).count() == 1


@pytest.mark.parametrize("payload", ["{nope", "[1]", '"yes"'])
def test_a_payload_that_is_not_a_json_object_shows_the_page_again(approval, django_user_model, payload):
    operator = staff(django_user_model, "operator", "view_job", "change_job")
    page = ask(operator, approval)
    again = send(operator, page, payload=payload)
    assert again.status_code == 200 and again.context["form"].errors["payload"]
    assert again.context["form"]["key"].value() == page.context["form"]["key"].value()  # kept
    assert not JobSignal.objects.exists()


def test_each_job_that_cannot_take_the_signal_is_named(approval, make_job, django_user_model):
    operator = staff(django_user_model, "operator", "view_job", "change_job")
    scan = make_job("scan")
    ended = make_job("approval", {"amount": 1}, state=Job.State.COMPLETED)
    done = send(operator, ask(operator, approval, scan, ended), signal="reject")
    texts = messages_of(done)
    assert "Sent the signal reject to 1 job(s)." in texts
    assert any(text.startswith(f"{scan.pk}: A scan job takes no signal 'reject'") for text in texts), texts
    assert any(text.startswith(f"{ended.pk}: Job {ended.pk} is COMPLETED") for text in texts), texts
    assert list(JobSignal.objects.values_list("job_id", "name")) == [(approval.pk, "reject")]


def test_jobs_whose_types_declare_no_signal_get_a_message(make_job, django_user_model):
    operator = staff(django_user_model, "operator", "view_job", "change_job")
    answer = ask(operator, make_job("scan"))
    assert answer.status_code == 302
    listing = operator.get(answer["Location"])
    assert "The selected jobs&#x27; types declare no signal." in listing.content.decode()


# -- a job's page and the list -------------------------------------------------------------------


def test_a_jobs_page_shows_its_wait_its_parent_its_children_and_its_signals(
    approval, make_job, django_user_model
):
    now = timezone.now()
    StageRecord.objects.create(job=approval, stage="request", attempts=1, started_at=now, finished_at=now)
    StageRecord.objects.create(job=approval, stage="review", attempts=1, waiting_for="signal:approve,reject")
    child = make_job("scan", parent=approval, state=Job.State.RUNNING)
    JobSignal.objects.create(job=approval, name="approve", payload={"by": "<b>ann</b>"}, idem_key="sig-key-1")

    viewer = staff(django_user_model, "viewer", "view_job")
    html = viewer.get(f"{JOBS}{approval.pk}/change/").content.decode()
    assert "<th>waiting for</th>" in html
    assert "<td>Waiting for a decision (review)</td><td>WAITING</td>" in html
    assert "<td>signal:approve,reject</td>" in html
    assert f'<a href="{JOBS}{child.pk}/change/">{child.pk}</a> (RUNNING)' in html
    assert "sig-key-1" not in html  # the signals are their own model's: no view permission, not shown
    child_page = viewer.get(f"{JOBS}{child.pk}/change/").content.decode()
    assert f'<a href="{JOBS}{approval.pk}/change/">{approval.pk}</a>' in child_page  # its parent

    reader = staff(django_user_model, "reader", "view_job", "view_jobsignal")
    html = reader.get(f"{JOBS}{approval.pk}/change/").content.decode()
    assert "sig-key-1" in html and "&lt;b&gt;ann&lt;/b&gt;" in html and "<b>ann</b>" not in html
    assert 'name="signals-0-name"' not in html  # read-only: no input
    assert 'name="_save"' not in html


def test_many_children_link_to_the_list_of_them_all(make_job, django_user_model, monkeypatch):
    monkeypatch.setattr(job_admin, "SHOWN_CHILDREN", 2)
    parent = make_job("approval", {"amount": 1})
    children = [make_job("scan", parent=parent) for _ in range(3)]
    other = make_job("scan")
    viewer = staff(django_user_model, "viewer", "view_job")
    html = viewer.get(f"{JOBS}{parent.pk}/change/").content.decode()
    link = re.search(r'<a href="([^"]+)">all 3</a>', html)
    assert link, html
    listing = viewer.get(link[1].replace("&amp;", "&"))
    assert {job.pk for job in listing.context["cl"].result_list} == {child.pk for child in children}
    assert other.pk not in {job.pk for job in listing.context["cl"].result_list}


def test_the_list_filters_waiting_jobs(approval, make_job, django_user_model):
    make_job("scan", state=Job.State.RUNNING)
    make_job("scan")
    viewer = staff(django_user_model, "viewer", "view_job")
    page = viewer.get(JOBS, {"state": "WAITING"})
    assert [job.pk for job in page.context["cl"].result_list] == [approval.pk]
    assert "?state__exact=WAITING" in viewer.get(JOBS).content.decode()  # offered among the states
