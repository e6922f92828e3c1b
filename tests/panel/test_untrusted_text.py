"""app/untrusted_text.py against the parsers: hostile text renders as itself, with no link, image, HTML or markup.

Markdown is rendered by markdown-it-py (the CommonMark reference's Python port, installed with gradio through
rich) with GitHub's tables and strikethrough on; the bare links GitHub's Markdown makes of `www.` and `https://`
(marked, in the page) are checked by what as_text leaves of them here and in Chromium by test_browser_untrusted.py.
Then the Run tab's and the page's own Markdown built from a run folder and errors full of hostile text.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from tunedeck.app.untrusted_text import as_html, as_info, as_text, code_span

from .hostile_runs import FORM, GRPO_RUN, HOSTILE, IMG, NAME, PLOTTED, REWARD_FILE, grpo_run

PAYLOADS = [
    IMG,
    FORM,
    "![x](http://evil.example/p.png)",
    "[click](http://evil.example)",
    "<http://evil.example>",
    "www.evil.example",
    "https://evil.example/x",
    "me@evil.example",
    "`a`",
    "``a`` ` b",
    "*bold* **strong** _em_ __strong__ ~~gone~~",
    "| table |\n|---|\n| cell |",
    "# heading",
    "> quote",
    "- item\n+ item\n1. item\n2) item",
    "line\n===\nline\n---",
    "    indented code",
    "&amp; &lt;b&gt; &#60;i&#62;",
    "[ref]\n\n[ref]: http://evil.example",
    "\\*not\\* \\",
    "$$x^2$$",
    "learning_rate a_b_c snake_case_name",
]
# What a context draws itself (<p>, our <strong>, the list item, the table): compared with the same context holding
# plain text, the payload may add line breaks and nothing else (an empty one: not even the paragraph).
CONTEXTS = ["{}", "✗ **Not started:** {}.", "- ✗ `field`: {}", "| answer | x |\n|---|---|\n| {} | 1 |"]
MARKDOWN = MarkdownIt("commonmark").enable(["table", "strikethrough"])


class Parsed(HTMLParser):
    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)

    @property
    def words(self) -> str:
        return " ".join("".join(self.text).split())


def rendered(markdown: str) -> Parsed:
    return Parsed(MARKDOWN.render(markdown))


def words(text: str) -> str:
    return " ".join(text.split())


def assert_shown_as_text(value: str, context: str = "{}") -> None:
    if context.startswith("|"):
        value = " ".join(value.split())  # a table cell is one line (backend/runs/answers.py)
    page = rendered(context.format(as_text(value)))
    plain = rendered(context.format("x"))
    drawn = Counter(t for t in page.tags if t != "br")
    assert drawn <= Counter(plain.tags), (value, context, MARKDOWN.render(context.format(as_text(value))))
    assert words(value) in page.words, (value, page.words)


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("value", PAYLOADS)
def test_hostile_text_renders_as_itself_in_markdown(value, context):
    assert_shown_as_text(value, context)


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from("ab1 \n\t.-+=)!#*_`[]()<>&;|~$@:/\\\"'x{}é"), max_size=40))
def test_any_text_of_markdowns_characters_renders_as_itself(value):
    assert_shown_as_text(value)
    assert_shown_as_text(value, CONTEXTS[3])


def test_bare_links_lose_what_makes_them_links():
    # GitHub's Markdown (marked in the page) links www.x, scheme://x and a@b.c without brackets.
    for value in (
        "www.evil.example",
        "WWW.evil.example",
        "https://evil.example",
        "ftp://evil.example",
        "a@evil.example",
    ):
        assert not re.search(r"(?<!\\)(www\.|://|@)", as_text(value), re.IGNORECASE), as_text(value)


@pytest.mark.parametrize("value", PAYLOADS[:12])
def test_a_code_span_shows_its_value_whole_and_nothing_else(value):
    value = " ".join(value.split())
    page = rendered(f"Kept it in {code_span(value)}.")
    assert page.tags == ["p", "code"] and value in page.words


def test_a_code_span_escapes_control_characters_and_cuts_at_its_limit():
    assert code_span("a\nb") == "`a\\nb`"
    assert code_span("x" * 80, 60) == f"`{'x' * 59}…`"


@pytest.mark.parametrize("value", [*PAYLOADS, PLOTTED])
def test_html_text_draws_no_element(value):
    page = Parsed(f"<div>{as_html(value)}</div>")
    assert page.tags == ["div"] and "".join(page.text) == value


# Gradio 6.31's info line under a field's label (templates/frontend/assets/src-*.js: the info-text component), in
# Python: the HTML escaped, then code, links, bold and emphasis by regex; no backslash escape.
def gradio_info(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r'<a href="\2">\1</a>', text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    text = re.sub(r"__(.+?)__", r"<strong>\1</strong>", text)
    text = re.sub(r"\*(.+?)\*", r"<em>\1</em>", text)
    return re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"<em>\1</em>", text, flags=re.ASCII)


@pytest.mark.parametrize("value", [HOSTILE, "[a](b) `c` **d** *e*"])
def test_a_fields_info_line_draws_no_link_code_or_emphasis(value):
    page = Parsed(gradio_info(as_info(value)))
    assert page.tags == [], page.tags
    assert "".join(page.text).replace("\u2060", "") == value.replace("`", "\u02cb").replace("*", "\u2217")


# ---------------------------------------------------------------- the page's Markdown from a hostile run and errors


def test_the_run_tabs_markdown_of_a_hostile_run_draws_nothing_of_it(tmp_path, monkeypatch):
    from tunedeck.backend.runs.manager import RunManager

    from .test_run_view import Drawn, RunShown

    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    grpo_run(tmp_path)
    drawn = Drawn(RunManager(tmp_path)).render(RunShown(run=GRPO_RUN, follow=False))
    said = {key: rendered(drawn[key]) for key in ("status", "facts", "summary", "answers")}
    for key, page in said.items():
        assert not {"a", "img", "em", "form", "input"} & set(page.tags), (key, drawn[key])  # code: the run id
    assert NAME in said["status"].words and HOSTILE in said["status"].words
    assert f"rewards: exact_answer, {REWARD_FILE}:score" in said["facts"].words
    assert HOSTILE in said["summary"].words and HOSTILE in said["answers"].words and PLOTTED in said["answers"].words
    assert [html.unescape(t.name) for t in drawn["loss_chart"].data if "evil" in t.name] == [PLOTTED]


def test_errors_quoting_the_input_read_as_text_in_the_notice_and_the_toast():
    import gradio as gr

    from tunedeck.app.errors import shown_as_message, user_message
    from tunedeck.backend.spec import SpecError
    from tunedeck.backend.spec.problem import error as problem

    error = SpecError(
        [problem("training.learning_rate", f"not a number: {HOSTILE}"), problem(f"model.{IMG}", "unknown field")]
    )
    notice = rendered(f"✗ **Not started:** {user_message(error, markdown=True)}")
    assert notice.tags == ["p", "strong", "code"]  # the label's key as code, nothing of the input
    assert f"Learning rate (training.learning_rate): not a number: {HOSTILE}; model.{IMG}: unknown" in notice.words

    @shown_as_message
    def handler():
        raise ValueError(HOSTILE)

    with pytest.raises(gr.Error) as toast:  # Gradio draws a toast's message as HTML
        handler()
    assert Parsed(toast.value.message).tags == [] and Parsed(toast.value.message).words == HOSTILE


def test_an_uploaded_job_files_keys_and_the_previews_error_read_as_text(tmp_path):
    from tunedeck.app.dataset_preview import preview_markdown
    from tunedeck.app.job_outputs import read_uploaded_spec

    spec = tmp_path / f"{IMG}.yaml"
    spec.write_text("model:\n  name_or_path: m\n  '[c](http://evil.example)': 1\n")
    said, loaded = read_uploaded_spec(str(spec))
    assert loaded is None and not {"a", "img", "em", "form", "input"} & set(rendered(said).tags)
    assert (
        f"{IMG}.yaml was not loaded" in rendered(said).words
        and "model.[c](http://evil.example)" in rendered(said).words
    )
    error = rendered(preview_markdown({"error": {"field": "dataset.path", "message": HOSTILE}}))
    assert error.tags == ["p", "code"] and HOSTILE in error.words
