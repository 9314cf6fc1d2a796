"""Django's internals behind one gate (docs/design/adapters.md): its ORM compiler, its request's body
internals and its transaction state.

Tested range: Django 5.2 to 6.1 (`Django>=5.2,<6.2`, the legs of the matrix in `noxfile.py`).
Within it, and unless `EXACTLY_ONCE_INTERNALS=off`, each function below takes its fast path;
otherwise its fallback, written against Django's public API. The path is decided once, when this
module is imported (`INTERNALS`).

- `unique_lookup` (TokenAuthentication, idempotency.authentication). Internals: a query's
  compiler (`query.get_compiler`, `as_sql`, `klass_info`, `get_converters`), the private
  `django.db.models.query.get_related_populators` and `Model.from_db`, to run the SQL Django
  compiled for the token's query the first time with each request's key as its one parameter.
  Why: DRF's TokenAuthentication builds and compiles that query on every request, measured
  in-process on PostgreSQL at 0.44 ms of CPU (0.1 ms of it the database round trip), half of
  what a cached replay cost; the compiled SQL takes 0.14 ms. Fallback: the ORM query itself,
  `model._default_manager.using(using).select_related(*related).get(field=value)` (None for
  DoesNotExist): the same objects, the same one query, compiled on every call.

- `request_body` (the fingerprint, idempotency.fingerprint). Internals: `request._body`,
  `_read_started`, `_post` (what was read of the body, and how) and `_stream` (read in chunks,
  then rewound, or replaced by a spooled copy). Why: a body over DATA_UPLOAD_MAX_MEMORY_SIZE is
  hashed as a stream with bounded memory and left for the view as if unread, so that any
  request that works without a key works with one (a view that streams a large upload).
  Fallback: `request.body` (Django keeps it readable for the view), `request.POST` and
  `request.FILES`. The trade: the public API cannot rewind a stream or put one back, so
  - a multipart/form-data POST declaring more than the memory limit is parsed by the
    fingerprint (`request.POST`, files spooled to disk by Django's upload handlers) and
    fingerprinted by its fields and files, as a form parsed by earlier code (the CSRF check)
    is: the view reads `request.POST` and `request.FILES`, not the raw stream, and cannot
    change `request.upload_handlers` any more. Its fingerprint is not the fast path's (the raw
    bytes'): a retry that straddles a change of path gets 422, never a second execution;
  - any other body over the limit (a form that declares no length included) is refused as
    `request.body` refuses it (Django's RequestDataTooBig, a 400): with a key, a view that
    streams a large raw body works only on the fast path (without a key it works as ever);
  - when the stream was read by earlier code, the body is taken as a parsed form only when
    `request.POST` or `request.FILES` holds something (an empty one may be a form Django could
    not parse any more): an empty parsed multipart form is refused as a stream read by earlier
    code is (BodyUnavailable), where the fast path fingerprints it as an empty form.

- `ends_transaction` (DatabaseStore.record_answer, idempotency.stores.db). Internals: the
  connection's `atomic_blocks` and `commit_on_exit`. Why: when the transaction is one outermost
  atomic block that Django will commit on exit, the answer's INSERT carries the COMMIT in its
  own message, one round trip fewer on every first request of an atomic view on PostgreSQL
  (psycopg's commit() then finds the transaction ended and sends nothing). Fallback: False,
  the INSERT without the COMMIT and Django's own COMMIT after it: correct, one round trip more.

- `in_transaction` (DatabaseStore.acquire's INSERT, in a savepoint inside a transaction).
  Internals: the connection's undocumented `in_atomic_block` (read until now through
  `transaction.get_connection`, "a private API" in Django's words). Why: an attribute read,
  not a call through `ensure_connection()`. Fallback: `not transaction.get_autocommit(using)`,
  true in an atomic block and in a transaction managed by hand (where a savepoint is what
  keeps the transaction usable after the conflict, too).

- `atomic_request_databases` (which databases ATOMIC_REQUESTS wraps a view in; the middleware
  runs the view itself, so it opens those transactions as Django's handler would). Internals:
  the view's `_non_atomic_requests`, set by `transaction.non_atomic_requests`, and
  `connections.settings`, as Django's `BaseHandler.make_view_atomic` reads them. No public API
  says whether a view was marked non-atomic, so there is no fallback: both paths read them, and
  the tests check that the public decorator's mark is still seen (a Django that moves it fails
  the matrix instead of running a non-atomic view in a transaction).
"""

from __future__ import annotations

import enum
import functools
import tempfile
import uuid
from collections.abc import Callable, Iterator

from django.db import connections, transaction
from django.http import RawPostDataException
from django.utils.inspect import func_supports_parameter

from exactly_once.internals import internals

INTERNALS = internals("django", "Django", "5.2", "6.2")


# ORM compiler -----------------------------------------------------------------------------------


class UniqueLookup:
    """`model.objects.select_related(*related).get(<field>=value)` on a unique field, the object
    or None, with `model`'s default manager on database `using`: the public API's query."""

    def __init__(self, model, field: str, related: tuple[str, ...], using: str):
        self.model, self.field, self.related, self.using = model, field, related, using

    def get(self, value):
        """The object, or None when no row has that value."""
        queryset = self.model._default_manager.using(self.using).select_related(*self.related)
        try:
            return queryset.get(**{self.field: value})
        except self.model.DoesNotExist:
            return None


class CompiledLookup(UniqueLookup):
    """UniqueLookup with the SQL and the row-to-objects plan of its first compilation.

    Django has no public API for a compiled query: this follows what its ModelIterable does
    with a compiler (django.db.models.query, Django 5.2), minus the compiling. The tests run it
    on SQLite and PostgreSQL against the ORM's own answers."""

    # Stands for the value while the query is compiled (a string: the field prepares it).
    _SLOT = f"prepared-lookup-slot-{uuid.uuid4().hex}"

    def __init__(self, model, field: str, related: tuple[str, ...], using: str):
        from django.db.models.query import get_related_populators

        super().__init__(model, field, related, using)
        queryset = model._default_manager.using(using).select_related(*related).filter(**{field: self._SLOT})
        compiler = queryset.query.get_compiler(using=using)
        self.sql, params = compiler.as_sql()  # also fills compiler.select and klass_info
        [self.slot] = [i for i, param in enumerate(params) if param == self._SLOT]
        self.params = list(params)
        select, klass_info = compiler.select, compiler.klass_info
        self.model = klass_info["model"]
        fields = klass_info["select_fields"]
        self.start, self.end = fields[0], fields[-1] + 1
        self.init_list = [column[0].target.attname for column in select[self.start : self.end]]
        self.converters = compiler.get_converters([column[0] for column in select])
        # Django 6.1 gave querysets a fetch mode (how deferred and related objects load), which
        # its populators and from_db() take; 5.2 and 6.0 have neither.
        fetch_mode = getattr(queryset, "_fetch_mode", None)
        if fetch_mode is None:
            self.populators = get_related_populators(klass_info, select, using)  # type: ignore[call-arg]
            self.from_db = self.model.from_db
        else:
            self.populators = get_related_populators(klass_info, select, using, fetch_mode)
            if func_supports_parameter(self.model.from_db, "fetch_mode"):
                self.from_db = functools.partial(self.model.from_db, fetch_mode=fetch_mode)
            else:  # a model's own from_db() of the older signature
                self.from_db = self.model.from_db

    def get(self, value):
        params = list(self.params)
        params[self.slot] = value
        with connections[self.using].cursor() as cursor:
            cursor.execute(self.sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        if self.converters:
            # As SQLCompiler.apply_converters, with this thread's connection.
            connection, row = connections[self.using], list(row)
            for position, (converters, expression) in self.converters.items():
                value = row[position]
                for converter in converters:
                    value = converter(value, expression, connection)
                row[position] = value
        obj = self.from_db(self.using, self.init_list, row[self.start : self.end])
        for populator in self.populators:
            populator.populate(row, obj)
        return obj


# Request body -----------------------------------------------------------------------------------


class Body(enum.Enum):
    """What `request_body` finds when it gives no bytes and no stream to read."""

    FORM = "form"  # parsed as a form: fingerprint request.POST and request.FILES
    GONE = "gone"  # read as a stream by code before: nothing left to fingerprint


def _fits_in_memory(request, limit: int) -> bool:
    stream = request._stream
    if hasattr(stream, "seekable") and stream.seekable():
        # ASGI: Django spooled the body already; its real size counts (a chunked request
        # declares none).
        start = stream.tell()
        size = stream.seek(0, 2) - start
        stream.seek(start)
    else:
        try:
            size = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return False
    return size <= limit


def _unread_stream(request, limit: int, chunk: int) -> Iterator[bytes]:
    """The unread stream in chunks. Once read to its end, the request has an equivalent unread
    stream again: ASGI's spooled body rewound, or (WSGI's is one pass) a spooled copy."""
    stream = request._stream
    seekable = hasattr(stream, "seekable") and stream.seekable()
    start = stream.tell() if seekable else 0
    copy = None if seekable else tempfile.SpooledTemporaryFile(max_size=limit)  # noqa: SIM115 (it becomes the request's stream)
    while data := stream.read(chunk):
        if copy is not None:
            copy.write(data)
        yield data
    if copy is None:
        stream.seek(start)
    else:
        copy.seek(0)
        request._stream = copy


def _request_body_internals(request, memory_limit: Callable[[], int], chunk: int):
    if hasattr(request, "_body"):
        return request._body
    if not request._read_started:
        if _fits_in_memory(request, memory_limit()):
            return request.body
        return _unread_stream(request, memory_limit(), chunk)
    if hasattr(request, "_post"):
        return Body.FORM
    return Body.GONE


def _parsed_form(request) -> Body:
    # Parses the form now unless code before did; empty after a read of the raw stream.
    return Body.FORM if request.POST or request.FILES else Body.GONE


def _request_body_public(request, memory_limit: Callable[[], int], chunk: int):
    form = request.method == "POST" and request.content_type == "multipart/form-data"
    if form:
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0  # request.body refuses it as Django does
        if declared > memory_limit():
            return _parsed_form(request)
    try:
        return request.body  # RequestDataTooBig (400) for another body over the limit
    except RawPostDataException:
        return _parsed_form(request) if form else Body.GONE


# Transaction state ------------------------------------------------------------------------------


def _ends_transaction_internals(connection) -> bool:
    return len(connection.atomic_blocks) == 1 and connection.commit_on_exit


def _ends_transaction_public(connection) -> bool:
    return False


def _in_transaction_internals(using: str) -> bool:
    return connections[using].in_atomic_block


def _in_transaction_public(using: str) -> bool:
    return not transaction.get_autocommit(using)


def atomic_request_databases(view_func) -> list[str]:
    """The databases Django's handler would run `view_func` in a transaction on: those with
    ATOMIC_REQUESTS, but for those the view is marked non-atomic on (both paths: see above)."""
    non_atomic: set[str] = getattr(view_func, "_non_atomic_requests", set())
    return [
        alias
        for alias, s in connections.settings.items()
        if s.get("ATOMIC_REQUESTS") and alias not in non_atomic
    ]


# The paths, chosen once -------------------------------------------------------------------------

unique_lookup: type[UniqueLookup]
"""unique_lookup(model, field, related, using).get(value): the object with that unique value
(related objects selected), or None."""

request_body: Callable[[object, Callable[[], int], int], bytes | Iterator[bytes] | Body]
"""request_body(request, memory_limit, chunk): the body to fingerprint, leaving it readable for
the view: bytes (in memory); or an iterator of chunks that must be read to its end, after which
the view reads the body as if unread; or Body.FORM, Body.GONE. Bodies over memory_limit() may
raise Django's RequestDataTooBig (the fallback)."""

ends_transaction: Callable[[object], bool]
"""ends_transaction(connection): whether the transaction Django has open on `connection` is one
outermost atomic block that Django will commit on exit: then its last statement may carry the
COMMIT itself. Always False on the fallback."""

in_transaction: Callable[[str], bool]
"""in_transaction(using): whether the connection `using` is inside a transaction (an atomic
block), where a statement that may fail needs a savepoint to leave the transaction usable."""

if INTERNALS:
    unique_lookup = CompiledLookup
    request_body = _request_body_internals
    ends_transaction = _ends_transaction_internals
    in_transaction = _in_transaction_internals
else:
    unique_lookup = UniqueLookup
    request_body = _request_body_public
    ends_transaction = _ends_transaction_public
    in_transaction = _in_transaction_public
