"""The page by keyboard and in a narrow window: what Gradio 6.31's components leave out, added by CSS and
one script run at page load (issue 31, item 8).

Gradio's components, as 6.31 renders them (its frontend assets, minified Svelte):

- Dropdown opens its list on focus, so every Tab through the form unfolds one; and its keydown handler
  (any key but Escape opens the list) finishes after a tick, after the blur of a Tab has closed it: the
  list stayed open under the field the focus had left (a floating "✓ bfloat16" chip). Here a dropdown
  stays closed when the keyboard or a script focuses it; Enter, Space, ArrowDown/Up, typing or a click
  opens it; Tab and the modifier keys never reach its handler, so the blur closes it for good; and after
  Enter picks an option the focus stays on the field (Gradio blurs it, which sent the next Tab to the
  page's top).
- Tabs render one tab stop per tab and no arrow keys; Radio gives each of its inputs a name of its own
  (`radio-<n>`), so each option was a tab stop and arrow keys did nothing. WAI-ARIA's tabs and
  radio-group patterns: one tab stop per group, arrows move within it. Here a tab bar keeps only its
  selected tab in the tab order and ArrowLeft/Right/Home/End select the neighbour (automatic activation:
  a tab's panel shows at once); a radio group's inputs share one name, so the browser's own radio keys work.
- A Textbox's or Number's <label> holds its help text too, so the field's accessible name was the label and
  the whole help (or problem) text. Here the name is the label (aria-labelledby) and the help its
  description (aria-describedby); a field with an error is aria-invalid.
- The code viewer's download is a link around a button (two tab stops, the link named by nothing of its
  own): the link is named "Download <file>", the button inside leaves the tab order; Copy names its file.
- The page's first tab stop is a link to the job form's first field (the presets, uploads and tab bars
  came first: 21 stops).

Gradio re-renders components (a new option list, a tab bar, a radio's name on every selection), so the
script fixes the page again after each change a MutationObserver on the page's root reports. It watches
added elements and a few attributes, not text: an idle page changes nothing of those, so the observer costs
an idle page nothing (app/idle_costs.py; measured in tests/panel/test_browser_a11y.py).
"""

from __future__ import annotations

import json

WIDE_PX = 1100  # below this width the Job tab stacks its two columns and the run picker takes a row
TABLE_MIN_PX = 1100  # the memory table's width in a narrower window: it scrolls (no word breaks in its 14 columns)
SKIP_TEXT = "Skip to the job form"
SKIP_TARGET = "form-sections"  # the job form's section tabs (app/form.py)

# Components without a label of their own to name their group by.
GROUP_NAMES = {"file-tabs": "Generated file to show"}

FOCUS_COLOR = "#3730a3"  # indigo-800: 10:1 on white, 3:1 or more on the page's fills

CSS = f"""
/* A visible focus outline on every control, scrolled box included (Gradio's inputs, radios and checkboxes
   draw none: "outline: none !important" on input[type=text].svelte-x; :not(#td-none) outranks it). */
.gradio-container :focus-visible:not(#td-none), .td-skip:focus-visible {{
  outline: 3px solid {FOCUS_COLOR} !important; outline-offset: 1px !important;
}}
.dark .gradio-container :focus-visible:not(#td-none) {{ outline-color: #a5b4fc !important; }}
/* The skip link: off screen until focused, then over the page's top left corner. */
.td-skip {{
  position: absolute; left: 8px; top: -200px; z-index: 1000; padding: 8px 14px; border-radius: 6px;
  background: #ffffff; color: {FOCUS_COLOR}; font-weight: 600; box-shadow: 0 2px 8px rgba(0, 0, 0, 0.25);
}}
.td-skip:focus {{ top: 8px; }}
/* Tables keep whole words (Gradio's cells break anywhere: "Tra in GB", "n a m e"), and the memory table scrolls
   sideways below its width (Gradio sizes its columns as percentages of the table's width). */
.table-wrap .wrap {{ word-break: normal !important; overflow-wrap: normal !important; }}
#estimate-table .table-wrap {{ overflow-x: auto; }}
#estimate-table .upload-container {{ min-width: {TABLE_MIN_PX}px; }}
@media (max-width: {WIDE_PX}px) {{
  /* The Job tab in one column: the form, then the files and estimate it makes. */
  .row:has(> .column > #form-sections) {{ flex-direction: column !important; }}
  .row:has(> .column > #form-sections) > .column {{ width: 100% !important; min-width: 100% !important; }}
  /* The run pickers on a row of their own: run names are long (Gradio wraps a row's form fields in a .form). */
  #run-select, #after-run, .form:has(> #run-select) {{ flex: 1 1 100% !important; min-width: 100% !important; }}
}}
"""

JS = (
    """
() => {
  if (window.__tunedeckKeyboard) return;
  window.__tunedeckKeyboard = true;
  const root = document.querySelector("gradio-app") || document.body;
  const GROUP_NAMES = __GROUP_NAMES__;
  const shown = el => el && el.offsetParent !== null && !el.disabled;
  const set = (el, name, value) => {  // only a change: our own writes must not wake the observer forever
    if (value === null) { if (el.hasAttribute(name)) el.removeAttribute(name); }
    else if (el.getAttribute(name) !== String(value)) el.setAttribute(name, value);
  };
  let ids = 0;
  const idOf = el => el.id || (el.id = "td-" + ++ids);
  const blockOf = el => el.closest("div.block, fieldset.block");  // a component (a Number's <label> is .block too)

  // ---- the skip link: the first tab stop, to the first field of the job form's section in view
  const skip = document.createElement("a");
  skip.className = "td-skip";
  skip.href = "#__SKIP_TARGET__";
  skip.textContent = __SKIP_TEXT__;
  skip.addEventListener("click", async event => {
    event.preventDefault();
    const jobTab = document.getElementById("tab-job-button");
    if (jobTab && jobTab.getAttribute("aria-selected") !== "true") jobTab.click();
    for (const end = Date.now() + 3000; Date.now() < end; await new Promise(r => setTimeout(r, 50))) {
      const form = document.getElementById("__SKIP_TARGET__");
      const first = form && [...form.querySelectorAll("input, textarea, select")].find(
        el => shown(el) && el.tabIndex >= 0 && el.type !== "hidden" && el.type !== "file");
      if (first) { first.focus(); first.scrollIntoView({block: "center"}); return; }
    }
  });
  document.body.prepend(skip);

  // ---- dropdowns: closed until asked (see app/keyboard.py)
  const isCombo = el => el instanceof HTMLInputElement && el.getAttribute("role") === "combobox";
  let pointed = null;  // what the last pointer press was on: a click that focuses a dropdown opens it
  document.addEventListener("pointerdown", event => { pointed = event.target; }, true);
  document.addEventListener("click", event => {  // a click on a dropdown the keyboard focused: no focus event comes
    const box = event.target;
    if (isCombo(box) && box === document.activeElement && box.getAttribute("aria-expanded") !== "true") {
      box.dispatchEvent(new FocusEvent("focus"));
    }
  }, true);
  document.addEventListener("focus", event => {
    const box = event.target;
    if (!event.isTrusted || !isCombo(box)) return;
    const block = blockOf(box);
    if (pointed instanceof Element && block && blockOf(pointed) === block) return;
    event.stopImmediatePropagation();  // Gradio's focus handler opens the list
  }, true);
  const OPENERS = new Set(["Enter", " ", "ArrowDown", "ArrowUp"]);
  const INERT = new Set(["Tab", "Shift", "Control", "Alt", "Meta", "CapsLock", "Escape"]);
  document.addEventListener("keydown", event => {
    pointed = null;
    const box = event.target;
    if (!isCombo(box)) return;
    const open = box.getAttribute("aria-expanded") === "true";
    if (event.key === "Escape" && open) return;  // Gradio's handler closes it
    if (INERT.has(event.key)) { event.stopImmediatePropagation(); return; }
    if (!open && OPENERS.has(event.key)) {
      event.preventDefault();
      event.stopImmediatePropagation();
      box.dispatchEvent(new FocusEvent("focus"));  // Gradio's own opening, with the chosen option active
    } else if (open && event.key === "Enter") {
      // Gradio picks the option and blurs the field a tick later: give the focus back to it, closed.
      setTimeout(() => { if (!document.activeElement || document.activeElement === document.body) box.focus(); }, 0);
    }
  }, true);

  // ---- tab bars: arrow keys move and select (WAI-ARIA tabs, automatic activation)
  document.addEventListener("keydown", event => {
    const tab = event.target instanceof Element && event.target.closest("[role=tab]");
    if (!tab || event.altKey || event.ctrlKey || event.metaKey) return;
    const tabs = [...tab.closest("[role=tablist]").querySelectorAll("[role=tab]")].filter(shown);
    const at = tabs.indexOf(tab);
    const to = {ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: tabs.length - 1}[event.key];
    if (to === undefined || at < 0) return;
    event.preventDefault();
    const next = tabs[(to + tabs.length) % tabs.length];
    next.focus();
    if (next.getAttribute("aria-selected") !== "true") next.click();
  });

  // ---- what Gradio renders, made right, again after each change
  const stats = window.tunedeckKeyboard = {passes: 0, ms: 0};  // what the fixing costs (the tests read it)
  function fix() {
    const start = performance.now();
    fixAll();
    stats.passes++;
    stats.ms += performance.now() - start;
  }
  function fixAll() {
    for (const list of root.querySelectorAll("[role=tablist]")) {
      const tabs = [...list.querySelectorAll("[role=tab]")];
      const selected = tabs.find(t => t.getAttribute("aria-selected") === "true") || tabs[0];
      for (const tab of tabs) set(tab, "tabindex", tab === selected ? "0" : "-1");
    }
    for (const group of root.querySelectorAll("fieldset.block")) {
      const radios = group.querySelectorAll("input[type=radio]");
      if (!radios.length) continue;
      for (const radio of radios) set(radio, "name", "td-group-" + idOf(group));
      set(group, "role", "radiogroup");
      const label = group.querySelector("[data-testid=block-info]");
      if (GROUP_NAMES[group.id]) set(group, "aria-label", GROUP_NAMES[group.id]);
      else if (label) set(group, "aria-labelledby", idOf(label));
    }
    for (const help of root.querySelectorAll(".info-text")) {
      const block = blockOf(help);
      if (!block) continue;
      const label = block.querySelector("[data-testid=block-info]");
      const invalid = block.classList.contains("invalid") ? "true" : null;
      if (block.matches("fieldset")) { set(block, "aria-describedby", idOf(help)); continue; }  // a radio group
      for (const box of block.querySelectorAll("input:not([type=hidden]):not([type=file]), textarea")) {
        set(box, "aria-describedby", idOf(help));
        set(box, "aria-invalid", invalid);
        if (label && box.type !== "checkbox") set(box, "aria-labelledby", idOf(label));
      }
    }
    for (const link of root.querySelectorAll("a.download-link, a[download]")) {
      const block = blockOf(link);
      const file = block && block.querySelector("[data-testid=block-label]");
      const name = ((file && file.textContent) || link.getAttribute("download") || "").trim();
      if (link.textContent.trim()) continue;  // a link with words of its own is named by them
      set(link, "aria-label", ("Download " + name).trim());
      for (const inner of link.querySelectorAll("button")) { set(inner, "tabindex", "-1"); set(inner, "aria-hidden", "true"); }
    }
    for (const copy of root.querySelectorAll("button.icon-button[aria-label=Copy]")) {
      const file = blockOf(copy)?.querySelector("[data-testid=block-label]");
      if (file && file.textContent.trim()) set(copy, "aria-label", "Copy " + file.textContent.trim());
    }
    for (const scroller of root.querySelectorAll(".cm-scroller")) {  // read-only code: scrolled by keyboard
      const content = scroller.querySelector(".cm-content");
      if (content && content.getAttribute("contenteditable") === "true") continue;
      const file = blockOf(scroller)?.querySelector("[data-testid=block-label]");
      set(scroller, "tabindex", "0");
      set(scroller, "role", "region");
      set(scroller, "aria-label", ((file && file.textContent.trim()) || "Code") + " (read only)");
    }
    for (const upload of root.querySelectorAll("button.upload-container")) {  // its label and what it says
      const label = blockOf(upload)?.querySelector("[data-testid=block-label]");
      const says = upload.querySelector("[data-testid=upload-text]");
      if (label && says) set(upload, "aria-labelledby", idOf(label) + " " + idOf(says));
    }
    for (const empty of root.querySelectorAll(".empty[aria-label]:not([role])")) set(empty, "role", "img");
    for (const fold of root.querySelectorAll("button.label-wrap")) set(fold, "aria-expanded", fold.classList.contains("open"));
  }

  let queued = false;
  const later = () => { if (!queued) { queued = true; setTimeout(() => { queued = false; fix(); }, 0); } };
  new MutationObserver(records => {
    for (const record of records) {
      if (record.type === "attributes" || [...record.addedNodes].some(n => n.nodeType === 1)) return later();
    }
  }).observe(root, {subtree: true, childList: true, attributes: true,
                    attributeFilter: ["class", "name", "aria-selected", "aria-label", "tabindex", "href"]});
  fix();
}
""".replace("__GROUP_NAMES__", json.dumps(GROUP_NAMES))
    .replace("__SKIP_TEXT__", json.dumps(SKIP_TEXT))
    .replace("__SKIP_TARGET__", SKIP_TARGET)
)
