"""No import circles between the modules of the three apps, and each app's public API in its
`__init__`: every name listed resolves, and importing the packages loads nothing else.

The import graph is read from the source (`ast`), not from what a run happened to import:
every `import` counts, at module level, inside a function (a lazy import is still a circle) or
under `if TYPE_CHECKING:`, and so does `importlib.import_module`, `import_string` or
`__import__` of a literal module path. Relative imports are resolved; `from pkg import name`
imports the module `pkg.name` when there is one, else `pkg`. Importing a module imports its
parent packages too, so those count as well (a module's own packages excepted: being inside a
package is not importing it).

A package `__init__` is a module like the others: its own imports are its edges. Its lazy
exports (`_EXPORTS`, names to the modules defining them, imported by `__getattr__` on first
use) are strings, not imports; but `from eventbus import start_job`, or `eventbus.start_job`
after `import eventbus`, runs that import, so it counts as an import of the defining module
(eventbus.services), never of the package alone.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.processes import BASE_DIR

APPS = ("idempotency", "eventbus", "gateway")
# The shared core (not a Django app): what the three apps use and none of them owns.
CORE = "exactly_once"
PACKAGES = (CORE, *APPS)
# The floors: a package imports only those below it. The core imports none of the apps, the key
# layer neither the bus nor the gateway, the bus not the gateway (docs/howto/develop.md, Layout).
NOT_IMPORTED_BY = {
    CORE: APPS,
    "idempotency": ("eventbus", "gateway"),
    "eventbus": ("gateway",),
    "gateway": (),
}
DYNAMIC_IMPORTS = {"import_module", "import_string", "__import__"}


class Source:
    """The modules of some packages under `root` (migrations excepted), by dotted name."""

    def __init__(self, root: Path, packages: tuple[str, ...]):
        self.paths: dict[str, Path] = {}
        self.packages: set[str] = set()
        for package in packages:
            for path in sorted((root / package).rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                if "migrations" in parts:
                    continue
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                    self.packages.add(".".join(parts))
                self.paths[".".join(parts)] = path
        self._exports: dict[str, dict[str, str]] = {}

    def exports(self, package: str) -> dict[str, str]:
        """The package's lazy exports: `_EXPORTS = {name: defining module}` in its __init__."""
        if package not in self._exports:
            found: dict[str, str] = {}
            if package in self.packages:
                for node in ast.parse(self.paths[package].read_text()).body:
                    if isinstance(node, ast.Assign) and any(
                        isinstance(target, ast.Name) and target.id == "_EXPORTS" for target in node.targets
                    ):
                        found = ast.literal_eval(node.value)
            self._exports[package] = found
        return self._exports[package]

    def module_of(self, dotted: str) -> str | None:
        """The longest prefix of `dotted` that is one of these modules."""
        parts = dotted.split(".")
        for end in range(len(parts), 0, -1):
            if (name := ".".join(parts[:end])) in self.paths:
                return name
        return None

    def member(self, module: str, name: str) -> str:
        """What `from module import name` imports: a submodule, an exported name's module, or
        the module itself."""
        if f"{module}.{name}" in self.paths:
            return f"{module}.{name}"
        return self.exports(module).get(name, module)

    def imports(self, name: str) -> list[tuple[str, int]]:
        """(module imported, line) for every import in module `name` of a module of these
        packages, implied parent packages included."""
        tree = ast.parse(self.paths[name].read_text())
        here = name if name in self.packages else name.rpartition(".")[0]
        found: list[tuple[str, int]] = []
        bound: dict[str, str] = {}  # a local name -> the module `import x.y [as z]` bound to it

        def add(dotted: str, line: int) -> None:
            """The module `dotted` names, and the parent packages that run before it (a
            module's own packages excepted: being inside a package is not importing it)."""
            module = self.module_of(dotted)
            if module is None:
                return
            if module != name:
                found.append((module, line))
            parents = module.split(".")[:-1]
            for end in range(1, len(parents) + 1):
                parent = ".".join(parents[:end])
                if parent in self.paths and not name.startswith(parent + "."):
                    found.append((parent, line))

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node.lineno)
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        top = alias.name.partition(".")[0]
                        bound[top] = top
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    module = ".".join([*parts, node.module] if node.module else parts)
                else:
                    module = node.module or ""
                for alias in node.names:
                    target = module if alias.name == "*" else self.member(module, alias.name)
                    add(target, node.lineno)
                    bound[alias.asname or alias.name] = target
            elif isinstance(node, ast.Call):
                function = node.func
                called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
                first = node.args[0] if node.args else None
                if (
                    called in DYNAMIC_IMPORTS
                    and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                ):
                    add(first.value, node.lineno)
        # `eventbus.start_job` after `import eventbus`: the exported name's module is imported.
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                chain: list[str] = []
                value: ast.expr = node
                while isinstance(value, ast.Attribute):
                    chain.insert(0, value.attr)
                    value = value.value
                used = bound.get(value.id, "") if isinstance(value, ast.Name) else ""
                if used in self.paths:
                    for attr in chain:
                        if (reached := self.member(used, attr)) == used:
                            break
                        used = reached
                    add(used, node.lineno)
        return found

    def graph(self) -> dict[str, dict[str, int]]:
        """module -> {module it imports: first line that does}."""
        edges: dict[str, dict[str, int]] = {}
        for name in self.paths:
            targets: dict[str, int] = {}
            for target, line in sorted(self.imports(name), key=lambda edge: edge[1]):
                targets.setdefault(target, line)
            edges[name] = targets
        return edges


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    edges = [
        f"  {source}:{line} -> {target}"
        for source in component
        for target, line in sorted(graph[source].items())
        if target in component
    ]
    return " <-> ".join(component) + "\n" + "\n".join(edges)


def test_no_import_circles_between_the_apps_modules():
    source = Source(BASE_DIR, PACKAGES)
    assert {"exactly_once.conf", "idempotency.stores.base", "eventbus.jobtypes", "gateway.consumers"} <= set(
        source.paths
    )
    graph = source.graph()
    found = circles(graph)
    assert not found, "Import circles (module:line -> module):\n" + "\n".join(
        describe(graph, component) for component in found
    )


def floor_breaches(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import that runs up a floor (NOT_IMPORTED_BY), as "module:line -> module"."""
    return [
        f"{source}:{line} -> {target}"
        for source, targets in sorted(graph.items())
        for target, line in sorted(targets.items())
        if target.partition(".")[0] in NOT_IMPORTED_BY.get(source.partition(".")[0], ())
    ]


def test_imports_run_down_the_floors_only():
    """The shared core imports none of the apps; idempotency neither eventbus nor the gateway;
    eventbus not the gateway. Lazy, typing-only and dynamic imports count as in the circles'
    check."""
    source = Source(BASE_DIR, PACKAGES)
    breaches = floor_breaches(source.graph())
    assert not breaches, "Imports up a floor (module:line -> module):\n" + "\n".join(breaches)


def test_the_floor_check_can_fail(tmp_path):
    write(
        tmp_path,
        {
            "exactly_once/__init__.py": "",
            "exactly_once/conf.py": "def f():\n    from idempotency import keys\n",
            "idempotency/__init__.py": "",
            "idempotency/keys.py": "from exactly_once import conf\n",
            "eventbus/__init__.py": "",
            "eventbus/jobs.py": 'import importlib\nimportlib.import_module("gateway.api")\n',
            "gateway/__init__.py": "",
            "gateway/api.py": "from eventbus import jobs\nfrom exactly_once import conf\n",
        },
    )
    graph = Source(tmp_path, PACKAGES).graph()
    assert floor_breaches(graph) == [
        "eventbus.jobs:2 -> gateway",
        "eventbus.jobs:2 -> gateway.api",
        "exactly_once.conf:2 -> idempotency",
        "exactly_once.conf:2 -> idempotency.keys",
    ]


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_check_finds_lazy_typing_relative_exported_and_dynamic_circles(tmp_path):
    """The check itself can fail: each way of importing closes a circle here."""
    write(
        tmp_path,
        {
            "one/__init__.py": "",
            "one/migrations/__init__.py": "",
            "one/migrations/0001_initial.py": "from one import lazy\n",
            # A function-level import, and one under TYPE_CHECKING.
            "one/lazy.py": "def f():\n    from .typed import T\n",
            "one/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from one.lazy import f\n",
            # Through another package's lazy exports: by `from`, and by attribute.
            "two/__init__.py": '_EXPORTS = {"thing": "two.defines", "other": "two.back"}\n',
            "two/defines.py": "from one import user\n",
            "one/user.py": "from two import thing\n",
            "one/attribute.py": "import two\n\ndef g():\n    return two.other\n",
            "two/back.py": "from one import attribute\n",
            # A literal dynamic import; a name taken from the module's own package.
            "one/sub/__init__.py": "from . import dynamic\nHELPER = 1\n",
            "one/sub/dynamic.py": 'import importlib\nimportlib.import_module("one.sub.other")\n',
            "one/sub/other.py": "from . import HELPER\n",
            # No circle: imports one way only, and a submodule's own packages.
            "one/plain.py": "import one.sub.other\nfrom one import typed\n",
        },
    )
    graph = Source(tmp_path, ("one", "two")).graph()
    assert "one.migrations.0001_initial" not in graph
    assert graph["one.plain"].keys() == {"one.sub", "one.sub.other", "one.typed"}
    assert graph["one.attribute"].keys() == {"two", "two.back"}
    assert graph["one.user"].keys() == {"two", "two.defines"}
    assert circles(graph) == [
        ["one.attribute", "two.back"],
        ["one.lazy", "one.typed"],
        ["one.sub", "one.sub.dynamic", "one.sub.other"],
        ["one.user", "two.defines"],
    ]


# The gateway asks the event bus through its public face -----------------------------------------

# What of eventbus the gateway may import: the package (names in its __all__: the job services,
# InvalidPayload...), the reads of jobs (selectors), the pub/sub entry (pubsub), the Job model
# and its states (models: the serializers' choices, typing), the job services' errors
# (exceptions: JobServiceError, the base the API turns into a problem) and the job-type API
# (jobtypes: registry() and FINAL_STAGE, for the request's choices and the page). Nothing of its
# Redis plumbing, runs or stages: those move without the gateway noticing.
GATEWAY_MAY_IMPORT = {
    "eventbus",
    "eventbus.selectors",
    "eventbus.pubsub",
    "eventbus.models",
    "eventbus.exceptions",
    "eventbus.jobtypes",
}


class WrittenSource(Source):
    """The imports as written: `from eventbus import start_job` imports the package `eventbus`
    (its lazy export's module is the package's business, not the importer's)."""

    def exports(self, package: str) -> dict[str, str]:
        return {}


def stray_imports(source: Source, app: str, other: str, allowed: set[str]) -> list[str]:
    """Every import (module level, in a function, under TYPE_CHECKING, dynamic) of a module of
    `other` by a module of `app` that is not in `allowed`, as "module:line -> module"."""
    return [
        f"{name}:{line} -> {target}"
        for name, targets in sorted(source.graph().items())
        if name.partition(".")[0] == app
        for target, line in sorted(targets.items())
        if target.partition(".")[0] == other and target not in allowed
    ]


def test_the_gateway_imports_only_the_event_bus_public_face():
    source = WrittenSource(BASE_DIR, APPS)
    assert {"eventbus.pubsub", "eventbus.selectors", "gateway.hub"} <= set(source.paths)
    stray = stray_imports(source, "gateway", "eventbus", GATEWAY_MAY_IMPORT)
    assert not stray, "gateway imports eventbus past its public face:\n" + "\n".join(stray)


def test_the_public_face_check_finds_every_kind_of_import(tmp_path):
    """The check itself can fail: a module-level, function-level, TYPE_CHECKING, dynamic and
    attribute import of a module outside the allowed ones, and a parent package, each counts."""
    write(
        tmp_path,
        {
            "bus/__init__.py": '_EXPORTS = {"start": "bus.services"}\n',
            "bus/services.py": "",
            "bus/public.py": "",
            "bus/inner/__init__.py": "",
            "bus/inner/plumbing.py": "",
            "web/__init__.py": "",
            "web/fine.py": "from bus import start\nfrom bus.public import x\nimport bus\n",
            "web/top.py": "from bus.services import start\n",
            "web/lazy.py": "def f():\n    from bus.inner import plumbing\n",
            "web/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import bus.services\n",
            "web/dynamic.py": 'import importlib\nimportlib.import_module("bus.inner.plumbing")\n',
        },
    )
    stray = stray_imports(WrittenSource(tmp_path, ("bus", "web")), "web", "bus", {"bus", "bus.public"})
    assert stray == [
        "web.dynamic:2 -> bus.inner",
        "web.dynamic:2 -> bus.inner.plumbing",
        "web.lazy:2 -> bus.inner",
        "web.lazy:2 -> bus.inner.plumbing",
        "web.top:1 -> bus.services",
        "web.typed:3 -> bus.services",
    ]


# The public API ----------------------------------------------------------------------------------

# What the README's "Use it in your project", "Idempotency in your own Django project" and
# "Operating jobs" sections and the smoke project import: each app's API must list them.
USED = {
    "idempotency": {
        "idempotency_key",
        "idempotent",
        "GLOBAL",
        "IdempotencyMiddleware",
        "accept_once",
        "IdemKey",
    },
    "eventbus": {"JobType", "Stage", "register", "InvalidPayload", "JobFailed", "start_job", "publish_event"},
    "gateway": {"JobStreamApplication"},
}


@pytest.mark.parametrize("app", APPS)
def test_every_name_of_an_apps_api_resolves_to_where_it_is_defined(app):
    package = importlib.import_module(app)
    exports = package._EXPORTS
    assert package.__all__ == list(exports) and USED[app] <= set(exports)
    for name, module in exports.items():
        value = getattr(package, name)
        assert value is getattr(importlib.import_module(module), name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == module, f"{app}.{name} is defined in {value.__module__}, not {module}"
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        package.nothing  # noqa: B018


@pytest.mark.processes
def test_importing_the_apps_loads_nothing_else_before_django_is_set_up():
    """Django imports the app packages (INSTALLED_APPS) before its app registry is ready, and a
    settings module may import them (and the shared core): no models, settings, Redis client or
    other module of ours."""
    code = (
        "import json, sys; import exactly_once, idempotency, eventbus, gateway; "
        "from django.conf import settings; "
        "print(json.dumps([sorted(sys.modules), settings.configured]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    modules, configured = json.loads(done.stdout)
    assert not configured
    ours = [m for m in modules if m.partition(".")[0] in PACKAGES]
    assert ours == sorted(PACKAGES)
    assert not [
        m for m in modules if m.partition(".")[0] in ("redis", "celery", "channels", "rest_framework")
    ]
    assert not [m for m in modules if m.startswith(("django.db", "django.apps", "django.contrib"))]


def test_the_old_paths_users_import_are_the_rooms_objects():
    """eventbus in rooms: the paths the docs named before the move still give the same objects."""
    from eventbus.bus import publish
    from eventbus.job import stages
    from eventbus.publish import publish_event, publish_events
    from eventbus.redis import sentinel
    from eventbus.sentinel import celery_broker, django_redis_cache
    from eventbus.stages import StageContext

    assert (publish_event, publish_events) == (publish.publish_event, publish.publish_events)
    assert (celery_broker, django_redis_cache) == (sentinel.celery_broker, sentinel.django_redis_cache)
    assert StageContext is stages.StageContext
