"""Sphinx configuration of the documentation site (`make docs`, run by .ci/run with warnings as errors).

The pages are Markdown (MyST); the reference of the public API comes from the docstrings through
autodoc, which imports the apps: Django is set up first, on the test settings, which need no
server to import.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")

import django  # noqa: E402

django.setup()

project = "django-exactly-once"
copyright = "django-exactly-once contributors"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown: `[text](page.md#a-heading)` links, as the pages link each other by heading.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# The reference documents what a user imports, in the order the source declares it.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = False
napoleon_numpy_docstring = True

html_theme = "furo"
html_title = "django-exactly-once"


# -- The public API, from the apps' own lists -------------------------------------------------------
#
# `.. exports:: eventbus` documents every name the app's `_EXPORTS` lists (what `from eventbus
# import ...` gives), each by its defining module, in the list's order: the reference follows the
# list as it changes (reference/api.md).


def _directive_for(module: str, name: str) -> list[str]:
    import importlib
    import inspect

    value = getattr(importlib.import_module(module), name)
    target = f"{module}.{name}"
    if inspect.isclass(value) and issubclass(value, BaseException):
        return [f".. autoexception:: {target}"]
    if inspect.isclass(value):
        return [f".. autoclass:: {target}", "   :members:"]
    if callable(value):
        return [f".. autofunction:: {target}"]
    return [f".. autodata:: {target}", "   :no-value:"]


def setup(app):
    import importlib

    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective
    from sphinx.util.nodes import nested_parse_with_titles

    class Exports(SphinxDirective):
        """`.. exports:: APP`, and `:also: module.name ...` for what a user meets without importing
        it (a stage's ctx), documented after the list unless the list has it."""

        required_arguments = 1
        option_spec = {"also": str}

        def run(self):
            package = self.arguments[0]
            exports = importlib.import_module(package)._EXPORTS
            lines: list[str] = []
            for name, module in exports.items():
                lines += [*_directive_for(module, name), ""]
            for dotted in self.options.get("also", "").split():
                module, name = dotted.rsplit(".", 1)
                if name not in exports:
                    lines += [*_directive_for(module, name), ""]
            container = nodes.container()
            nested_parse_with_titles(self.state, StringList(lines, source=f"{package}._EXPORTS"), container)
            return container.children

    app.add_directive("exports", Exports)
