"""The training objectives, one row each: what TRL trains it with and what every layer derives from that.

A row says what TRL class trains the objective (module, config and trainer), which dataset formats it
reads, how many forward passes a trained token costs beside the model's own forward and backward (the
speed model), how many sequences a row's token count covers (memory: DPO's chosen and rejected run as
one batch of twice the rows), the spec section of its knobs and which of them it reads, the TRL
arguments it fixes, the keys its log records carry and the Run tab's chart family for them.

Derived from it: the spec's `objective` literal and its description (backend/spec/job.py), which
objective reads which format (OBJECTIVE_FORMATS: validation's formats rule, the upload's objective
switch), field applicability (backend/spec/applies.py), training_args.yaml's fixed arguments, the
recipe's trainer choice and record keys, the charts (app/charts.py), the facts line
(backend/runs/summary.py) and the speed and memory passes (backend/spec/flops.py). What is particular to
one method (GRPO's rewards and its answers) stays in that method's own module.

Standard library only: this ships in every bundle with the recipe, and tunedeck imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SFT_FORMATS = ("text", "prompt-completion", "messages", "alpaca")  # demonstrations (vocabulary.DATASET_FORMATS)
REWARDS = (("reward_chosen", "rewards/chosen"), ("reward_rejected", "rewards/rejected"),
           ("reward_margin", "rewards/margins"))  # fmt: skip
WINS = (("reward_accuracy", "rewards/accuracies"),)  # the share of pairs where the chosen answer's reward is higher


@dataclass(frozen=True)
class Objective:
    name: str  # the value of objective
    title: str  # its name for people, e.g. "DPO"
    learns: str  # what it learns, a few words for the spec's description
    reads: str  # what its data is, for the formats rule's messages
    trl_module: str  # where TRL keeps its classes (TRL 1.16: ORPO and CPO/SimPO are in trl.experimental)
    config: str  # TRL's config class: training_args.yaml holds its keyword arguments
    trainer: str  # TRL's trainer class
    formats: tuple[str, ...]  # the dataset formats it reads, the first the one it is named for
    # Per trained token, the forward passes without gradients: by its reference, and by the model itself (the
    # KL answers of KTO, the answers GRPO writes); the model's forward and backward are not counted here.
    reference_passes: int
    own_passes: int
    sequences_per_row: int  # the sequences a row's token count covers (pairs: chosen and rejected, both counted)
    section: str | None  # the spec section of its knobs
    knobs: tuple[str, ...]  # the fields it reads (globs over dotted paths): where they apply
    fixed: tuple[tuple[str, Any], ...]  # TRL config arguments it sets itself (training_args.yaml)
    logs: tuple[tuple[str, str], ...]  # log record key -> what its trainer logs (eval_ before both when held out)
    chart: str | None  # the Run tab's chart family for its log keys (app/charts.py)
    # How its trainer weighs an answer: "sum" of its tokens' log-probabilities (DPO, KTO), or their "mean" (ORPO,
    # SimPO: length-normalised); Evaluate's chosen-preferred share compares the pair's answers the same way.
    answer_score: str = "sum"

    @property
    def needs_reference(self) -> bool:
        """Whether it always scores against a reference (the base with the adapters off, or a frozen copy)."""
        return self.reference_passes > 0

    @property
    def record_keys(self) -> dict[str, str]:
        """{record key: logged key} of the training rows, and under eval_ of the held-out ones."""
        return {f"{prefix}{key}": f"{prefix}{logged}" for prefix in ("", "eval_") for key, logged in self.logs}

    @property
    def eval_passes(self) -> int:
        """Forward passes an evaluation spends on a held-out row: each sequence by the model, the model's own extra
        pass, and each sequence by the reference (GRPO writes answers instead: the speed model times them)."""
        return self.sequences_per_row + self.own_passes + self.reference_passes * self.sequences_per_row


# DPO's reference scores the chosen and the rejected answer (two sequences a row, both counted); KTO's reference
# scores the answer and a mismatched answer for the KL estimate, which the model scores too (the KL answers are
# not counted as tokens). GRPO's model writes its answers first, a forward a token (with the KV cache; the prompt
# once); a KL weight (grpo.beta > 0) adds a reference pass (flops.extra_forwards), without one GRPO has none.
# ORPO and SimPO are reference-free: the pair's two answers are the model's forward and backward, nothing more.
OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            "sft", "SFT", "learn the answers in the data", "demonstrations", "trl", "SFTConfig", "SFTTrainer", SFT_FORMATS,
            0, 0, 1, None, (), (), (), None,
        ),
        Objective(
            "dpo", "DPO", "learn to prefer the chosen answer of each pair over the rejected one",
            "preference pairs (a prompt, a chosen and a rejected answer)", "trl", "DPOConfig", "DPOTrainer", ("preference",), 1, 0, 2, "preference",
            ("preference.beta", "preference.loss_type", "preference.precompute_ref_log_probs"), (),
            REWARDS + WINS, "pairs",
        ),
        Objective(
            "kto", "KTO", "learn from answers rated good or bad one at a time, or from pairs",
            "answers labelled good or bad (a prompt, an answer and a true/false label) or from preference pairs", "trl", "KTOConfig", "KTOTrainer", ("unpaired-preference", "preference"), 2, 1, 1, "preference",
            ("preference.beta", "preference.*_weight", "preference.precompute_ref_log_probs"), (),
            REWARDS + (("kl", "kl"),), "unpaired",
        ),
        Objective(
            "grpo", "GRPO", "write several answers per prompt and learn toward the ones the rewards score higher",
            "prompts (the model writes the answers, the rewards score them)", "trl", "GRPOConfig", "GRPOTrainer",
            ("prompt-only",), 0, 1, 1, "grpo", ("grpo.*",), (),
            (("reward", "reward"), ("reward_std", "reward_std"), ("completion_length", "completions/mean_length"),
             ("completions_clipped", "completions/clipped_ratio"), ("groups_without_signal", "frac_reward_zero_std"),
             ("kl", "kl")),
            "answers",
        ),
        # ORPO (Hong et al. 2024): the chosen answer's NLL plus beta times the log odds ratio of chosen over rejected.
        Objective(
            "orpo", "ORPO", "learn the chosen answer of each pair and to prefer it over the rejected one, without "
            "a reference", "preference pairs (a prompt, a chosen and a rejected answer)",
            "trl.experimental.orpo", "ORPOConfig", "ORPOTrainer", ("preference",), 0, 0, 2, "preference",
            ("preference.beta",), (),
            REWARDS + WINS + (("nll_loss", "nll_loss"), ("log_odds_ratio", "log_odds_ratio"),
                              ("log_odds_chosen", "log_odds_chosen")),
            "odds", "mean",
        ),
        # SimPO (Meng et al. 2024): TRL's CPO trainer with its simpo loss and no NLL term (cpo_alpha 0): beta times
        # the chosen answer's mean log-probability less the rejected one's, by a margin of preference.simpo_gamma.
        Objective(
            "simpo", "SimPO", "learn to prefer the chosen answer of each pair by a margin of mean log-probability, "
            "without a reference", "preference pairs (a prompt, a chosen and a rejected answer)",
            "trl.experimental.cpo", "CPOConfig", "CPOTrainer", ("preference",), 0, 0, 2, "preference",
            ("preference.beta", "preference.simpo_gamma"), (("loss_type", "simpo"), ("cpo_alpha", 0.0)),
            REWARDS + WINS, "pairs", "mean",
        ),
    )
}  # fmt: skip

# What a job learns from, and the dataset formats of each objective (the first is the one it is named for).
OBJECTIVE_FORMATS: dict[str, tuple[str, ...]] = {name: o.formats for name, o in OBJECTIVES.items()}
# The objectives that always score against a reference.
REFERENCE_OBJECTIVES = tuple(name for name, o in OBJECTIVES.items() if o.needs_reference)


def objective(name: str | None) -> Objective:
    """The row of job.objective (SFT when unset); KeyError names an unknown one."""
    return OBJECTIVES[name or "sft"]


def knob_readers() -> dict[str, list[str]]:
    """{knob (a glob over dotted paths): the objectives that read it}, then {section.*: the objectives of the
    section} for the section's other fields; in table order (backend/spec/applies.py: the first match decides)."""
    out: dict[str, list[str]] = {}
    for name, o in OBJECTIVES.items():
        for knob in o.knobs:
            out.setdefault(knob, []).append(name)
    for name, o in OBJECTIVES.items():
        if o.section and name not in out.setdefault(f"{o.section}.*", []):
            out[f"{o.section}.*"].append(name)
    return out


def objectives_said(names: list[str]) -> str:
    """'dpo, kto or orpo'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def objectives_described() -> str:
    """The spec's description of `objective`: each with what it learns and the format it is named for."""
    said = [
        f"{name} ({o.learns}{'' if name == 'sft' else f': dataset.format={o.formats[0]}'})"
        for name, o in OBJECTIVES.items()
    ]
    return objectives_said(said) + "."


def section_described(section: str) -> str:
    """'objective=dpo, kto, orpo or simpo': the objectives that read a spec section."""
    return "objective=" + objectives_said([name for name, o in OBJECTIVES.items() if o.section == section])
