"""Dead letters in the admin (eventbus.admin.DeadLetterAdmin): listed from Redis for staff with
`eventbus.view_deadletter`, re-driven by a CSRF-checked POST for staff with
`eventbus.redrive_deadletter` only. The letters are made as the router and the reclaimer make
them (tests/eventbus/test_redrive.py): a malformed entry, and one whose predecessor was lost."""

import re

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client

from eventbus import publish_events
from eventbus.bus.keys import JobKeys, dead_letter_key
from eventbus.models import DeadLetter

from .helpers import dead_letters, history_seqs
from .test_redrive import FORGED, forge, reclaim, route

pytestmark = pytest.mark.django_db
LIST = "/admin/eventbus/deadletter/"
REDRIVE = "/admin/eventbus/deadletter/redrive/"


def staff(django_user_model, name, *codenames, csrf=False):
    user = django_user_model.objects.create_user(name, password="x", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="eventbus", codename__in=codenames)
    )
    assert user.user_permissions.count() == len(codenames)
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


@pytest.fixture
def letters(redis_client):
    """scan job-p: seq 10 applied, 11 lost, 12 dead-lettered after its deliveries; an entry whose
    data is not JSON dead-lettered at once. Returns (the lost entry's fields, the job's keys)."""
    publish_events([("scan", "job-p", "vision", seq, {"seq": seq}) for seq in (10, 11, 12)])
    keys = JobKeys("scan", "job-p")
    [_, (lost_id, lost_fields), _] = redis_client.xrange(keys.stream)
    redis_client.xdel(keys.stream, lost_id)
    fields = {k.decode(): v for k, v in lost_fields.items()}
    redis_client.xadd(keys.stream, {**fields, "seq": "99", "data": "{oops"})
    route()
    reclaim()
    assert sorted(letter["seq"] for letter in dead_letters(redis_client, "scan")) == ["12", "99"]
    return lost_fields, keys


def test_migrate_made_the_permissions_and_no_table():
    codenames = set(
        Permission.objects.filter(
            content_type__app_label="eventbus", content_type__model="deadletter"
        ).values_list("codename", flat=True)
    )
    assert codenames == {"view_deadletter", "redrive_deadletter"}
    assert DeadLetter._meta.db_table not in connection.introspection.table_names()


def test_view_permission_lists_every_shards_dead_letters_and_offers_no_redrive(letters, django_user_model):
    _, keys = letters
    viewer = staff(django_user_model, "viewer", "view_deadletter")
    assert "/admin/eventbus/deadletter/" in viewer.get("/admin/").content.decode()  # in the index
    page = viewer.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    assert "scan: 2 dead letters" in html
    assert "predecessor seq 11 never applied" in html and "job-p" in html
    assert "data is not JSON" in html
    rows = [
        re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)
        for row in html.split('<tr class="dead-letter">')[1:]
    ]
    by_seq = {row[3]: row for row in rows}
    assert by_seq.keys() == {"12", "-"}  # seq: the malformed one has none it can trust
    shard, _, job_id, _, reason, deliveries, _ = by_seq["12"]
    assert (shard, job_id, reason, int(deliveries)) == (
        str(keys.shard),
        "job-p",
        "predecessor seq 11 never applied",
        2,
    )
    assert "malformed, stays" in by_seq["-"][4] and by_seq["-"][5] == "-"  # dead-lettered at first sight
    assert 'name="redrive"' not in html


def test_what_redis_holds_is_shown_as_text(redis_client, django_user_model):
    redis_client.xadd(
        dead_letter_key("scan", 0),
        {"job_id": "<i>j</i>", "reason": "<script>alert(1)</script>", "original_stream_id": "1-0"},
    )
    html = staff(django_user_model, "viewer", "view_deadletter").get(LIST).content.decode()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<i>j</i>" not in html


def test_without_the_view_permission_the_list_is_403(letters, django_user_model):
    nobody = staff(django_user_model, "nobody")
    assert nobody.get(LIST).status_code == 403
    assert "/admin/eventbus/deadletter/" not in nobody.get("/admin/").content.decode()
    # Django's other pages of a model do not exist for a model without a table.
    redriver = staff(django_user_model, "redriver", "view_deadletter", "redrive_deadletter")
    assert redriver.get(f"{LIST}1/change/").status_code == 404
    assert redriver.get(f"{LIST}add/").status_code == 404


def test_a_redrive_post_without_the_permission_changes_nothing(letters, redis_client, django_user_model):
    _, keys = letters
    before = redis_client.xrange(dead_letter_key("scan", keys.shard))
    stream = redis_client.xlen(keys.stream)
    viewer = staff(django_user_model, "viewer", "view_deadletter")
    assert viewer.post(REDRIVE, {"domain": "scan"}).status_code == 403
    assert redis_client.xrange(dead_letter_key("scan", keys.shard)) == before
    assert redis_client.xlen(keys.stream) == stream


def test_the_redrive_permission_redrives_the_well_formed_letter_which_is_routed(
    letters, redis_client, django_user_model
):
    lost_fields, keys = letters
    redriver = staff(django_user_model, "redriver", "view_deadletter", "redrive_deadletter", csrf=True)
    page = redriver.get(LIST)
    assert 'name="redrive"' in page.content.decode()
    assert redriver.post(REDRIVE, {"domain": "scan"}).status_code == 403  # no CSRF token
    assert len(dead_letters(redis_client, "scan")) == 2
    assert redriver.get(REDRIVE).status_code == 405

    redis_client.xadd(keys.stream, lost_fields)  # the cause fixed: the lost entry is back
    route()
    assert history_seqs(redis_client, "scan", "job-p") == [10, 11]
    token = redriver.cookies["csrftoken"].value
    done = redriver.post(REDRIVE, {"domain": "scan", "csrfmiddlewaretoken": token}, follow=True)
    assert done.status_code == 200
    assert "Re-drove 1 of 2 dead letter(s) of scan; 1 malformed kept." in done.content.decode()
    route()
    assert history_seqs(redis_client, "scan", "job-p") == [10, 11, 12]
    [kept] = dead_letters(redis_client, "scan")
    assert kept["seq"] == "99"


def test_a_redrive_of_an_unknown_domain_is_refused_with_a_message(letters, redis_client, django_user_model):
    redriver = staff(django_user_model, "redriver", "view_deadletter", "redrive_deadletter")
    page = redriver.post(REDRIVE, {"domain": "nope"}, follow=True)
    assert page.status_code == 200 and "No domain &#x27;nope&#x27;." in page.content.decode()
    assert len(dead_letters(redis_client, "scan")) == 2


def test_without_redis_the_page_and_the_redrive_say_so_instead_of_a_500(
    redis_client, eventbus_settings_override, django_user_model
):
    from config.redis_server import free_port

    redriver = staff(django_user_model, "redriver", "view_deadletter", "redrive_deadletter")
    with eventbus_settings_override(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"):
        page = redriver.get(LIST)
        assert page.status_code == 200 and "Redis did not answer" in page.content.decode()
        done = redriver.post(REDRIVE, {"domain": "scan"}, follow=True)
        assert done.status_code == 200 and "Redis did not answer" in done.content.decode()


ODD = {
    **FORGED,
    "deliveries of 5,000 digits": {b"original_stream_id": b"x", b"deliveries": b"9" * 5000},
    "reason huge, markup, not UTF-8": {
        b"original_stream_id": b"x",
        b"reason": b"\xff<b>bold</b>" + b"r" * 100_000,
    },
}


@pytest.mark.parametrize("changes", ODD.values(), ids=ODD.keys())
def test_a_malformed_dead_letter_is_listed_with_its_fields_as_text_and_kept_by_the_redrive(
    redis_client, django_user_model, changes
):
    dead, dead_id = forge(redis_client, **{k.decode(): v for k, v in changes.items()})
    redriver = staff(django_user_model, "redriver", "view_deadletter", "redrive_deadletter")
    page = redriver.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    [row] = html.split('<tr class="dead-letter">')[1:]
    assert "(malformed, stays:" in row and f"dead letter {dead_id}: its fields" in row
    assert "<code>seq</code>" in row  # its raw fields, shown
    assert "<b>" not in html and "r" * 1000 not in html and len(html) < 50_000
    done = redriver.post(REDRIVE, {"domain": "scan"}, follow=True).content.decode()
    assert "Re-drove 0 of 1 dead letter(s) of scan; 1 malformed kept." in done
    assert f"Malformed, kept: {dead} {dead_id}." in done
    assert [entry_id.decode() for entry_id, _ in redis_client.xrange(dead)] == [dead_id]


def test_a_redrive_names_at_most_ten_kept_letters(redis_client, django_user_model):
    for _ in range(12):
        forge(redis_client, original_stream_id=b"x")
    redriver = staff(django_user_model, "redriver", "view_deadletter", "redrive_deadletter")
    done = redriver.post(REDRIVE, {"domain": "scan"}, follow=True).content.decode()
    assert "12 malformed kept." in done and " and 2 more." in done
