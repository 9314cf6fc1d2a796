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
    source = Source(BASE_DIR, APPS)
    assert {"idempotency.stores.base", "eventbus.jobtypes", "gateway.consumers"} <= set(source.paths)
    graph = source.graph()
    found = circles(graph)
    assert not found, "Import circles (module:line -> module):\n" + "\n".join(
        describe(graph, component) for component in found
    )


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
    settings module may import them: no models, settings, Redis client or other module of ours."""
    code = (
        "import json, sys; import idempotency, eventbus, gateway; "
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
    ours = [m for m in modules if m.partition(".")[0] in APPS]
    assert ours == sorted(APPS)
    assert not [
        m for m in modules if m.partition(".")[0] in ("redis", "celery", "channels", "rest_framework")
    ]
    assert not [m for m in modules if m.startswith(("django.db", "django.apps", "django.contrib"))]
