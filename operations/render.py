"""Render the Jinja2 templates under templates/<capability>/."""

from __future__ import annotations

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


def render_lines(template: str, **context: Any) -> list[str]:
    """The template's output as lines (no trailing newline on each)."""
    return _env.get_template(template).render(**context).splitlines()
