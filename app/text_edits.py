"""Every way a value reaches a text box counts, not only typed characters.

Gradio 6.31's Textbox sends its `input` event from a `keypress` handler (its Textbox.svelte:
`on:keypress` -> `oninput(value)`): a typed character counts, but a paste, a cut, Backspace,
Delete, select-all + Delete, autofill, drag-and-drop, IME composition and a scripted fill
(Playwright's `fill`) change the box without any event reaching the server. The job then
silently differed from the page: a pasted model id left the files, the estimate and the
downloaded bundle on the old model (issue 31).

The browser's own `input` event fires for every one of those gestures (HTML's "input" event:
any change of the value by the user). This script listens for it on the whole document and,
once the box's bound value has taken it (a task later: Svelte's binding listens on the element
itself), asks Gradio's handler to send it, by dispatching the event that handler listens to.
The keypresses Gradio would act on itself are held back, except Enter (which submits), so
each edit is sent once.

Number, Dropdown, Checkbox and Radio send `input` from the browser's own events already.
"""

from __future__ import annotations

# Gradio's text inputs: single-line and multi-line text, password and email boxes.
TEXT_BOX = 'textarea[data-testid="textbox"], input[data-testid="textbox"], input[data-testid="password"]'

FORWARD_EDITS_JS = f"""() => {{
  if (window.__tunedeckForwardEdits) return;
  window.__tunedeckForwardEdits = true;
  const isBox = t => t instanceof Element && t.matches('{TEXT_BOX}');
  // Gradio's keypress handler sends the value for every key but Enter's submit; the input event below
  // sends every change instead (a keypress that inserts a character is followed by its input event).
  document.addEventListener('keypress', e => {{
    if (e.isTrusted && isBox(e.target) && e.key !== 'Enter') e.stopImmediatePropagation();
  }}, true);
  document.addEventListener('input', e => {{
    if (!isBox(e.target)) return;
    const box = e.target;
    setTimeout(() => box.dispatchEvent(new KeyboardEvent('keypress', {{key: 'Unidentified', bubbles: true}})), 0);
  }}, true);
}}"""
