from django.test import RequestFactory

from idempotency.fingerprint import canonical_body, canonical_query, request_fingerprint

rf = RequestFactory()


def fp(path="/x/", data=b"", content_type="application/json", method="post"):
    return request_fingerprint(getattr(rf, method)(path, data=data, content_type=content_type))


def test_json_bodies_are_canonical():
    assert fp(data=b'{"a": 1, "b": [1, 2]}') == fp(data=b'{"b":[1,2],"a":1}')
    assert fp(data=b'{"a": 1}') != fp(data=b'{"a": 2}')


def test_query_order_does_not_matter_but_values_do():
    assert canonical_query("b=2&a=1&a=0") == canonical_query("a=0&a=1&b=2")
    assert fp("/x/?b=2&a=1") == fp("/x/?a=1&b=2")
    assert fp("/x/?a=1") != fp("/x/?a=2")


def test_method_path_and_raw_bodies_count():
    assert fp(method="post") != fp(method="patch")
    assert fp("/x/") != fp("/y/")
    assert fp(data=b"raw", content_type="text/plain") != fp(data=b"raw2", content_type="text/plain")
    # Not JSON after all: the raw bytes identify it, no error.
    assert canonical_body(b"{not json", "application/json") == b"{not json"
    assert canonical_body(b"[" * 100_000, "application/json") == b"[" * 100_000
