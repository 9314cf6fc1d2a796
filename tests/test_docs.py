"""The README and the documentation site's pages, read as files (no server, no Sphinx build: `make
docs` builds the site, with warnings as errors): the README stays short, every relative link
leads to a file that exists, and every block of the tutorial is one the smoke test runs
(`make smoke`, tests/smoke/smoke.py); the other pages' blocks, by tests/docs/. Nothing cites a
document outside the repository, and the models reference names every column."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
DOCS = BASE_DIR / "docs"
PAGES = sorted(path for path in DOCS.rglob("*.md") if "_build" not in path.parts)
FENCED = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
INCLUDE = re.compile(r"^```\{(?:include|literalinclude)\}\s+(\S+)", re.MULTILINE)
SMOKE_TAG = re.compile(r"<!-- smoke: [^>]+ -->\s*\n$")


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file, outside its fenced blocks."""
    return LINK.findall(FENCED.sub("", path.read_text()))


def test_the_docs_exist():
    names = {path.relative_to(DOCS).as_posix() for path in PAGES}
    assert {"index.md", "tutorial.md", "changelog.md"} <= names
    assert {"howto", "reference", "design"} <= {name.split("/")[0] for name in names}


def test_the_readme_is_at_most_300_lines():
    lines = (BASE_DIR / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move the detail into docs/"


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file whose file does not exist."""
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # another site (https:, mailto:), or a heading of the same page
        if not (path.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    return broken


@pytest.mark.parametrize("path", [BASE_DIR / "README.md", *PAGES], ids=lambda p: str(p.relative_to(BASE_DIR)))
def test_every_relative_link_leads_to_a_file(path):
    broken = broken_links(path)
    assert not broken, f"{path.name} links to files that do not exist: {broken}"


def test_a_link_to_a_missing_file_is_found(tmp_path):
    """The check above can fail; links inside code blocks are code, not links."""
    (tmp_path / "there.md").write_text("# There\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[a](missing.md#x) [b](there.md#there) [c](https://example.com) [d](#here)\n"
        "```\n[e](in-code.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md#x"]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(BASE_DIR)))
def test_every_included_file_exists(path):
    missing = [target for target in INCLUDE.findall(path.read_text()) if not (path.parent / target).exists()]
    assert not missing, f"{path.name} includes files that do not exist: {missing}"


def test_every_block_of_the_tutorial_is_tagged_for_the_smoke_test():
    text = (DOCS / "tutorial.md").read_text()
    blocks = list(FENCED.finditer(text))
    assert len(blocks) >= 10
    untagged = [
        block.group(0).splitlines()[1] for block in blocks if not SMOKE_TAG.search(text[: block.start()])
    ]
    assert not untagged, f"blocks of docs/tutorial.md without a <!-- smoke: ... --> tag above: {untagged}"
    # The tags the smoke test knows (tests/smoke/smoke.py runs each).
    tags = re.findall(r"<!-- smoke: ([^>]+?) -->", text)
    kinds = {tag.split()[0] for tag in tags}
    assert kinds <= {"install", "write", "append", "sh", "run", "output"}, kinds
    assert tags.count("install") == 1 and "run development" in tags and "run production" in tags


def test_the_tutorials_redis_keeps_clear_of_one_on_6379_and_of_the_project():
    """Debian's redis-server package runs a Redis on 6379: the tutorial's own runs on the port
    its settings' REDIS_URL names, with its files in a folder outside the project."""
    text = (DOCS / "tutorial.md").read_text()
    (default,) = re.findall(r'os\.environ\.get\("REDIS_URL", "redis://127\.0\.0\.1:(\d+)/0"\)', text)
    (line,) = [line for line in text.splitlines() if line.startswith("redis-server ")]
    assert default != "6379" and f"--port {default} " in line, line
    folder = re.search(r"--dir (\S+)", line)
    assert folder and folder.group(1).startswith("~/"), (
        f"the tutorial's Redis writes into the project: {line}"
    )
    assert "--appendonly yes" in line


def test_the_tutorial_runs_the_sweeper_and_kills_a_worker():
    """Recovery needs sweep_jobs: the tutorial's one command starts it, and a step kills the worker."""
    text = (DOCS / "tutorial.md").read_text()
    assert "python manage.py run_jobs" in text
    assert "<!-- smoke: sh crash -->\n```sh\nkill -9 " in text


# The docs stand alone: no citation of a document the repository does not hold ---------------------
#
# The pattern is built from two halves so that this file does not match itself.
OUTSIDE_DOCUMENT = re.compile(r"\b" + "SP" + r"EC\b")
CITATION_EXEMPT = {"tests/test_docs.py"}


# What git ignores (.gitignore), and git's own folder: the rest is the repository's text.
IGNORED_FOLDERS = {
    ".git",
    ".venv",
    ".nox",
    ".run",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "__pycache__",
    "_build",
    "build",
    "dist",
    "staticfiles",
}


def tracked_text_files() -> list[Path]:
    """Every file of the checkout that git tracks or would track: the tree without what
    .gitignore names (walked, not asked of git: the fast tier starts no subprocess)."""
    found = []
    for folder, folders, names in os.walk(BASE_DIR):
        here = Path(folder)
        folders[:] = [
            name
            for name in folders
            if name not in IGNORED_FOLDERS
            and not name.endswith(".egg-info")
            and (here / name) != BASE_DIR / "bench" / "results"
        ]
        found += [
            here / name for name in names if not name.endswith(".pyc") and not name.startswith("db.sqlite3")
        ]
    return found


def citations_outside(text: str) -> list[str]:
    """The lines of `text` that cite the outside document."""
    return [line.strip() for line in text.splitlines() if OUTSIDE_DOCUMENT.search(line)]


def test_no_file_cites_a_document_outside_the_repository():
    """Code, docs, bench reports, Lua and JS cite the docs' own pages, never a document that is
    not in the repository."""
    files = tracked_text_files()
    assert len(files) > 100
    found = []
    for path in files:
        relative = path.relative_to(BASE_DIR).as_posix()
        if relative in CITATION_EXEMPT:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # not text
        found += [f"{relative}: {line}" for line in citations_outside(text)]
    assert not found, "cite the docs' own pages instead:\n" + "\n".join(found)


def test_the_citation_check_can_fail():
    cited = (
        "A finished stage costs one write (" + "SP" + "EC §9).\nNo citation here.\nthe " + "SP" + "EC targets"
    )
    assert citations_outside(cited) == [cited.splitlines()[0], cited.splitlines()[2]]
    assert citations_outside("SPECTACULAR_SETTINGS = {}\nspecification, spec") == []


# The models reference names every column -------------------------------------------------------


def test_the_models_page_names_every_field_of_each_model():
    from eventbus.models import DeadLetter, Job, StageRecord
    from idempotency.models import IdempotencyRecord

    text = (DOCS / "reference" / "models.md").read_text()
    sections = {
        heading: body for heading, body in re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    }
    for model in (Job, StageRecord, IdempotencyRecord, DeadLetter):
        assert model.__name__ in sections, f"docs/reference/models.md has no section ## {model.__name__}"
        missing = [
            field.name
            for field in model._meta.concrete_fields
            if f"`{field.name}`" not in sections[model.__name__]
        ]
        assert not missing, f"docs/reference/models.md, ## {model.__name__}, does not name: {missing}"


# The public API describes each argument (numpydoc, read by napoleon) ------------------------------

PUBLIC_PACKAGES = ("idempotency", "eventbus", "gateway")


def callables_of(value) -> list[tuple[str, object, object]]:
    """(name, callable, where its parameters are described) for a public name: a function itself;
    a class's own constructor (described in the class's docstring, as numpydoc has it) and its own
    public methods."""
    import inspect

    if not inspect.isclass(value):
        return [(value.__qualname__, value, value)] if callable(value) else []
    found: list[tuple[str, object, object]] = []
    if "__init__" in vars(value):
        found.append((f"{value.__qualname__}.__init__", vars(value)["__init__"], value))
    for name, member in vars(value).items():
        if name.startswith("_"):
            continue
        function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        if inspect.isfunction(function):
            found.append((f"{value.__qualname__}.{name}", function, function))
    return found


def undescribed_parameters(function, documented) -> list[str]:
    """The parameters of `function` (less self and cls) that `documented`'s docstring does not
    describe under a numpydoc "Parameters" section."""
    import inspect

    names = [name for name in inspect.signature(function).parameters if name not in ("self", "cls")]
    if not names:
        return []
    doc = inspect.getdoc(documented) or ""
    section = re.search(r"^Parameters\n-{10}\n(.*?)(?=^\S[^\n]*\n-{3,}\n|\Z)", doc, re.M | re.S)
    described = set()
    # An unindented line of the section names parameters: "key : str", or "a, *args, **kwargs".
    for line in re.findall(r"^\S.*$", section.group(1), re.M) if section else []:
        described |= {part.strip(" *") for part in line.split(" : ")[0].split(",")}
    return [name for name in names if name not in described]


def public_callables() -> list[tuple[str, object, object]]:
    import importlib

    found = []
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:  # each through the package's lazy __getattr__
            found += [
                (f"{package}.{qualname}", function, documented)
                for qualname, function, documented in callables_of(getattr(module, name))
            ]
    return found


def test_every_public_function_describes_its_parameters():
    """The reference (docs/reference/api.md) describes each argument of what the apps' __all__
    lists: a "Parameters" section naming every parameter, as napoleon reads numpydoc."""
    found = public_callables()
    assert len(found) > 30
    missing = {
        name: undescribed
        for name, function, documented in found
        if (undescribed := undescribed_parameters(function, documented))
    }
    assert not missing, f"describe these parameters in a numpydoc Parameters section: {missing}"


def test_the_parameters_check_can_fail():
    def undocumented(request, *, key, **options):
        """A summary, and prose that names request and key without a section."""

    def documented(request, *, key, **options):
        """A summary.

        Parameters
        ----------
        request : HttpRequest
            The request.
        key, **options
            The key, and the rest.

        Returns
        -------
        request
            Not a parameter section.
        """

    def half(request, key):
        """A summary.

        Parameters
        ----------
        request
            The request.

        Returns
        -------
        key
            Named under Returns only.
        """

    assert undescribed_parameters(undocumented, undocumented) == ["request", "key", "options"]
    assert undescribed_parameters(documented, documented) == []
    assert undescribed_parameters(half, half) == ["key"]
