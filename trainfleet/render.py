"""Render the Jinja2 templates under templates/<capability>/.

Values reach these templates after the schema's grammar accepted them; rendering checks
again (defence in depth): no value may start a new line in any file, and each format's
filter quotes for that format or refuses what it cannot quote.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import yaml

from trainfleet.grammar import text_problem

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


class UnsafeValue(ValueError):
    """A value cannot be written into a template's format as it is."""


def one_line(value: Any) -> Any:
    """Every ``{{ ... }}`` output: refused if it holds a newline or other control character."""
    if isinstance(value, str) and (problem := text_problem(value)):
        raise UnsafeValue(f"refusing to render {problem}")
    return value


def shell_quote(value: Any) -> str:
    """One shell word (``shlex.quote``): a plain word such as ``eth0`` stays as it is."""
    return shlex.quote(str(value))


def pam_env_quote(value: Any) -> str:
    """A value of /etc/environment (pam_env): double-quoted when it has spaces. pam_env strips
    quotes, cuts at '#' and joins a line ending in a backslash; such values are refused."""
    text = str(value)
    if re.search(r"[\"'#\\]", text):
        raise UnsafeValue(f"refusing to write {text!r} to /etc/environment: pam_env cannot hold it")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def ssh_config_word(value: Any) -> str:
    """One argument of an ssh_config keyword, which must need no quoting: no space, quote,
    comment, backslash or %-token (ssh expands %h and friends in HostName and IdentityFile)."""
    text = str(value)
    if not text or re.search(r"[\s\"'#\\%=]", text):
        raise UnsafeValue(f"refusing to write {text!r} into an ssh_config")
    return text


def yaml_scalar(value: Any) -> str:
    """A YAML scalar that reads back as the same string: plain where it does, else JSON-quoted."""
    if not isinstance(value, str):
        return str(value)
    try:
        plain_ok = yaml.safe_load(value) == value and value.strip() == value
    except yaml.YAMLError:
        plain_ok = False
    return value if plain_ok else json.dumps(value)


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
    finalize=one_line,
)
_env.filters["shell_quote"] = shell_quote
_env.filters["pam_env_quote"] = pam_env_quote
_env.filters["ssh_config_word"] = ssh_config_word
_env.filters["yaml_scalar"] = yaml_scalar


@cache
def variables(template: str) -> frozenset[str] | None:
    """The names a template reads from its context (what its output can depend on); None
    when it includes another template, whose names it does not see."""
    source = _env.loader.get_source(_env, template)[0]  # type: ignore[union-attr]
    parsed = _env.parse(source)
    if any(True for _ in jinja2.meta.find_referenced_templates(parsed)):
        return None
    return frozenset(jinja2.meta.find_undeclared_variables(parsed))


def render(template: str, **context: Any) -> str:
    return _env.get_template(template).render(**context)


def render_lines(template: str, **context: Any) -> list[str]:
    """The template's output as lines (no trailing newline on each)."""
    return _env.get_template(template).render(**context).splitlines()
