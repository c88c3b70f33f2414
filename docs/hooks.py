"""MkDocs hooks (``mkdocs.yml``'s ``hooks:``): the site is built from ``docs/`` alone, so

- the repository files a page links with ``../`` (results files, examples) are copied into the
  site under ``repo/``, each link rewritten to its copy, and the Markdown files among them
  followed for their own links in turn; a ``../`` link to a file that is not there is left as it
  is, so ``mkdocs build --strict`` fails on it as on any broken link;
- ``reference/autotune-json.md`` is generated from ``autotune.json``'s JSON Schema
  (``autotune.tuned_file.json_schema``) and the field docstrings of the classes behind it.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PREFIX = "repo"
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
SCHEMA_PAGE = "reference/autotune-json.md"


def _outside_targets(page: Path) -> list[Path]:
    """Files outside docs/ that a Markdown file links (relative links only)."""
    found = []
    for m in LINK.finditer(page.read_text(errors="replace")):
        target = m[2]
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        path = (page.parent / target).resolve()
        if path.is_file() and path.is_relative_to(ROOT) and not path.is_relative_to(DOCS):
            found.append(path)
    return found


def _repo_files() -> set[Path]:
    """Every repository file the docs reach, following the Markdown ones' links."""
    todo = [p for p in DOCS.rglob("*.md")]
    seen: set[Path] = set()
    while todo:
        for path in _outside_targets(todo.pop()):
            if path not in seen:
                seen.add(path)
                if path.suffix == ".md":
                    todo.append(path)
    return seen


def on_files(files: Files, config) -> Files:
    for path in sorted(_repo_files()):
        uri = f"{PREFIX}/{path.relative_to(ROOT).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    files.append(File.generated(config, SCHEMA_PAGE, content=schema_page()))
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    src = Path(page.file.abs_src_path).resolve() if page.file.abs_src_path else None
    if src is None or page.file.src_uri.startswith(f"{PREFIX}/"):
        return markdown  # a repository file: its links already point at the copies beside it

    def rewrite(m: re.Match) -> str:
        path = (src.parent / m[2]).resolve()
        if "://" in m[2] or not path.is_file() or path.is_relative_to(DOCS) or \
                not path.is_relative_to(ROOT):
            return m[0]
        uri = f"{PREFIX}/{path.relative_to(ROOT).as_posix()}"
        here = posixpath.dirname(page.file.src_uri)
        return f"{m[1]}{posixpath.relpath(uri, here or '.')}{m[3]}"

    return LINK.sub(rewrite, markdown)


def _field_docs() -> dict[str, dict[str, str]]:
    """Each class's field docstrings, read from the source (no import of torch)."""
    import griffe

    package = griffe.load("autotune", search_paths=[str(ROOT)], resolve_aliases=False)
    docs: dict[str, dict[str, str]] = {}

    def walk(module) -> None:
        for member in module.members.values():
            if member.is_alias:
                continue
            if member.is_module:
                walk(member)
            elif member.is_class:
                docs.setdefault(member.name, {}).update({
                    name: " ".join(attr.docstring.value.split())
                    for name, attr in member.members.items()
                    if not attr.is_alias and attr.is_attribute and attr.docstring})

    walk(package)
    return docs


def _type(spec: dict) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in spec:
        return " or ".join(_type(s) for s in spec["anyOf"])
    if "const" in spec:
        return f"`{json.dumps(spec['const'])}`"
    if "enum" in spec:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in spec["enum"])
    kind = spec.get("type", "any")
    if kind == "array":
        items = spec.get("items")
        return f"list of {_type(items)}" if items else "list"
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        return f"map to {_type(spec['additionalProperties'])}"
    return str(kind)


def _limits(spec: dict) -> str:
    parts = [f"{word} {spec[key]}" for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                     ("maximum", "<="), ("exclusiveMaximum", "<"))
             if key in spec]
    if "default" in spec:
        parts.append(f"default `{json.dumps(spec['default'])}`")
    return ", ".join(parts)


def _table(schema: dict, fields: dict[str, str]) -> list[str]:
    required = set(schema.get("required", ()))
    lines = ["| field | type | required | limits | meaning |", "|---|---|---|---|---|"]
    for name, spec in schema.get("properties", {}).items():
        meaning = " ".join(filter(None, (fields.get(name) or spec.get("description"),
                                         spec.get("$comment") and
                                         f"Also checked: {spec['$comment']}.")))
        meaning = meaning.replace("|", "\\|")
        lines.append(f"| `{name}` | {_type(spec)} | {'yes' if name in required else 'no'} | "
                     f"{_limits(spec)} | {meaning} |")
    return lines


def schema_page() -> str:
    from autotune.tuned_file import json_schema

    schema, docs = json_schema(), _field_docs()
    version = schema["properties"]["schema"].get("const")
    lines = [
        "# `autotune.json` reference",
        "",
        f"Schema version {version}, generated from the JSON Schema that `autotune schema` prints "
        "(`autotune/schema.py`) when the site is built. Every field is checked when the file is "
        "read (`autotune.load`, `autotune check`, `autotune codegen`): a bad file is refused "
        "with each problem named, exit 2. Older schema versions are read and upgraded.",
        "",
        "## TunedConfig",
        "",
        " ".join((schema.get("description") or "").split()),
        "",
        *_table(schema, docs.get("TunedConfig", {})),
    ]
    for name, sub in schema.get("$defs", {}).items():
        lines += ["", f"## {name}", "", " ".join((sub.get("description") or "").split()), "",
                  *_table(sub, docs.get(name, {}))]
    return "\n".join(lines) + "\n"
