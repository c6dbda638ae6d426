"""Render the Jinja2 templates under templates/<capability>/."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import jinja2

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
)


# Shell-quote a value for `export K=...`.
_env.filters["shell_quote"] = shlex.quote
# pam_env's /etc/environment: KEY=VALUE, a value with spaces in double quotes.
_env.filters["pam_env_quote"] = lambda v: f'"{v}"' if any(c.isspace() for c in str(v)) else str(v)


def render(template: str, **context: Any) -> str:
    return _env.get_template(template).render(**context)


def render_lines(template: str, **context: Any) -> list[str]:
    """The template's output as lines (no trailing newline on each)."""
    return _env.get_template(template).render(**context).splitlines()
