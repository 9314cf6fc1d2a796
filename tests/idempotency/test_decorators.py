import pytest

from eventbus.models import Job
from idempotency.decorators import GLOBAL, idempotent
from idempotency.exceptions import IdempotencyInProgress, IdempotencyKeyMismatch
from idempotency.keys import IdemKey
from idempotency.models import IdempotencyRecord

pytestmark = pytest.mark.django_db(transaction=True)
calls: list = []


@idempotent(operation="charge", scope=GLOBAL)
def charge(*, invoice_id, amount, idempotency_key):
    calls.append(invoice_id)
    Job.objects.create(
        scope="charge", idem_key=f"{invoice_id}-{len(calls)}", domain="scan", event_type="charge"
    )
    if amount < 0:
        raise ValueError("negative amount")
    return {"charged": amount, "call": len(calls)}


@pytest.fixture(autouse=True)
def reset():
    calls.clear()


def test_second_call_returns_the_first_result_without_running():
    first = charge(invoice_id=1, amount=10, idempotency_key="c-1")
    again = charge(invoice_id=1, amount=10, idempotency_key=IdemKey("c-1"))
    assert first == again == {"charged": 10, "call": 1}
    assert calls == [1]


def test_other_arguments_under_a_used_key_raise_mismatch():
    charge(invoice_id=1, amount=10, idempotency_key="c-2")
    with pytest.raises(IdempotencyKeyMismatch):
        charge(invoice_id=1, amount=11, idempotency_key="c-2")


def test_exception_is_not_stored_and_effects_roll_back():
    for _ in range(2):
        with pytest.raises(ValueError):
            charge(invoice_id=2, amount=-1, idempotency_key="c-3")
    assert calls == [2, 2]
    assert not Job.objects.filter(event_type="charge").exists()
    assert IdempotencyRecord.objects.get(key="c-3").state == "FAILED"


def test_in_flight_call_raises_with_retry_after():
    @idempotent(operation="reentrant", scope=GLOBAL, key=lambda n: f"n-{n}")
    def reenter(n):
        with pytest.raises(IdempotencyInProgress) as info:
            reenter(n)
        return info.value.retry_after

    assert reenter(1) >= 1


def test_missing_key_and_unserialisable_results_are_clear_errors():
    with pytest.raises(TypeError, match="idempotency_key"):
        charge(invoice_id=1, amount=1)

    @idempotent(operation="bad", scope=GLOBAL, key=lambda: "b")
    def bad():
        return object()

    with pytest.raises(TypeError, match="JSON-serialisable"):
        bad()


def test_operations_have_separate_keyspaces():
    @idempotent(operation="other", scope=GLOBAL)
    def other(*, idempotency_key):
        calls.append("other")
        return "other"

    charge(invoice_id=3, amount=1, idempotency_key="same")
    assert other(idempotency_key="same") == "other"


@pytest.mark.parametrize(
    "missing",
    [
        {"idempotency_key": None},
        {"idempotency_key": b"bytes-are-not-a-key"},
    ],
)
def test_a_missing_or_unusable_key_is_refused_before_running(missing):
    from idempotency.keys import InvalidKey

    with pytest.raises(InvalidKey, match="charge"):
        charge(invoice_id=5, amount=1, **missing)
    assert calls == [] and not IdempotencyRecord.objects.exists()


def test_a_key_callable_returning_none_is_refused():
    from idempotency.keys import InvalidKey

    @idempotent(operation="by-field", scope=GLOBAL, key=lambda order: order.get("ref"))
    def ship(order):
        calls.append(order["n"])
        return order["n"]

    for n in (1, 2):  # two unrelated calls without a reference never share a key
        with pytest.raises(InvalidKey, match="None"):
            ship({"n": n})
    assert calls == []


def test_an_empty_scope_is_refused():
    from django.core.exceptions import ImproperlyConfigured

    @idempotent(operation="tenanted", scope=lambda *, tenant, idempotency_key: tenant)
    def act(*, tenant, idempotency_key):
        calls.append(tenant)

    with pytest.raises(ImproperlyConfigured, match="non-empty"):
        act(tenant="", idempotency_key="t-1")
    assert calls == []


def test_contradictory_markers_on_one_view_are_refused_at_import():
    from django.core.exceptions import ImproperlyConfigured
    from django.views.decorators.csrf import csrf_exempt

    from idempotency.decorators import idempotency_key

    with pytest.raises(ImproperlyConfigured, match="contradictory"):

        @idempotency_key("exempt")
        @csrf_exempt
        @idempotency_key("required")
        def view(request):
            pass

    @idempotency_key("required")
    @idempotency_key("required")
    def same_twice(request):  # the same marker twice says one thing: allowed
        pass

    from rest_framework.views import APIView

    @idempotency_key("required")
    class Base(APIView):
        pass

    @idempotency_key("exempt")
    class Child(Base):  # a subclass may override what it inherits
        pass

    assert Child.idempotency_policy.mode == "exempt" and Base.idempotency_policy.mode == "required"


def test_a_decorator_without_a_scope_is_refused_with_how_to_fix_it():
    """Keys are scoped (docs/reference/idempotency.md): without a scope a key that comes from a user would replay one
    user's result to another, so no scope is not a default but an error, at decoration time."""
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured) as info:

        @idempotent(operation="unscoped")
        def unscoped(*, idempotency_key):
            calls.append("ran")

    message = str(info.value)
    assert "unscoped" in message and "scope=" in message and "GLOBAL" in message
    assert calls == []


def test_two_owners_with_the_same_key_get_their_own_results(user, other_user):
    @idempotent(operation="pay", scope="owner")
    def pay(*, owner, amount, idempotency_key):
        calls.append(owner.username)
        return {"payer": owner.username, "amount": amount, "call": len(calls)}

    alice = pay(owner=user, amount=5, idempotency_key="order-1")
    bob = pay(owner=other_user, amount=5, idempotency_key="order-1")
    assert alice == {"payer": "alice", "amount": 5, "call": 1}
    assert bob == {"payer": "bob", "amount": 5, "call": 2}
    assert pay(owner=user, amount=5, idempotency_key="order-1") == alice  # each replays its own
    assert pay(owner=other_user, amount=5, idempotency_key="order-1") == bob
    assert calls == ["alice", "bob"]
    assert set(IdempotencyRecord.objects.values_list("scope", flat=True)) == {
        f"fn:pay:auth.user%3A{user.pk}",
        f"fn:pay:auth.user%3A{other_user.pk}",
    }


@pytest.mark.parametrize("owner, scope", [("tenant-7", "fn:by-id:tenant-7"), (42, "fn:by-id:42")])
def test_an_owner_given_as_a_string_or_number_is_the_scope_itself(owner, scope):
    @idempotent(operation="by-id", scope="account")
    def act(*, account, idempotency_key):
        calls.append(account)
        return len(calls)

    assert act(account=owner, idempotency_key="k") == act(account=owner, idempotency_key="k") == 1
    assert IdempotencyRecord.objects.get().scope == scope


@pytest.mark.parametrize("owner", [None, True, 1.5, object()])
def test_an_owner_that_names_nobody_is_refused_before_running(owner):
    @idempotent(operation="owned", scope="owner")
    def act(*, owner, idempotency_key):
        calls.append(owner)

    with pytest.raises(TypeError, match="owner"):
        act(owner=owner, idempotency_key="k")
    with pytest.raises(TypeError, match="owner"):
        act(idempotency_key="k")  # the owner's keyword argument is missing
    assert calls == [] and not IdempotencyRecord.objects.exists()


def test_an_unsaved_owner_is_refused(django_user_model):
    @idempotent(operation="owned", scope="owner")
    def act(*, owner, idempotency_key):
        calls.append(owner)

    with pytest.raises(ValueError, match="unsaved"):
        act(owner=django_user_model(username="nobody"), idempotency_key="k")
    assert calls == []


def test_global_is_one_keyspace_for_system_generated_keys():
    @idempotent(operation="stage-effect", scope=GLOBAL)
    def effect(*, idempotency_key):
        calls.append(idempotency_key)
        return len(calls)

    assert effect(idempotency_key="job-1:pay") == effect(idempotency_key="job-1:pay") == 1
    assert IdempotencyRecord.objects.get().scope == "fn:stage-effect"


@pytest.mark.parametrize("scope", ["", "not an identifier", 42])
def test_a_scope_that_is_neither_a_keyword_a_callable_nor_global_is_refused(scope):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="scope"):
        idempotent(operation="odd", scope=scope)


def test_scopes_whose_parts_hold_colons_never_collide():
    """Operation "x" for owner "y:z" and operation "x:y" for owner "z" are two keyspaces."""
    calls = []

    def make(operation):
        @idempotent(operation=operation, scope="owner")
        def act(*, owner, idempotency_key):
            calls.append(operation)
            return operation

        return act

    assert make("x")(owner="y:z", idempotency_key="k") == "x"
    assert make("x:y")(owner="z", idempotency_key="k") == "x:y"
    assert calls == ["x", "x:y"]
    assert IdempotencyRecord.objects.filter(key="k").count() == 2


def test_a_tenant_holding_a_colon_is_not_another_tenants_principal():
    from idempotency.scope import join_scope

    assert join_scope("a:b", "c") != join_scope("a", "b:c")
    assert join_scope("-", "42") == "-:42"  # unchanged for the default tenant and a pk
