"""What the data puts in a micro batch: the tokens a GPU computes (processed) and the tokens it trains on (useful).

A run's tokens/s that users compare (train.py's `tokens_per_second`, TRL's `num_tokens`: the attention mask's sum,
or the flattened length when padding-free) counts useful tokens only. How many a step computes depends on
how rows fill a micro batch, as TRL 1.x's SFTTrainer builds it (trl/trainer/sft_trainer.py):

  no packing     DataCollatorForLanguageModeling pads each micro batch to its longest row
                 (pad_to_multiple_of is None off Neuron): a row computes as long as the longest row of its
                 batch. training.group_by_length (transformers' LengthGroupedSampler: megabatches of 50
                 batches sorted by length) puts rows of near equal length together: counted as no padding.
  packing        strategy "bfd" packs rows whole into sequences of max_seq_length and turns padding-free on
                 (the collator flattens the batch, flash attention's position_ids keep rows apart): no
                 padding; a packed sequence holds `fill` x max_seq_length tokens, each attending over its own
                 row only.

The lengths come from the dataset preview (backend/data/preview.py's length_stats: the rows' mean, and the
padding a micro batch of rows in order gets), when the page has measured them for this job. Otherwise every
row is assumed to be max_seq_length tokens long, which the estimate says: no padding, and packing changes
nothing (the slowest case per step, and the most tokens per row).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataShape:
    """Tokens per trained sequence (a row, or a packed sequence of rows), on average."""

    useful_tokens: float  # trained on (not padding)
    processed_tokens: float  # computed: with padding
    attention_tokens: float  # the length each token attends over (its row's, or its padded row's)
    rows_per_sequence: float  # dataset rows in one trained sequence (several when packed)
    note: str  # where the lengths come from, in words
    assumed: bool = False

    @property
    def useful_share(self) -> float:
        return self.useful_tokens / self.processed_tokens

    def processed_for(self, seq_len: int) -> float:
        """Tokens one sequence computes when the job's rows are `seq_len` long at most."""
        return min(self.processed_tokens, seq_len)


def full_rows(max_seq_length: int) -> DataShape:
    """Every row max_seq_length tokens long: the assumption when the lengths are not measured."""
    return DataShape(
        useful_tokens=max_seq_length,
        processed_tokens=max_seq_length,
        attention_tokens=max_seq_length,
        rows_per_sequence=1.0,
        note=f"assumed: every row {max_seq_length:,} tokens (dataset.max_seq_length), so no padding; preview the data "
        "to measure its lengths",
        assumed=True,
    )


def measured_shape(stats: dict | None, packing: bool, group_by_length: bool) -> DataShape | None:
    """The shape of the preview's measured rows (backend/data/preview.py's length_stats), or None without them (or for
    GRPO's prompts, whose answers the model writes)."""
    if not stats or not stats.get("rows") or stats.get("limit_field") or not stats.get("max_seq_length"):
        return None
    limit = stats["max_seq_length"]
    mean = min(float(stats["mean"]), limit)  # a longer row is cut at max_seq_length
    counted = f"{stats['rows']:,} rows previewed: {mean:,.0f} tokens a row on average"
    if packing:
        fill = 1 - stats.get("padding_waste_packed", 0.0)
        per_sequence = fill * limit
        return DataShape(
            useful_tokens=per_sequence,
            processed_tokens=per_sequence,
            attention_tokens=mean,
            rows_per_sequence=max(1.0, per_sequence / mean),
            note=f"{counted}, packed {per_sequence / mean:.1f} to a sequence",
        )
    if group_by_length:
        padded, how = mean, "batches grouped by length (counted as unpadded)"
    else:
        padded = mean / (1 - stats.get("padding_waste", 0.0))
        how = "a batch pads to its longest row"
    return DataShape(
        useful_tokens=mean,
        processed_tokens=padded,
        attention_tokens=padded,
        rows_per_sequence=1.0,
        note=f"{counted}, {how}",
    )
