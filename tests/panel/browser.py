"""Browser-test helpers: a real `tunedeck ui` server, and ways to drive Gradio widgets.

Never `playwright install`: the browser is Debian's /usr/bin/chromium.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "panel"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PanelServer:
    """`tunedeck ui` in its own process group; stopped (group and all) at the end of the module.

    With wait=False the constructor returns at once (boot the next panel while testing this one);
    call wait_ready() before using it.
    """

    def __init__(self, runs_dir: Path, *args: str, env: dict | None = None, wait: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.runs_dir = runs_dir
        self.log_path = runs_dir.parent / f"panel-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tunedeck", "ui", "--port", str(self.port), "--runs-dir", str(runs_dir), *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 240  # the demo preset may build the demo assets first
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"panel exited {self.proc.returncode}:\n{self.log()}")
            try:
                urllib.request.urlopen(self.url, timeout=2)
                return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"panel did not answer on {self.url}:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        """SIGTERM as a service manager sends it, or SIGINT as Ctrl-C in a terminal does."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, how)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def stop_live_runs(runs_dir: Path) -> None:
    """Stop every run still live in runs_dir and wait for it: a test module never leaves a run behind."""
    from tunedeck.backend.runs.manager import RunManager

    manager = RunManager(runs_dir)
    for run in manager.list_runs():
        if run.state in ("queued", "running", "stopping"):
            manager.stop(run.run_id, grace_s=5)
            manager.wait(run.run_id, timeout=60)


# ---------------------------------------------------------------- page helpers

# Installed with page.add_init_script before the page loads: records every event the page sends
# (POST queue/join, answered with the event's id) and every event whose result arrived
# (process_completed on the queue/data stream, which Gradio's client reads with fetch), so a test
# can wait until every response the page asked for has been applied, however late.
EVENTS_TAP_JS = r"""
(() => {
  const joins = [], done = new Set();
  window.__tunedeckEvents = {joins, done};
  const original = window.fetch;
  window.fetch = async (...args) => {
    const url = String((args[0] && args[0].url) || args[0]);
    const join = url.includes("/queue/join") ? {id: null} : null;
    if (join) joins.push(join);  // counted when sent, so a delayed request is waited for too
    const response = await original(...args);
    if (join) {
      response.clone().json().then(body => { join.id = body.event_id; }, () => {});
    } else if (url.includes("/queue/data") && (response.headers.get("content-type") || "").includes("event-stream")) {
      const reader = response.clone().body.getReader(), decoder = new TextDecoder();
      let buffer = "";
      (async () => {
        for (;;) {
          const {value, done: end} = await reader.read().catch(() => ({done: true}));  // Gradio aborts idle streams
          if (end) return;
          buffer += decoder.decode(value, {stream: true});
          const lines = buffer.split("\n");
          buffer = lines.pop();
          for (const line of lines) {
            if (!line.startsWith("data:")) continue;
            try { const m = JSON.parse(line.slice(5)); if (m.msg === "process_completed") done.add(m.event_id); } catch (e) {}
          }
        }
      })();
    }
    return response;
  };
})();
"""


def settle(page, timeout: float = 60_000) -> None:
    """Wait until every event the page has sent has its result applied (needs EVENTS_TAP_JS).

    Checked again after a pause: an `always_last` listener sends its held-back event only once
    the previous one has answered (from a setTimeout in Gradio's client, which runs before ours).
    """
    while True:
        count = page.evaluate("window.__tunedeckEvents.joins.length")
        page.wait_for_function(
            "n => { const e = window.__tunedeckEvents; return e.joins.slice(0, n).every(j => j.id && e.done.has(j.id)); }",
            arg=count,
            timeout=timeout,
        )
        page.wait_for_timeout(250)
        if page.evaluate("window.__tunedeckEvents.joins.length") == count:
            break
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")  # let Svelte paint


def field(page, path: str):
    """The input element of a spec field's widget (by its dotted path), its Advanced fold opened if it is
    in one (in the section on view; the page's own jump script does it, as a click on a problem does)."""
    from tunedeck.app.form import element_id, jump_targets

    box = page.locator(f"#{element_id(path)}")
    advanced = jump_targets()[element_id(path)][1]
    if advanced and page.locator(f"#{advanced}").is_visible() and not box.is_visible():
        page.locator(f"#{advanced} button.label-wrap").first.click()
    return box.locator("input, textarea").first


def set_field(page, path: str, value: str) -> None:
    fill(field(page, path), value)


def fill(box, value: str) -> None:
    """Replace a box's value with Playwright's fill (one scripted `input` event, as a paste or autofill
    makes): the page must take every way a value arrives, not only typed keys (app/text_edits.py)."""
    box.fill(str(value))


def open_run(page, url: str, run_id: str, timeout: float = 60_000) -> None:
    """A fresh page's Run tab showing `run_id`, picked from the Run box as a person does; settled."""
    page.set_default_timeout(timeout)
    page.goto(url)
    page.click("#tab-run-button")
    wait_text(page, "#runs-table", run_id, timeout)
    page.locator("#run-select input").click()
    page.locator(f'#run-select li[role=option][aria-label*="{run_id} · "]').click()  # not a run named after it
    wait_text(page, "#run-state", run_id, timeout)
    settle(page)


def choose(page, path: str, option: str) -> None:
    """Pick an option of a dropdown field."""
    from tunedeck.app.form import element_id

    field(page, path).click()
    page.locator(f'#{element_id(path)} li[role=option][aria-label="{option}"]').click()


def open_tab(page, tabs_id: str, name: str) -> None:
    """Select a tab by its title, also when Gradio moved it into the '...' overflow menu."""
    tab = page.locator(f"#{tabs_id} [role=tablist] > button[role=tab]", has_text=re.compile(rf"^{re.escape(name)}$"))
    if tab.count() and tab.first.is_visible():
        tab.first.click()
    else:
        page.locator(f"#{tabs_id} .overflow-menu > button").first.click()
        page.locator(
            f"#{tabs_id} .overflow-dropdown button", has_text=re.compile(rf"^{re.escape(name)}$")
        ).first.click()


def show_file(page, name: str) -> None:
    """Pick a generated file in the file strip."""
    page.locator("#file-tabs label", has_text=re.compile(rf"^\s*{re.escape(name)}\s*$")).click()


def file_names(page) -> list[str]:
    return [t.strip() for t in page.locator("#file-tabs label").all_inner_texts()]


def code_text(page, elem_id: str = "file-view") -> str:
    return page.locator(f"#{elem_id} .cm-content").inner_text()


def text_of(page, selector: str) -> str:
    """Visible text of a Markdown/HTML output (without Gradio's hidden progress tracker)."""
    return page.locator(f"{selector} .prose, {selector} .td-progress, {selector} .td-cards").first.inner_text()


def wait_text(page, selector: str, text: str, timeout: float = 20_000) -> None:
    page.wait_for_function(
        "([s, t]) => { const e = document.querySelector(s); return e && e.innerText.includes(t); }",
        arg=[selector, text],
        timeout=timeout,
    )


def wait_no_errors(page, timeout: float = 20_000) -> None:
    """Until the problems beside the form show no error: "No problems", or warnings only (a GPU job on this
    machine, which has no GPU, always has one: Start here would refuse it, backend/runs/preflight.py)."""
    page.wait_for_function(
        "() => { const e = document.querySelector('#job-issues'); "
        "return !!e && /No problems|warning/.test(e.innerText) && !e.innerText.includes('✗'); }",
        timeout=timeout,
    )


def wait_file_text(page, text: str, elem_id: str = "file-view", timeout: float = 20_000) -> None:
    """Wait until the shown file holds `text`, scrolling through it as a person would: CodeMirror draws only
    the lines near its viewport, so a line far down a long file is not in the page until scrolled to."""
    page.wait_for_function(
        """([id, t]) => {
            const content = document.querySelector(`#${id} .cm-content`);
            if (!content) return false;
            if (content.innerText.includes(t)) return true;
            const scroller = content.closest('.cm-scroller');
            const atEnd = scroller.scrollTop + scroller.clientHeight >= scroller.scrollHeight - 1;
            scroller.scrollTop = atEnd ? 0 : scroller.scrollTop + scroller.clientHeight;
            return false;
        }""",
        arg=[elem_id, text],
        timeout=timeout,
        polling=100,
    )


def plot_points(page, elem_id: str) -> dict[str, int]:
    """{trace name: number of points} of the plotly chart in a gr.Plot."""
    return page.evaluate(
        """id => { const d = document.querySelector('#' + id + ' .js-plotly-plot');
                   if (!d || !d.data) return {};
                   return Object.fromEntries(d.data.map(t => [t.name, (t.x || []).length])); }""",
        elem_id,
    )


def event_index(url: str, trigger: str, elem_id: str | None = None) -> int:
    """Gradio's fn_index of the page's listener for `trigger` on the component `elem_id` (None: the page)."""
    found = event_indexes(url, trigger, elem_id)
    if not found:
        raise LookupError(f"no {trigger} listener on {elem_id or 'the page'}")
    return found[0]


def event_indexes(url: str, trigger: str, elem_id: str | None = None) -> list[int]:
    """Every listener's fn_index for `trigger` on components with `elem_id` (None: also those without one, such
    as the sections' timers)."""
    import json

    config = json.load(urllib.request.urlopen(url + "config", timeout=10))
    ids = {c["id"]: c.get("props", {}).get("elem_id") for c in config["components"]}
    return [
        dependency["id"]
        for dependency in config["dependencies"]
        if any(event == trigger and ids.get(target) == elem_id for target, event in dependency["targets"])
    ]


class HeldEvent:
    """Holds the browser's requests to run one listener (POST queue/join) until release():
    a slow network or a busy server, on demand, to put responses in a chosen order."""

    def __init__(self, page, fn_index: int | list[int]):
        self.fn_indexes = set(fn_index) if isinstance(fn_index, list) else {fn_index}
        self.held, self.released = [], False
        self.page = page
        page.route("**/queue/join*", self._route)

    def _route(self, route) -> None:
        import json

        if not self.released and json.loads(route.request.post_data or "{}").get("fn_index") in self.fn_indexes:
            self.held.append(route)
        else:
            route.continue_()

    def wait_held(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.held:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page sent no request for events {sorted(self.fn_indexes)}")
            self.page.wait_for_timeout(50)

    def release(self) -> None:
        self.released = True
        for route in self.held:
            route.continue_()


# ---------------------------------------------------------------- readability

# WCAG 2.1 contrast of every visible text on the page against what is behind it, from computed
# styles: the text colour over the first opaque background up the tree (semi-transparent layers
# composited on the way; a gradient counts by its worst colour). Disabled controls are exempt
# (WCAG 1.4.3: "text that is part of an inactive user interface component"), as is text in SVG
# (chart labels: their fill is not a CSS colour of the element), and text hidden for screen readers only
# (a 1x1 px box).
CONTRAST_JS = r"""
() => {
  const parse = c => { const m = c.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const lum = ([r, g, b]) => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const over = (top, bottom) => { const a = top[3]; return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat(1); };
  function backgrounds(el) {  // the colours that can be behind el's text, nearest layer first
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const s = getComputedStyle(e);
      const image = s.backgroundImage || "";
      if (image.includes("gradient")) {
        const stops = (image.match(/rgba?\([^)]+\)/g) || []).map(parse);
        if (stops.length && stops.every(c => c[3] === 1)) return {layers, ends: stops};
      }
      const c = parse(s.backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] === 1) return {layers: layers.slice(0, -1), ends: [c]}; }
    }
    return {layers, ends: [[255, 255, 255, 1]]};
  }
  const failures = [];
  let checked = 0;
  for (const el of document.querySelectorAll("body *")) {
    if (el.closest("svg, [disabled], [aria-disabled=true], .cm-gutters")) continue;
    const own = [...el.childNodes].filter(n => n.nodeType === 3 && n.textContent.trim()).map(n => n.textContent.trim()).join(" ");
    if (!own) continue;
    const s = getComputedStyle(el), rect = el.getBoundingClientRect();
    if (rect.width <= 1 || rect.height <= 1 || s.visibility !== "visible" || el.closest("[hidden]") || !el.checkVisibility({opacityProperty: true})) continue;
    const color = parse(s.color);
    const {layers, ends} = backgrounds(el);
    let worst = Infinity;
    for (const end of ends) {
      const behind = layers.reduceRight((acc, layer) => over(layer, acc), end);
      worst = Math.min(worst, ratio(over(color, behind), behind));
    }
    const size = parseFloat(s.fontSize), bold = Number(s.fontWeight) >= 700;
    const need = size >= 24 || (size >= 18.66 && bold) ? 3.0 : 4.5;
    checked++;
    if (worst < need) failures.push({text: own.slice(0, 60), ratio: Math.round(worst * 100) / 100, need, color: s.color,
      where: (el.id ? "#" + el.id : el.tagName.toLowerCase()) + " in " + ((el.closest("[id]") || {}).id || "?")});
  }
  return {checked, failures};
}
"""


def contrast_failures(page) -> tuple[int, list[dict]]:
    """(texts checked, those below WCAG AA: 4.5:1, or 3:1 for large text) of the page as shown now."""
    result = page.evaluate(CONTRAST_JS)
    return result["checked"], result["failures"]
