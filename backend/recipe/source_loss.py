"""The loss of each dataset.mix source ("channel loss", as ms-swift calls it): which data the model learns, which not.

A mixed run's rows carry the index of their source in a column (SOURCE_COLUMN). The trainer keeps the column past
its unused-column filter, the collator puts it in the batch as a tensor, and compute_loss takes it out again before
the model sees it (a model's forward refuses unknown keyword arguments). A forward hook on the model reads TRL's
fused output (the log-probability of each label token and the label mask, TRL 1.16's fused LM head: no logits are
built) and adds each row's token losses and token count to its source. At a logging step every rank all-reduces the
sums (a collective: every rank takes part) and rank 0 writes the token-weighted mean of each source:
"loss_by_source" in a training log record, "eval_loss_by_source" in an evaluation one.

Only SFT without packing: a packed sequence holds rows of several sources, and the preference and GRPO trainers
have their own losses and collators.
"""

from __future__ import annotations

SOURCE_COLUMN = "tunedeck_source"  # the row's source, as an index into the run's source names


def tracks_sources(job: dict, rows: dict) -> bool:
    """Whether a run of this job records each source's loss: mixed SFT rows that are not packed, from more than one
    source (`rows`: the training rows each source gave, recipe/data.py's mixed_in)."""
    dataset = job.get("dataset") or {}
    return (
        len(rows) > 1
        and bool(dataset.get("mix"))
        and (job.get("objective") or "sft") == "sft"
        and not dataset.get("packing", True)
    )


def with_source_column(dataset, source: int):
    return dataset.add_column(SOURCE_COLUMN, [source] * len(dataset))


def with_source_loss(base):
    """The trainer class, keeping the source column for the collator and out of the model's inputs."""

    class SourceLossTrainer(base):
        source_losses: SourceLosses | None = None

        def _set_signature_columns_if_needed(self):
            super()._set_signature_columns_if_needed()
            if self.source_losses and SOURCE_COLUMN not in self._signature_columns:
                self._signature_columns = [*self._signature_columns, SOURCE_COLUMN]

        def compute_loss(self, model, inputs, *args, **kwargs):
            sources = inputs.pop(SOURCE_COLUMN, None)
            if self.source_losses is not None:
                self.source_losses.pending = sources
            return super().compute_loss(model, inputs, *args, **kwargs)

    return SourceLossTrainer


class SourceCollator:
    """The trainer's collator, with each row's source beside the batch it builds."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, examples: list[dict]):
        import torch

        sources = [example.get(SOURCE_COLUMN, -1) for example in examples]
        batch = self.collate([{k: v for k, v in example.items() if k != SOURCE_COLUMN} for example in examples])
        batch[SOURCE_COLUMN] = torch.tensor(sources, dtype=torch.long)
        return batch


class SourceLosses:
    """Token loss sums and token counts per source, of the training rows and the held-out ones, since the last log."""

    def __init__(self, trainer, names: list[str]):
        import torch

        self.names = names
        self.pending = None  # the sources of the batch compute_loss is about to run
        self.sums = {mode: torch.zeros(2, len(names), dtype=torch.float64) for mode in ("train", "eval")}
        trainer.source_losses = self
        trainer.data_collator = SourceCollator(trainer.data_collator)
        trainer.model.register_forward_hook(self._after_forward)

    def _after_forward(self, module, args, output):
        sources, self.pending = self.pending, None
        log_probs = getattr(output, "log_probs", None)
        mask = getattr(output, "label_mask", None)
        if sources is None or log_probs is None or mask is None or log_probs.dim() != 2:
            return  # not a batch of tracked rows, or an output without per-token scores (padding-free is one row)
        import torch

        with torch.no_grad():
            mask = mask.to(torch.float64)
            row_loss = -(log_probs.detach().to(torch.float64) * mask).sum(dim=1).cpu()
            row_tokens = mask.sum(dim=1).cpu()
        sources = sources.cpu()
        known = sources >= 0
        sums = self.sums["train" if module.training else "eval"]
        sums[0].index_add_(0, sources[known], row_loss[known])
        sums[1].index_add_(0, sources[known], row_tokens[known])

    def gathered(self, mode: str, device) -> dict[str, float]:
        """{source: its mean token loss} over every rank since the last call (a collective: every rank calls it)."""
        import torch
        import torch.distributed as dist

        sums = self.sums[mode]
        self.sums[mode] = torch.zeros_like(sums)
        if dist.is_available() and dist.is_initialized():
            total = sums.to(device=device, dtype=torch.float32 if str(device).startswith("mps") else torch.float64)
            dist.all_reduce(total)
            sums = total.cpu().to(torch.float64)
        return {name: float(sums[0, i] / sums[1, i]) for i, name in enumerate(self.names) if sums[1, i] > 0}
