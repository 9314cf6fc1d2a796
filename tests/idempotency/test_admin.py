"""The idempotency admin under Django's permissions: who is offered which action, what a forged
action POST does, and that the stored-response display escapes what it shows.

Staff users here hold only the permissions each test names (no superuser), as a team's support
staff would; the records are made by real keyed requests, and "still replays" means the owner's
retry gets the first answer and the view does not run again."""

import json

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from eventbus.models import Job
from idempotency.models import IdempotencyRecord

from . import views

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
CHANGELIST = "/admin/idempotency/idempotencyrecord/"
ACTIONS = ("evict", "expire_now")


def staff(django_user_model, name, *codenames):
    """A staff member (not superuser) with exactly these permissions (idempotency's, and the jobs'
    of the event bus), logged in."""
    member = django_user_model.objects.create_user(name, password="x", is_staff=True)
    member.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label__in=("idempotency", "eventbus"), codename__in=codenames
        )
    )
    assert len(codenames) == member.user_permissions.count()
    client = Client()
    client.force_login(member)
    return client


def keyed_post(client, key):
    return client.post(
        "/t/plain/",
        data=json.dumps({"amount": 10}),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
    )


@pytest.fixture
def owner_record(client_for, user):
    """The owner's keyed request, executed once: (the owner's client, the key, its record)."""
    owner = client_for(user)
    assert keyed_post(owner, "owner-1").status_code == 201
    assert views.CALLS["plain"] == 1
    return owner, "owner-1", IdempotencyRecord.objects.get(key="owner-1")


def run_action(client, action, record):
    return client.post(CHANGELIST, {"action": action, "_selected_action": [record.pk]}, follow=True)


def offered_actions(response) -> set[str]:
    """The actions the changelist's select lists (none when it shows no action form)."""
    form = response.context["action_form"]  # None when no action is allowed
    if form is None:
        return set()
    return {value for value, _ in form.fields["action"].choices if value}


def test_view_only_staff_is_offered_no_action(django_user_model):
    viewer = staff(django_user_model, "viewer", "view_idempotencyrecord")
    listing = viewer.get(CHANGELIST)
    assert listing.status_code == 200
    assert offered_actions(listing) == set()
    for action in ACTIONS:
        assert f'value="{action}"'.encode() not in listing.content


@pytest.mark.parametrize("action", ACTIONS)
def test_a_forged_action_post_by_view_only_staff_changes_nothing(django_user_model, owner_record, action):
    owner, key, record = owner_record
    viewer = staff(django_user_model, "viewer", "view_idempotencyrecord")
    response = run_action(viewer, action, record)
    assert response.status_code == 200  # Django answers "No action selected", and runs none
    after = IdempotencyRecord.objects.get(pk=record.pk)
    assert after.expires_at == record.expires_at and after.state == record.state
    retry = keyed_post(owner, key)
    assert retry.status_code == 201 and retry["Idempotent-Replayed"] == "true"
    assert views.CALLS["plain"] == 1  # the view did not run a second time


@pytest.mark.parametrize(
    "codenames, offered",
    [
        (("view_idempotencyrecord", "delete_idempotencyrecord"), {"evict", "delete_selected"}),
        (("change_idempotencyrecord",), {"expire_now"}),
        (
            ("change_idempotencyrecord", "delete_idempotencyrecord"),
            {"evict", "expire_now", "delete_selected"},
        ),
    ],
)
def test_each_action_is_offered_with_its_permission_only(django_user_model, codenames, offered):
    member = staff(django_user_model, "member", *codenames)
    assert offered_actions(member.get(CHANGELIST)) == offered


def test_staff_with_delete_permission_can_evict(django_user_model, owner_record):
    owner, key, record = owner_record
    deleter = staff(django_user_model, "deleter", "view_idempotencyrecord", "delete_idempotencyrecord")
    assert b"Evicted 1 key(s)." in run_action(deleter, "evict", record).content
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
    retry = keyed_post(owner, key)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert views.CALLS["plain"] == 2  # evicted: the retry executes again, as the action says


def test_staff_with_change_permission_can_expire(django_user_model, owner_record):
    owner, key, record = owner_record
    changer = staff(django_user_model, "changer", "change_idempotencyrecord")
    assert b"Expired 1 key(s)." in run_action(changer, "expire_now", record).content
    assert IdempotencyRecord.objects.get(pk=record.pk).expires_at < record.expires_at
    retry = keyed_post(owner, key)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert views.CALLS["plain"] == 2


def test_staff_without_view_permission_gets_403(django_user_model):
    nobody = staff(django_user_model, "nobody")
    assert nobody.get(CHANGELIST).status_code == 403
    assert nobody.get("/admin/eventbus/job/").status_code == 403
    jobs_only = staff(django_user_model, "ops", "view_job")
    assert jobs_only.get(CHANGELIST).status_code == 403
    assert jobs_only.get("/admin/eventbus/job/").status_code == 200


def test_the_job_admin_offers_only_the_job_actions_without_delete_and_neither_admin_edits(
    django_user_model, user, owner_record
):
    job = Job.objects.create(domain="scan", owner=user, idem_key="k-1", scope=f"u:{user.pk}")
    changer = staff(django_user_model, "changer", "change_job", "change_idempotencyrecord")
    listing = changer.get("/admin/eventbus/job/")
    assert listing.status_code == 200 and offered_actions(listing) == {
        "cancel_jobs",
        "retry_jobs",
        "signal_jobs",
    }
    for page in (
        f"/admin/eventbus/job/{job.pk}/change/",
        f"{CHANGELIST}{owner_record[2].pk}/change/",
    ):
        form = changer.get(page).context["adminform"].form
        assert list(form.fields) == []  # every field read-only: change permission edits nothing


def test_the_stored_response_display_escapes_html(django_user_model):
    record = IdempotencyRecord.objects.create(
        scope="-:1",
        key="xss",
        fingerprint="fp",
        state="COMPLETED",
        expires_at="2999-01-01T00:00:00Z",
        response_status=200,
        response_headers=[["X-Note", "<img src=x onerror=alert(2)>"]],
        response_body=b"<script>alert(1)</script>",
    )
    viewer = staff(django_user_model, "viewer", "view_idempotencyrecord")
    page = viewer.get(f"{CHANGELIST}{record.pk}/change/")
    assert page.status_code == 200
    assert b"<script>alert(1)</script>" not in page.content
    assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in page.content
    assert b"<img src=x" not in page.content and b"&lt;img src=x onerror=alert(2)&gt;" in page.content


@pytest.mark.parametrize(
    "body, shown",
    [
        (b"[" * 200_000, b"[[[["),  # nested past the JSON parser's limit: shown as text, not a 500
        (b'{"big": "' + b"x" * 300_000 + b'"}', b"more bytes not shown"),  # cut, not rendered whole
    ],
)
def test_the_stored_response_display_survives_any_body(django_user_model, body, shown):
    record = IdempotencyRecord.objects.create(
        scope="-:1",
        key="odd",
        fingerprint="fp",
        state="COMPLETED",
        expires_at="2999-01-01T00:00:00Z",
        response_status=200,
        response_headers=[["Content-Type", "application/json"]],
        response_body=body,
    )
    viewer = staff(django_user_model, "viewer", "view_idempotencyrecord")
    page = viewer.get(f"{CHANGELIST}{record.pk}/change/")
    assert page.status_code == 200
    assert shown in page.content
    assert len(page.content) < 150_000


def test_the_records_are_listed_newest_first(django_user_model):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    # Created (pk order) in another order than their created_at.
    for key, minutes_ago in (("middle", 2), ("oldest", 5), ("newest", 0)):
        IdempotencyRecord.objects.create(
            scope="-:1",
            key=key,
            fingerprint="fp",
            created_at=now - timedelta(minutes=minutes_ago),
            expires_at=now + timedelta(days=1),
        )
    page = staff(django_user_model, "viewer", "view_idempotencyrecord").get(CHANGELIST)
    assert [record.key for record in page.context["cl"].result_list] == ["newest", "middle", "oldest"]


@pytest.mark.parametrize(
    "codenames",
    [
        ("view_idempotencyrecord",),
        ("view_idempotencyrecord", "change_idempotencyrecord"),
    ],
    ids=["view", "view+change"],
)
def test_a_records_page_has_no_save_and_refuses_a_post(django_user_model, owner_record, codenames):
    owner, key, record = owner_record
    member = staff(django_user_model, "member", *codenames)
    page = member.get(f"{CHANGELIST}{record.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert 'class="deletelink"' not in html  # no delete permission
    assert member.post(f"{CHANGELIST}{record.pk}/change/", {}).status_code == 403
    assert IdempotencyRecord.objects.get(pk=record.pk).expires_at == record.expires_at
    retry = keyed_post(owner, key)
    assert retry["Idempotent-Replayed"] == "true"


def test_the_delete_permission_still_deletes_a_record_from_its_page(django_user_model, owner_record):
    owner, key, record = owner_record
    deleter = staff(django_user_model, "deleter", "view_idempotencyrecord", "delete_idempotencyrecord")
    html = deleter.get(f"{CHANGELIST}{record.pk}/change/").content.decode()
    assert 'class="deletelink"' in html and 'name="_save"' not in html
    assert deleter.post(f"{CHANGELIST}{record.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
