"""Text that came from a job, a run, a dataset, a model's answer, a file name or an error, shown in the page as text.

The page's gr.Markdown (Gradio 6.31: marked with GitHub's extensions) reads raw HTML inside Markdown, and its
sanitizer keeps much of it (a <form>, an <img> loading from any address), and html.escape leaves every link,
image and emphasis of Markdown itself: `![](http://host/p.png)` loaded an image from anywhere, a reward's file
name drew a full-page form that posted what was typed to another host (issue 32). Each surface takes such text
through one of these, by how it renders:

- `as_text`: Markdown (gr.Markdown, the page's notices, a field's info line). What CommonMark and GitHub's
  extensions read as markup goes behind a backslash, which shows it as itself (CommonMark 2.4: any ASCII
  punctuation may be escaped): `\\ ` * [ ] < > & # | ~ $ @` everywhere (HTML, links and images, emphasis, code,
  tables, headings, entities, strikethrough, Gradio's LaTeX, e-mail links), `_` unless between two letters or
  digits (there it cannot emphasise: `learning_rate` stays readable), the dot of `www.` and the colon of `://`
  (bare links), and at a line's start `-`, `+`, `=` and the dot or parenthesis of `1.` (lists, heading rules);
  a line's leading spaces go (they would start a code block). `(`, `)` and `!` make a link or image only after
  `[...]`, so they stay as they are. A line break stays a line break.
- `code_span`: a value shown as code in Markdown, fenced by more backticks than any run of them in it.
- `as_info`: a field's info line (the text under its label), which Gradio 6.31 does not read as Markdown: it
  escapes the HTML, then its own regexes draw `code`, [text](url) (a link to any http(s) or relative address),
  **bold**, *em* and _em_, and a backslash escapes nothing there.
- `as_html`: HTML (gr.HTML, gr.Error and other toasts, which Gradio renders as sanitized HTML) and Plotly's
  text (titles, legend names, hover text: Plotly draws <b>, <br> and <a href> in them and decodes entities).
"""

from __future__ import annotations

import html
import re
import sys

from tunedeck.backend.spec import shown

MARKUP = re.compile(r"[\\`*\[\]<>&#|~$@]|(?<![^\W_])_|_(?![^\W_])|(?<=[Ww]{3})\.|:(?=//)")
LINE_START = re.compile(r"^(\d*)([-+=.)])")  # "- a", "+ a", "1. a", "1) a": list items; "===", "---": headings
BACKTICKS = re.compile("`+")


def as_text(value: object) -> str:
    """`value` as Markdown that shows it as it is: no markup, link, image or HTML of its own."""
    lines = [LINE_START.sub(r"\1\\\2", MARKUP.sub(r"\\\g<0>", line.lstrip(" \t"))) for line in str(value).splitlines()]
    return "\\\n".join(lines)  # a backslash before a line end is a hard line break (CommonMark 6.7)


def code_span(value: object, limit: int | None = None) -> str:
    """`value` as a Markdown code span that no backtick in it can end (so nothing in it renders), control
    characters escaped; cut to `limit` characters when given."""
    text = shown(value, limit or sys.maxsize)
    fence = "`" * (max((len(run) for run in BACKTICKS.findall(text)), default=0) + 1)
    return f"{fence} {text} {fence}" if "`" in text else f"`{text}`"


def as_info(value: object) -> str:
    """`value` for a field's info line: a word joiner (U+2060, unseen) between "]" and "(" so that no link forms,
    and the backtick and asterisk as their look-alikes (U+02CB, U+2217), so that no code or emphasis does."""
    return str(value).replace("](", "]\u2060(").replace("`", "\u02cb").replace("*", "\u2217")


def as_html(value: object) -> str:
    """`value` as HTML text (quotes too, for an attribute): for gr.HTML, toasts and Plotly's text."""
    return html.escape(str(value))
