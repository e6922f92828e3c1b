"""A conversation in the Try box of a run trained on chat data, in headless Chromium."""

from __future__ import annotations

import re
import shutil

import pytest
from panel.browser import PanelServer, fill, settle, wait_text

from .helpers import CHAT_SYSTEM
from .tab_driver import answer_of, open_after, pick

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, chat_run):
    runs_dir, run_id = chat_run
    mine = tmp_path_factory.mktemp("chat-panel") / "runs"
    shutil.copytree(runs_dir / run_id, mine / run_id, ignore=shutil.ignore_patterns("merged", "eval.json"))
    server = PanelServer(mine)
    server.run_id = run_id
    yield server
    server.stop()


def say(page, text: str) -> str:
    """Send `text` and wait for the answer; the status line of how it went."""
    fill(page.locator("#after-prompt textarea"), text)
    return say_as_is(page)


def say_as_is(page) -> str:
    """Send what the prompt box holds and wait for the answer; the status line of how it went."""
    page.click("#after-ask")
    settle(page, timeout=240_000)  # the answer's event has completed (the last status is not the previous one's)
    status = page.locator("#after-status").inner_text()
    assert "the prompt" in status, status
    return status


def prompt_tokens(status: str) -> int:
    return int(re.search(r"the prompt (\d+) tokens", status).group(1))


def test_a_chat_run_keeps_the_conversation_until_a_new_one_is_started(page, server):
    open_after(page, server)
    converse = page.locator("#after-converse input")
    assert converse.is_visible() and converse.is_checked()
    pick(page, "after-compare", "no comparison")

    first = say(page, "Add the numbers. 9 + 0")
    answer = answer_of(page, "after-answer")
    assert answer.startswith("> Add the numbers. 9 + 0\n"), answer
    assert page.locator("#after-prompt textarea").input_value() == ""  # sent: the box is free for the next turn

    second = say(page, "And 2 + 2?")
    both = answer_of(page, "after-answer")
    assert both.startswith(answer.rstrip("\n") + "\n\n> And 2 + 2?\n"), both  # the first turn, then this one
    assert prompt_tokens(second) > prompt_tokens(first)  # the model was sent the earlier turn too

    page.click("#after-new-chat")
    page.wait_for_function("() => document.querySelector('#after-answer textarea').value === ''")
    third = say(page, "And 2 + 2?")
    assert answer_of(page, "after-answer").startswith("> And 2 + 2?\n")
    assert prompt_tokens(third) < prompt_tokens(second)

    converse.uncheck()  # each prompt alone: the answer without the conversation's marks
    say(page, "And 2 + 2?")
    assert not answer_of(page, "after-answer").startswith(">")
    assert page.locator("#after-prompt textarea").input_value() == "And 2 + 2?"  # kept when not conversing
    page.click("#after-release")
    wait_text(page, "#after-status", "released")


def test_an_example_conversation_comes_with_its_system_message_and_earlier_turns(page, server):
    open_after(page, server)
    pick(page, "after-compare", "no comparison")
    page.click("#after-example")
    wait_text(page, "#after-example-note", "with its system message and 1 earlier turn")
    assert page.locator("#after-system textarea").input_value() == CHAT_SYSTEM
    earlier = answer_of(page, "after-answer")  # the previous row's question and the data's answer to it
    assert re.fullmatch(r"> [^\n]+\n[^\n]+\n\n", earlier), earlier
    prompt = page.locator("#after-prompt textarea").input_value()

    status = say_as_is(page)
    assert answer_of(page, "after-answer").startswith(f"{earlier}> {prompt}\n")
    assert re.search(r"[✓✗] (contains )?(not )?the data's answer", status), (
        status
    )  # judged: the prompt was the example's
    page.click("#after-release")
    wait_text(page, "#after-status", "released")
