"""An Ollama Modelfile for an exported GGUF: the run's prompt format as Ollama's TEMPLATE, its stop tokens, its system
prompt. No torch: the chat template is rendered by the caller's tokenizer (`render` below).

Ollama's TEMPLATE is a Go template over .System, .Prompt and .Messages (each with .Role and .Content). The most
common complaint after an export is answers that degrade because the chat template or the stop tokens did not
travel (ollama/ollama#6823, #8363; hiyouga/LlamaFactory#6020). The TEMPLATE is made the way the run prompts:
  chat     from the tokenizer's own chat template, rendered with marked messages: what it puts before and after
           each role's content is read off the rendering and written around {{ .Content }} per role
           (Llama 3, Qwen/ChatML, Mistral-style and the demo's templates wrap each message on its own), and
           checked: rendered again as Ollama would, a conversation must give the tokenizer's text exactly
  alpaca   train.py's Alpaca prompt around {{ .Prompt }}
  plain    {{ .Prompt }} as typed (prompt-completion and text data: the prompt field is all there was)
"""

from __future__ import annotations

from collections.abc import Callable

from tunedeck.backend.after.prompting import resolve_template
from tunedeck.backend.recipe import ALPACA_PROMPT

ROLES = ("system", "user", "assistant")
# Marks that no template adds or changes: the rendering is split at them.
MARK = {"system": "\x01SYSTEM\x01", "user": "\x02USER\x02", "assistant": "\x03ASSISTANT\x03"}


CHECKED = (
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Add 1 + 1."},
    ],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse a b."}],
)


class TemplateNotConvertible(ValueError):
    """The chat template does not wrap each message on its own; the message says what differs."""


def chat_go_template(render: Callable[[list[dict], bool], str], bos: str | None) -> str:
    """Ollama's TEMPLATE for a chat template, `render(messages, add_generation_prompt)` being the tokenizer's.

    Each role's wrapping is read off the smallest conversation that has it (a user message; a system message before
    it; an assistant answer after it), then checked on longer ones. `bos`, when the template writes it, is left
    out: llama.cpp adds it itself (tokenizer.ggml.add_bos_token).
    """

    def rendered(messages: list[dict], generation_prompt: bool = False) -> str:
        text = render(messages, generation_prompt)
        return text[len(bos) :] if bos and text.startswith(bos) else text

    def around(text: str, mark: str) -> tuple[str, str]:
        if text.count(mark) != 1:
            raise TemplateNotConvertible("the chat template drops or repeats a message's content")
        before, after = text.split(mark)
        return before, after

    user = {"role": "user", "content": MARK["user"]}
    user_alone = rendered([user])
    parts = {"user": around(user_alone, MARK["user"])}
    with_system = rendered([{"role": "system", "content": MARK["system"]}, user])
    if not with_system.endswith(user_alone):
        raise TemplateNotConvertible("the chat template folds the system message into the user's")
    parts["system"] = around(with_system[: len(with_system) - len(user_alone)], MARK["system"])
    with_answer = rendered([user, {"role": "assistant", "content": MARK["assistant"]}])
    if not with_answer.startswith(user_alone):
        raise TemplateNotConvertible("the chat template writes a user message differently before an answer")
    parts["assistant"] = around(with_answer[len(user_alone) :], MARK["assistant"])
    generation_prompt = rendered([user], True)[len(user_alone) :]
    for conversation in CHECKED:  # longer conversations than the ones the parts were read off
        want = rendered(conversation, True)
        got = (
            "".join(parts[m["role"]][0] + m["content"] + parts[m["role"]][1] for m in conversation) + generation_prompt
        )
        if got != want:
            raise TemplateNotConvertible(
                f"the chat template does not wrap each message on its own (for {len(conversation)} messages it "
                f"writes {want[:120]!r}, its parts would give {got[:120]!r}): a default system prompt?"
            )
    return (
        "{{- range .Messages }}"
        + "".join(
            f'{"{{ if" if i == 0 else "{{ else if"} eq .Role "{role}" }}}}{_go(pre)}{{{{ .Content }}}}{_go(post)}'
            for i, (role, (pre, post)) in enumerate(parts.items())
        )
        + "{{ end }}{{ end }}"
        + _go(generation_prompt)
    )


def _go(text: str) -> str:
    """Literal text inside a Go template: as it is, save for "{{", which would open an action."""
    return text.replace("{{", '{{ "{{" }}')


def plain_go_template(template: str) -> str:
    """TEMPLATE for the alpaca and plain prompt formats: the prompt as the run trained on it."""
    if template == "alpaca":
        before, after = ALPACA_PROMPT.split("{instruction}")
        return _go(before) + "{{ .Prompt }}" + _go(after)
    return "{{ .Prompt }}"


def ollama_model(
    gguf_name: str,
    dataset_format: str,
    render: Callable[[list[dict], bool], str] | None,
    bos: str | None,
    stops: list[str],
    system: str = "",
) -> dict:
    """What Ollama is told of the model: {"from", "template", "stops", "system", "prompt_format"} (chat, alpaca or
    plain); the Modelfile (modelfile_text) and the page's Create in Ollama (backend/after/ollama_create.py) say the same."""
    kind = resolve_template("auto", dataset_format, render is not None)
    template = chat_go_template(render, bos) if kind == "chat" and render else plain_go_template(kind)
    return {
        "from": gguf_name,
        "template": template,
        "stops": list(dict.fromkeys(s for s in stops if s)),
        "system": system.strip(),
        "prompt_format": kind,
    }


def modelfile_text(model: dict) -> str:
    """The Modelfile of ollama_model's answer (a None template: no TEMPLATE line)."""
    lines = [f"FROM ./{model['from']}"]
    if model["template"] is not None:
        lines.append(f'TEMPLATE """{model["template"]}"""')
    lines += [f'PARAMETER stop "{_quoted(stop)}"' for stop in model["stops"]]
    if model["system"]:
        lines.append(f'SYSTEM """{model["system"]}"""')
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
