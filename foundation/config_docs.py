"""What each setting means, read from the comments above its field in the source.

Configuration dataclasses document every field with a comment right above it (STYLE 7),
and that comment is the one description of the setting: ``--help`` of every server
(:func:`foundation.service.add_config_flags`) and ``docs/configuration.md`` (written by
``python -m ops.gen_config_docs``, compared by a test) both come from here, so the two
cannot drift apart from the code.

Rules of extraction (:func:`field_docs`):

* the comment lines directly above a field (no blank line between) are its meaning; a
  ``# --- title ---`` line is a group heading, not part of any field's meaning;
* a field without a comment of its own shares the comment of the field right above it
  when no blank line separates them (``backoff_initial_ms`` / ``backoff_max_ms``);
* a comment after the field on the same line is appended;
* a field a subclass redefines without a comment keeps its base class's comment.

Pure: reads source files through :mod:`inspect`, imports nothing of ours.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FieldDoc", "Section", "field_docs", "render_markdown", "toml_value"]


@dataclass(frozen=True, slots=True)
class FieldDoc:
    name: str
    type_name: str  # readable annotation: "int", "str | None", "tuple[str, ...]"
    default: str  # the default as TOML would spell it ("" for a nested section)
    expression: str  # the default as written in the source, when it differs (1 << 20)
    doc: str  # the meaning, one paragraph ("" when the source has no comment)
    group: str  # the "# --- group ---" heading the field sits under ("" if none)
    nested: type[Any] | None = None  # a dataclass-valued field: its own section


@dataclass(frozen=True, slots=True)
class Section:
    """One documented settings class: a TOML section and where it is used."""

    name: str  # TOML section, e.g. "bookie"
    cls: type[Any]
    env_prefix: str  # e.g. "BOOKLINE_BOOKIE_" ("" when there is none)
    used_by: str  # who reads it, one phrase


@dataclass(frozen=True, slots=True)
class _Comments:
    above: str
    inline: str
    group: str
    shares_previous: bool  # no comment of its own, directly below another field
    expression: str


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = str(annotation).replace("typing.", "")
    return text.replace("NoneType", "None")


def toml_value(value: object) -> str:
    """``value`` as TOML spells it (strings quoted, booleans lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return toml_value(value.value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


@functools.cache
def _class_comments(cls: type[Any]) -> dict[str, _Comments]:
    """Comments of the fields defined in ``cls``'s own body (read once per class: a
    CLI parser is built from many classes sharing bases; callers only read the dict)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}  # line number (1-based) -> comment text
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
    tree = ast.parse(source)
    body = tree.body[0]
    if not isinstance(body, ast.ClassDef):
        return {}
    out: dict[str, _Comments] = {}
    group = ""
    last_field_line = -2
    for node in body.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        first = node.lineno
        above: list[str] = []
        line = first - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            text = comments.get(line, lines[line - 1].strip())
            heading = _heading(text)
            if heading is not None:
                group = heading
                break
            above.append(text.lstrip("#").strip())
            line -= 1
        above.reverse()
        inline = comments.get(first, "")
        if inline and not lines[first - 1].strip().startswith("#"):
            inline = inline.lstrip("#").strip()
        else:
            inline = ""
        expression = ""
        if node.value is not None and not _is_literal(node.value):
            expression = ast.get_source_segment(source, node.value) or ""
        out[node.target.id] = _Comments(
            above=" ".join(above),
            inline=inline,
            group=group,
            shares_previous=not above and last_field_line == first - 1,
            expression=expression,
        )
        last_field_line = node.end_lineno or first
    return out


def _is_literal(node: ast.expr) -> bool:
    """A plain constant (``10_000``, ``-1``, ``"x"``): its value says it all."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant)


def _heading(comment: str) -> str | None:
    """The title of a ``# --- title ---`` group heading, else None."""
    text = comment.lstrip("#").strip()
    if text.startswith("---") and text.endswith("---"):
        return text.strip("-").strip()
    return None


def _default(f: dataclasses.Field[Any]) -> tuple[object, bool]:
    if f.default is not dataclasses.MISSING:
        return f.default, True
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory(), True
    return None, False


def field_docs(cls: type[Any]) -> list[FieldDoc]:
    """Every field of the dataclass ``cls`` (bases' included) with its meaning."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    per_class = [_class_comments(c) for c in cls.__mro__ if dataclasses.is_dataclass(c)]
    docs: list[FieldDoc] = []
    previous_doc = ""
    for f in dataclasses.fields(cls):
        found = [c[f.name] for c in per_class if f.name in c]
        own = found[0] if found else _Comments("", "", "", False, "")
        doc = own.above
        if not doc and own.shares_previous:
            doc = previous_doc
        if not doc:  # a redefinition without a comment: the base class's meaning
            doc = next((c.above for c in found[1:] if c.above), "")
        previous_doc = doc
        if own.inline:
            doc = f"{doc} ({own.inline})" if doc else own.inline
        value, has_default = _default(f)
        nested = type(value) if dataclasses.is_dataclass(value) else None
        shown = "" if nested is not None or not has_default else toml_value(value)
        expression = "" if nested is not None else own.expression
        docs.append(
            FieldDoc(
                name=f.name,
                type_name=_type_name(hints.get(f.name, f.type)),
                default=shown,
                expression=expression,
                doc=doc,
                group=own.group,
                nested=nested,
            )
        )
    return docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default_cell(doc: FieldDoc) -> str:
    if doc.nested is not None:
        return "section"
    if not doc.default:
        return "(required)"
    cell = f"`{doc.default}`"
    if doc.expression:
        cell += f" ({_cell(doc.expression)})"
    return _cell(cell)


def _section_markdown(section: Section) -> Iterable[str]:
    yield f"## `[{section.name}]`"
    yield ""
    cls = section.cls
    summary = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    if summary and not summary.startswith(f"{cls.__name__}("):
        yield summary
        yield ""
    where = f"`{cls.__module__}.{cls.__qualname__}`; used by {section.used_by}."
    if section.env_prefix:
        where += f" Environment: `{section.env_prefix}<FIELD>` (upper case)."
    yield "Defined in " + where
    yield ""
    yield "| setting | type | default | meaning |"
    yield "|---|---|---|---|"
    group = ""
    for doc in field_docs(cls):
        if doc.group and doc.group != group:
            group = doc.group
            yield f"| *{_cell(group)}* | | | |"
        meaning = doc.doc
        if doc.nested is not None:
            meaning = f"{meaning} Nested table, see its own section.".strip()
        kind = _cell(doc.type_name)
        yield f"| `{doc.name}` | `{kind}` | {_default_cell(doc)} | {_cell(meaning)} |"
    yield ""


def render_markdown(title: str, intro: str, sections: Sequence[Section]) -> str:
    """The configuration reference: one table per section, in the order given."""
    out = [f"# {title}", "", intro.strip(), ""]
    out.append("Sections: " + ", ".join(f"[`[{s.name}]`](#{s.name})" for s in sections) + ".")
    out.append("")
    for section in sections:
        out.extend(_section_markdown(section))
    return "\n".join(out).rstrip() + "\n"
