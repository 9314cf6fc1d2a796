"""The fenced blocks of the README and the documentation's pages (not the tutorial: tests/smoke/
runs that one), each tagged with how it is checked, and the checks.

A block a user is meant to paste runs somewhere; so each fenced block has a tag on the line
above it:

- `<!-- run: python-settings [base=dev|base|new] [deploy] [NAME=value ...] -->`: a settings
  module, written after a base ("your project's settings": the demo's complete development
  settings, `config/settings/dev.py`; its `base.py`, which a production module completes; or a
  new project's without the toolkit) and checked by `manage.py check` (`--deploy` too) with
  that environment;
- `<!-- run: python [module=dotted.name] -->`: code, imported as that module (in the `shop` app
  of SHOP_APP when it is under `shop.`) by a Django process on the test settings;
- `<!-- run: sh-commands -->`: commands each parsed by their own program's parser (manage.py's
  commands, uvicorn, celery, make's targets), not run;
- `<!-- run: sh-stack NAME -->`: run against `make run`'s stack by tests/test_stack.py (NAME: which);
- `<!-- run: curl JOB=<state> status=<code> -->`: a curl of the jobs API, sent as written through
  Django's test client with `$TOKEN` a user's token and `$JOB` a job of theirs in that state
  (RETRIED: a FAILED job retried already); its answer has that status, and the members of the
  page's next block when that is a `json` one (tests/test_stack.py also runs the jobs API page's
  with curl against `make run`'s stack);
- `<!-- run: json [dotted.Serializer] [+member ...] -->`: an answer, its members the serializer's;
- `<!-- run: django-template -->`: a template, compiled with the installed apps' tags;
- `<!-- smoke: ... -->`: run by the smoke test in the tutorial's project (tests/smoke/smoke.py);
- `<!-- not-run: <reason> -->`: the reason, for the few that cannot run here.

MyST directives (```{toctree}, ```{literalinclude}, ...) are not code and need no tag.
"""

from __future__ import annotations

import json
import re
import shlex
import symtable
import textwrap
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent.parent
DOCS = BASE_DIR / "docs"
PAGES = sorted(
    [
        BASE_DIR / "README.md",
        DOCS / "index.md",
        *(DOCS / "howto").glob("*.md"),
        *(DOCS / "reference").glob("*.md"),
        *(DOCS / "design").glob("*.md"),
    ]
)
FENCE = re.compile(r"^(```|~~~)([^\n]*)\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
TAG = re.compile(r"<!--\s*(run|not-run|smoke):\s*((?:(?!-->).)*?)\s*-->\Z", re.DOTALL)
RUN_KINDS = {"python-settings", "python", "sh-commands", "sh-stack", "curl", "json", "django-template"}
# A reason that says why, not a word.
MIN_REASON_WORDS = 3


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    tag: str | None  # run, not-run, smoke, or None: untagged
    spec: str  # what follows the tag: the run's kind and arguments, or the reason

    @property
    def kind(self) -> str:
        return self.spec.split()[0] if self.tag == "run" and self.spec else ""

    @property
    def args(self) -> list[str]:
        return self.spec.split()[1:] if self.tag == "run" else []

    def option(self, name: str, default: str = "") -> str:
        return next((a.split("=", 1)[1] for a in self.args if a.startswith(f"{name}=")), default)

    @property
    def environment(self) -> dict[str, str]:
        """The NAME=value arguments whose NAME is upper case: the environment a settings block names."""
        return dict(a.split("=", 1) for a in self.args if re.match(r"[A-Z][A-Z0-9_]*=", a))

    def __str__(self) -> str:
        where = self.page.relative_to(BASE_DIR) if self.page.is_relative_to(BASE_DIR) else self.page
        return f"{where}:{self.line}"


def blocks_of(page: Path, text: str | None = None) -> list[Block]:
    """The page's fenced code blocks (not its MyST directives), with their tags."""
    text = page.read_text() if text is None else text
    found = []
    for match in FENCE.finditer(text):
        lang = match.group(2).strip()
        if lang.startswith("{"):
            continue
        # The tag is the last thing before the fence: a comment further up belongs to another text.
        tag = TAG.search(text[: match.start()].rstrip())
        found.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                lang=lang,
                body=match.group(3),
                tag=tag.group(1) if tag else None,
                spec=tag.group(2) if tag else "",
            )
        )
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks_of(page)]


def tag_problems(block: Block) -> list[str]:
    """What is wrong with a block's tag: none, an unknown kind, a reason that says nothing."""
    if block.tag is None:
        return [f"{block}: untagged (<!-- run: ... --> or <!-- not-run: <reason> -->)"]
    if block.tag == "run" and block.kind not in RUN_KINDS:
        return [f"{block}: unknown kind {block.kind!r} (one of {sorted(RUN_KINDS)})"]
    if block.tag == "not-run" and len(block.spec.split()) < MIN_REASON_WORDS:
        return [f"{block}: not-run needs a reason, not {block.spec!r}"]
    return []


# Python blocks: names used and never defined.


def undefined_names(source: str) -> list[str]:
    """Global names the code reads and neither defines, imports nor finds among the builtins (a
    star import defines what it likes: nothing is reported then)."""
    import builtins

    if re.search(r"^from \S+ import \*", source, re.M):
        return []
    table = symtable.symtable(source, "<block>", "exec")
    defined = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    known = defined | set(dir(builtins)) | {"__name__", "__file__"}
    used: set[str] = set()

    def walk(scope):
        for symbol in scope.get_symbols():
            at_module = scope.get_type() == "module" and symbol.is_referenced()
            if at_module or symbol.is_global():
                used.add(symbol.get_name())
        for child in scope.get_children():
            walk(child)

    walk(table)
    return sorted(used - known)


# sh-commands: each command parsed by its program, never run.


def command_lines(body: str) -> list[list[str]]:
    """The block's commands as words (comments dropped, continuations joined)."""
    return [
        words
        for line in body.replace("\\\n", " ").splitlines()
        if (words := shlex.split(line, comments=True))
    ]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", (BASE_DIR / "Makefile").read_text(), re.M))


def command_problem(words: list[str]) -> str | None:
    """Why the command would not start as written (its program's parser refuses it), or None."""
    while words and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]  # VAR=value before the command
    program, args = Path(words[0]).name, words[1:]
    if program.startswith("python") and args[:1] == ["manage.py"]:
        return manage_problem(args[1:])
    if program == "uvicorn":
        return click_problem("uvicorn.main", "main", args)
    if program == "celery":
        return celery_problem(args)
    if program == "make":
        unknown = [a for a in args if "=" not in a and not a.startswith("-") and a not in makefile_targets()]
        return f"make: no target {unknown} in the Makefile" if unknown else None
    return f"{program}: not a program these checks know (manage.py, uvicorn, celery, make)"


def manage_problem(args: list[str]) -> str | None:
    from django.core.management import CommandError, get_commands, load_command_class

    if not args:
        return "manage.py without a command"
    app = get_commands().get(args[0])
    if app is None:
        return f"manage.py has no command {args[0]!r}"
    command = load_command_class(app, args[0])
    try:
        command.create_parser("manage.py", args[0]).parse_args(args[1:])
    except CommandError as exc:
        return f"manage.py {args[0]}: {exc}"
    return None


def click_problem(module: str, name: str, args: list[str], parent=None) -> str | None:
    import importlib

    import click

    command = getattr(importlib.import_module(module), name)
    try:
        command.make_context(name, list(args), parent=parent)
    except click.ClickException as exc:
        return f"{name}: {exc.format_message()}"
    return None


def celery_problem(args: list[str]) -> str | None:
    """celery's own options, then its subcommand's (`worker -P prefork ...`)."""
    import click
    from celery.app.utils import find_app
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery

    try:
        context = celery.make_context("celery", list(args))
        # What celery's own callback sets before a subcommand parses its options (-P needs the app).
        app = context.params.get("app")
        context.obj = CLIContext(app=find_app(app) if app else None, no_color=True, workdir=None)
        name, command, rest = celery.resolve_command(context, [*context._protected_args, *context.args])
        if command is None:
            return f"celery has no command {name!r}"
        command.make_context(name, rest, parent=context)
    except click.ClickException as exc:
        return f"celery: {exc.format_message()}"
    return None


# curl: a request of the jobs API, read as curl reads its arguments.


@dataclass
class CurlRequest:
    method: str
    path: str
    headers: dict[str, str]
    data: str | None


def curl_request(body: str, variables: dict[str, str]) -> CurlRequest:
    """The block's one curl command, its $NAME variables replaced."""
    text = re.sub(r"\$\{?(\w+)\}?", lambda m: variables[m.group(1)], body.replace("\\\n", " "))
    [words] = [words for line in text.splitlines() if (words := shlex.split(line, comments=True))]
    assert words[0] == "curl", words
    request = CurlRequest("GET", "", {}, None)
    rest = iter(words[1:])
    for word in rest:
        if word in ("-X", "--request"):
            request.method = next(rest)
        elif word in ("-H", "--header"):
            name, _, value = next(rest).partition(":")
            request.headers[name.strip()] = value.strip()
        elif word in ("-d", "--data", "--data-raw"):
            request.data = next(rest)
            request.method = "POST" if request.method == "GET" else request.method
        elif word.startswith("-"):
            continue  # -s, -S, -i, -f: how curl shows the answer
        else:
            split = urlsplit(word)
            request.path = split.path + (f"?{split.query}" if split.query else "")
    return request


def next_block(block: Block) -> Block | None:
    """The block after this one on its page."""
    later = [other for other in blocks_of(block.page) if other.line > block.line]
    return later[0] if later else None


# json: an answer whose members are the serializer's.


def json_problem(block: Block) -> str | None:
    try:
        body = json.loads(block.body)
    except ValueError as exc:
        return f"not JSON: {exc}"
    serializer = next((a for a in block.args if not a.startswith("+")), None)
    if serializer is None:
        return None
    from django.utils.module_loading import import_string

    fields = import_string(serializer)().fields
    extra = {a[1:] for a in block.args if a.startswith("+")}
    members = set(body)
    # An optional member (a problem's `errors`) may be left out; every other field is shown.
    optional = {name for name, field in fields.items() if not field.required and not field.read_only}
    missing, unknown = set(fields) - members - optional, members - set(fields) - extra
    if missing or unknown:
        return f"members differ from {serializer}: missing {sorted(missing)}, not its {sorted(unknown)}"
    return None


# python-settings and python: the project a block is written into, run by `python -m django`.

# A new project's settings (as startproject writes them), for a block that adds to them.
NEW_PROJECT = textwrap.dedent(
    """\
    from pathlib import Path

    BASE_DIR = Path(__file__).resolve().parent
    SECRET_KEY = "documentation-check-only"
    DEBUG = True
    ALLOWED_HOSTS = []
    INSTALLED_APPS = [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
    ]
    MIDDLEWARE = [
        "django.middleware.security.SecurityMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    ]
    ROOT_URLCONF = "docsproject.urls"
    TEMPLATES = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [],
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ]
    # IMMEDIATE, as docs/howto/idempotent-views.md asks of SQLite (idempotency.W002).
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "db.sqlite3",
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }
    STATIC_URL = "static/"
    DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
    """
)
NEW_PROJECT_URLS = textwrap.dedent(
    """\
    from django.contrib import admin
    from django.urls import include, path

    urlpatterns = [path("admin/", admin.site.urls), path("idempotency/", include("idempotency.urls"))]
    """
)
DEMO_SETTINGS = {"dev": "config.settings.dev", "base": "config.settings.base"}
DEMO_SETTINGS_ONLY = textwrap.dedent(
    """\
    import importlib

    demo = importlib.import_module("{module}")
    globals().update({{name: value for name, value in vars(demo).items() if name.isupper()}})
    """
)
# The `shop` app the pages' examples belong to: what they name of it beyond the block itself (its
# models are docs/howto/durable-stages.md's, shown there: tests/docs/test_durable_stages_page.py
# checks that they are the same).
SHOP_APP = {
    "__init__.py": "",
    "models.py": textwrap.dedent(
        """\
        from django.db import models


        class Customer(models.Model):
            name = models.CharField(max_length=100)
            email = models.EmailField(blank=True)
            credit_cents = models.IntegerField(default=0)


        class Credit(models.Model):
            customer = models.ForeignKey(Customer, on_delete=models.CASCADE)
            amount_cents = models.IntegerField()
            job_id = models.UUIDField()  # the job whose stage wrote it
        """
    ),
    "tasks.py": textwrap.dedent(
        """\
        from celery import shared_task

        from eventbus.djangotasks.compat import task  # django.tasks' on Django 6, the backport's on 5.2


        @shared_task
        def send_payout(payout_id):
            return str(payout_id)


        @task
        def send_receipt(order_id):
            return order_id


        @task
        def nightly_report():
            return {}


        @task
        def ping():
            return "pong"
        """
    ),
}


def write_project(root: Path, block: Block) -> str:
    """The block written into a project under `root` (on PYTHONPATH): its settings module's name."""
    package = root / "docsproject"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    shop = root / "shop"  # what the block names of the app (a schedule's task path, an import)
    shop.mkdir(exist_ok=True)
    for name, text in SHOP_APP.items():
        (shop / name).write_text(text)
    if block.kind == "python-settings":
        base = block.option("base", "dev")
        if base in DEMO_SETTINGS:
            # Its settings only, as a project of yours has them: none of the demo's helpers
            # (redis_cache, env_flag) nor its imports, which a block must not lean on.
            (package / "base.py").write_text(DEMO_SETTINGS_ONLY.format(module=DEMO_SETTINGS[base]))
        else:
            (package / "base.py").write_text(NEW_PROJECT)
            (package / "urls.py").write_text(NEW_PROJECT_URLS)
        head = "" if re.search(r"^from \.base import \*", block.body, re.M) else "from .base import *\n"
        (package / "settings.py").write_text(head + block.body)
        return "docsproject.settings"
    module = block.option("module", "docsblock")
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block.body)
    (package / "settings.py").write_text(
        "from config.settings.test import *  # noqa: F403\n\nINSTALLED_APPS = [*INSTALLED_APPS, 'shop']  # noqa: F405\n"
    )
    return "docsproject.settings"


def command_of(block: Block) -> list[str]:
    """What runs the block, after `python`: Django's check for settings, an import for code."""
    if block.kind == "python-settings":
        deploy = ["--deploy"] if "deploy" in block.args else []
        return ["-m", "django", "check", *deploy, "--fail-level", "WARNING"]
    module = block.option("module", "docsblock")
    return ["-c", f"import django, importlib; django.setup(); importlib.import_module({module!r})"]
