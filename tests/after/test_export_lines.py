"""The Export section's line for an export check: what it says when every answer stayed the same, and what it names
when they did not (flags first, then the differing answers, a few of them)."""

from __future__ import annotations

from tunedeck.app.export_view import DIFFERENCES_SHOWN, checks_markdown


def report(identical: int, prompts: int, flags=(), differing=()) -> dict:
    return {
        "target": "/runs/r/gguf/m/m-q4_k_m.gguf",
        "prompts": prompts,
        "identical": identical,
        "source": "/home/me/.cache/tunedeck/demo/data/eval.jsonl",
        "held_out": True,
        "flags": list(flags),
        "differing": list(differing),
    }


def test_identical_answers_are_one_line_per_file_checked():
    text = checks_markdown([report(24, 24), {**report(24, 24), "target": "/runs/r/merged/m"}])
    lines = text.strip().split("\n\n")  # a paragraph each
    assert lines[0] == (
        "✓ `m-q4_k_m.gguf`: **24/24 answers identical after export** "
        "(greedy answers to held-out rows of `eval.jsonl`, beside the adapter's)"
    )
    assert lines[1].startswith("✓ `m`: **24/24 answers identical after export**")
    unheld = checks_markdown([{**report(24, 24), "held_out": False, "source": "/data/train.jsonl"}])
    assert "(greedy answers to training rows of `train.jsonl` (none held out), beside" in unheld
    assert checks_markdown([]) == ""  # the box unticked: no line


def test_what_differs_is_named_with_its_flags_and_first_differing_token():
    diffs = [
        {"prompt": f"Q: {n} + 1 =", "first_differing_token": n, "adapter": f"{n + 1}", "exported": ""}
        for n in range(DIFFERENCES_SHOWN + 2)
    ]
    flag = "m has no chat template in its metadata"
    head, items = checks_markdown([report(19, 24, [flag], diffs)]).strip().split("\n\n")  # a line, then a list
    assert head.startswith("⚠ `m-q4_k_m.gguf`: **19/24 answers identical after export**")
    lines = items.splitlines()
    assert lines[0] == f"- ⚠ {flag}"
    assert lines[1] == "- `Q: 0 + 1 =` differs from token 0: adapter `1`, exported `(nothing)`"
    assert len(lines) == 1 + DIFFERENCES_SHOWN + 1
    assert lines[-1] == "- and 2 more (`tunedeck check-export RUN TARGET --json` lists them all)"
    # an identical count with a flag is no ✓: a template that did not travel matters even when answers agree
    assert checks_markdown([report(24, 24, [flag])]).strip().startswith("⚠")
