"""Problems where they are: each field's look, each section tab's count, the Fix buttons, and
the script that jumps from a problem to its field.

Pure functions of a job's problems (no Gradio), so job_view sends only what changed and
tests read them directly. A field with an error is outlined red and says its problem in
place of its help; a warning, amber; its section's tab reads "Training ✗2" (✗ when one of
them is an error, ⚠ for warnings only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tunedeck.app.form import element_id, info_text, jump_targets
from tunedeck.app.untrusted_text import as_info
from tunedeck.backend.spec import FIELDS_BY_PATH, Problem, section_titles

MAX_FIXES = 6  # Fix buttons on the page; a job with more fixable problems shows the first ones


@dataclass(frozen=True)
class FieldLook:
    level: str | None  # "error", "warning" or None
    info: str  # the text under the label: the problem or the help, and the key

    @property
    def classes(self) -> list[str]:
        return {"error": ["invalid"], "warning": ["warned"]}.get(self.level or "", [])


def field_looks(problems: list[Problem]) -> dict[str, FieldLook]:
    """{path: look} for every field of the form: a problem's field says it, the others their help."""
    by_field: dict[str, list[Problem]] = {}
    for problem in problems:
        if problem.field in FIELDS_BY_PATH:
            by_field.setdefault(problem.field, []).append(problem)
    looks = {}
    for path, field in FIELDS_BY_PATH.items():
        own = by_field.get(path, [])
        if not own:
            looks[path] = FieldLook(None, info_text(field))
            continue
        level = "error" if any(p.level == "error" for p in own) else "warning"
        # A message may quote the input: its info line draws links and code of its own (app/untrusted_text.py).
        says = " ".join(("✗ " if p.level == "error" else "⚠ ") + as_info(p.message) for p in own)
        looks[path] = FieldLook(level, info_text(field, says))
    return looks


def tab_labels(problems: list[Problem]) -> dict[str, str]:
    """{section title: tab label}: the title, and the count of its fields' problems."""
    labels = {}
    for title in section_titles():
        own = [p for p in problems if p.field in FIELDS_BY_PATH and FIELDS_BY_PATH[p.field].section == title]
        mark = ("✗" if any(p.level == "error" for p in own) else "⚠") + str(len(own)) if own else ""
        labels[title] = f"{title} {mark}".strip()
    return labels


def fix_choices(problems: list[Problem]) -> list[tuple[str, dict]]:
    """(button label, {path: value}) for each problem with a single fix, each fix once, at most MAX_FIXES."""
    out: list[tuple[str, dict]] = []
    for problem in problems:
        if problem.fix and all(path in FIELDS_BY_PATH for path in problem.fix):
            label = f"Fix: {problem.fix_text()}"
            if label not in (known for known, _ in out):
                out.append((label, dict(problem.fix)))
    return out[:MAX_FIXES]


def problem_link(path: str) -> str:
    """The href of a problem's field in the problems list; JUMP_JS follows it."""
    return "#" + element_id(path)


# Runs once when the page loads (launch(js=...)). A click on a problem's field link opens the
# field's section tab and its Advanced accordion (Gradio renders a tab's content only once it is
# selected), then scrolls the field into view and focuses its input. window.tunedeckJump is the
# same, for tests and the console.
JUMP_JS = """
() => {
  const targets = __TARGETS__;
  const frame = () => new Promise(r => requestAnimationFrame(() => r()));
  const shown = el => el && el.offsetParent !== null;
  async function until(get, ms) {
    for (const end = Date.now() + ms; Date.now() < end; await frame()) { const el = get(); if (el) return el; }
    return null;
  }
  async function jump(id) {
    const where = targets[id];
    if (!where) return false;
    const [tabButton, advanced] = where;
    const tab = document.getElementById(tabButton);
    if (tab && tab.getAttribute("aria-selected") !== "true") tab.click();
    if (advanced) {
      const fold = await until(() => document.getElementById(advanced), 3000);
      const toggle = fold && fold.querySelector("button.label-wrap");
      if (toggle && !toggle.classList.contains("open")) toggle.click();
    }
    const field = await until(() => { const el = document.getElementById(id); return shown(el) ? el : null; }, 3000);
    if (!field) return false;
    field.scrollIntoView({block: "center"});
    const input = field.querySelector("input, textarea, select, button");
    if (input) input.focus({preventScroll: true});
    return true;
  }
  window.tunedeckJump = jump;
  document.addEventListener("click", event => {
    const link = event.target.closest && event.target.closest('a[href^="#field-"]');
    if (!link) return;
    event.preventDefault();
    event.stopPropagation();
    jump(link.getAttribute("href").slice(1));
  }, true);
}
""".replace("__TARGETS__", json.dumps(jump_targets()))
