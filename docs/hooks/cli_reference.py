"""MkDocs hook: the CLI reference page is generated from the ``tileplan`` command itself.

A page holding the marker ``<!-- cli-reference -->`` gets, in its place, one section per
command (sub-commands included) with its help text and a table of its arguments and options,
read from the click command that typer builds (duck-typed: typer vendors its own click) from ``tileplan/cli.py``. The reference therefore
cannot drift from the command: a new option appears on the next docs build.
"""

from __future__ import annotations

MARKER = "<!-- cli-reference -->"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_name(p) -> str:
    t = getattr(p, "type_descriptor", None) or getattr(p, "type", None)
    return getattr(t, "name", None) or "value"


def _param_row(p) -> str:
    if p.param_type_name == "argument":
        names = f"`{p.metavar or p.name.upper()}`"
        kind = "argument" + ("" if p.required else ", optional")
    else:
        names = ", ".join(f"`{n}`" for n in (*p.opts, *p.secondary_opts))
        kind = "flag" if p.is_flag else (f"`{p.metavar}`" if p.metavar else _type_name(p).lower())
        if p.multiple:
            kind += ", repeatable"
    default = ""
    if p.param_type_name == "option" and not p.required and p.default not in (None, False, (), []) \
            and not callable(p.default):
        default = f"`{p.default}`"
    help_text = getattr(p, "help", None) or ""
    return f"| {names} | {_cell(kind)} | {default} | {_cell(help_text)} |"


def _sections(cmd, path: str) -> list[str]:
    out = []
    if hasattr(cmd, "commands"):        # a group (typer carries its own click: duck-typed)
        for name in sorted(cmd.commands):
            sub = cmd.commands[name]
            if getattr(sub, "hidden", False):
                continue
            out += _sections(sub, f"{path} {name}")
        return out
    doc = (cmd.help or "").strip()
    out.append(f"### `{path}`\n")
    if doc:
        out.append(doc.split("\n\n")[0].replace("\n", " ") + "\n")
    params = [p for p in cmd.params if not getattr(p, "hidden", False) and p.name != "help"]
    if params:
        out.append("| argument / option | kind | default | meaning |")
        out.append("|---|---|---|---|")
        out += [_param_row(p) for p in params]
        out.append("")
    return out


def reference() -> str:
    import typer.main
    from tileplan.cli import app
    return "\n".join(_sections(typer.main.get_command(app), "tileplan")) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, reference())
    return markdown
