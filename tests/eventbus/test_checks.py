import pytest
from django.test.utils import override_settings

from eventbus.checks import check_cluster_client, check_redis_url, check_ttls


def test_the_default_settings_pass(eventbus_settings_override):
    with eventbus_settings_override():
        assert check_ttls() == []


@pytest.mark.parametrize(
    "values, expected",
    [
        # 300 s idle x 5 deliveries = 1500 s of reclaims: a 1000 s dedup key may be gone by then.
        ({"DEDUP_TTL": 1000}, ["eventbus.E003", "eventbus.E004"]),
        ({"ROUTER_DEDUP_TTL": 3000}, ["eventbus.E004"]),  # shorter than the 3600 s visibility
        ({"RECLAIM_MIN_IDLE_MS": 2_000_000}, ["eventbus.E003", "eventbus.E003"]),
        ({"HISTORY_TTL": 60}, ["eventbus.E005"]),
        ({"DOMAINS": {"scan": 0}}, ["eventbus.E002"]),
        (
            {"DEDUP_TTL": 1500, "ROUTER_DEDUP_TTL": 1500, "RECLAIM_MIN_IDLE_MS": 300_000},
            ["eventbus.E004"] * 2,
        ),
    ],
)
def test_ttls_shorter_than_what_they_guard_are_errors(eventbus_settings_override, values, expected):
    with eventbus_settings_override(**values):
        assert sorted(error.id for error in check_ttls()) == expected


@pytest.mark.parametrize("lease", [0, -1, "5", None, True])
def test_a_run_lease_that_is_not_seconds_above_zero_is_an_error(eventbus_settings_override, lease):
    with eventbus_settings_override(RUN_LEASE_SECONDS=lease):
        assert [error.id for error in check_ttls()] == ["eventbus.E011"]
    with eventbus_settings_override(RUN_LEASE_SECONDS=0.5):
        assert check_ttls() == []


def test_the_celery_visibility_timeout_counts(eventbus_settings_override):
    with (
        eventbus_settings_override(),
        override_settings(CELERY_BROKER_TRANSPORT_OPTIONS={"visibility_timeout": 9000}),
    ):
        errors = check_ttls()
    assert [e.id for e in errors] == ["eventbus.E004", "eventbus.E004"]
    assert "visibility timeout (9000s)" in errors[0].msg


def test_unknown_keys_are_an_error():
    with override_settings(EVENTBUS={"DEDUPE_TTL": 1}):
        [error] = check_ttls()
    assert error.id == "eventbus.E001" and "DEDUPE_TTL" in error.msg


def test_the_checks_are_registered():
    from django.core.checks import registry

    assert check_ttls in registry.registry.get_checks()


@pytest.mark.parametrize(
    "values, words",
    [
        ({"REDIS_URL": "redis+sentinel://s1:26379"}, "master name"),
        ({"REDIS_URL": "redis+sentinel://s1:26379/bus", "CLUSTER": True}, "not Sentinel-managed"),
    ],
)
def test_a_sentinel_url_the_bus_cannot_use_is_a_check_error(eventbus_settings_override, values, words):
    with eventbus_settings_override(**values):
        errors = check_redis_url()
    assert [e.id for e in errors] == ["eventbus.E007"] and words in errors[0].msg


@pytest.mark.parametrize(
    "values, words",
    [
        ({"WAIT_REPLICAS": -1}, "a number of replicas"),
        ({"WAIT_REPLICAS": "1"}, "a number of replicas"),
        ({"WAIT_REPLICAS": 1, "CLUSTER": True}, "not a Redis Cluster"),
    ],
)
def test_wait_replicas_the_bus_cannot_use_is_a_check_error(eventbus_settings_override, values, words):
    with eventbus_settings_override(**values):
        errors = check_redis_url()
    assert [e.id for e in errors] == ["eventbus.E008"] and words in errors[0].msg


def test_a_plain_or_well_formed_sentinel_url_passes(eventbus_settings_override):
    with eventbus_settings_override(REDIS_URL="redis+sentinel://s1:26379,s2:26380/bus/1"):
        assert check_redis_url() == []
    with eventbus_settings_override():
        assert check_redis_url() == []


def test_stage_retries_that_outwait_the_dedup_keys_are_an_error(eventbus_settings_override, monkeypatch):
    from eventbus.checks import check_stage_retries
    from eventbus.jobtypes import Stage

    from .jobtypes import FlakyJob

    with eventbus_settings_override():
        assert check_stage_retries() == []
    # 10 retries of 10 s doubling: up to 10 x 1023 x 1.2 s, past the 7200 s dedup keys.
    monkeypatch.setattr(FlakyJob, "stages", (Stage("pay", retries=10, backoff=10),))
    with eventbus_settings_override():
        [error] = check_stage_retries()
    assert error.id == "eventbus.E009" and "'flaky', stage 'pay'" in error.msg


@pytest.mark.parametrize(
    "cluster, release, expected",
    [
        (True, (7, 4, 0), ["eventbus.E010"]),  # no asyncio sharded pub/sub before 8.0
        (True, (8, 0, 0), []),
        (False, (6, 1, 0), []),  # a single master needs nothing newer
    ],
)
def test_a_cluster_needs_a_redis_py_with_asyncio_sharded_pubsub(
    eventbus_settings_override, monkeypatch, cluster, release, expected
):
    import exactly_once.internals

    monkeypatch.setattr(exactly_once.internals, "installed", lambda distribution: release)
    with eventbus_settings_override(CLUSTER=cluster):
        assert [error.id for error in check_cluster_client()] == expected
