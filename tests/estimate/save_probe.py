"""The host-RAM peak of rank 0 while a real FSDP 2 save gathers a random-weight model, on two CPU ranks.

Run by tests/estimate/test_save_peak.py under `torchrun --nproc_per_node 2` (gloo, CPU):

    torchrun --nproc_per_node 2 tests/estimate/save_probe.py MODEL_DIR OUT_DIR

It prepares the model as train_sft.py's trainer does under FSDP 2 on CPU ranks (the launcher's FSDP environment,
backend/recipe/objectives.py's switch to accelerate's FSDP 2 path, decoder layers wrapped), then saves it the way Trainer.save_model does with FULL_STATE_DICT (train_sft.py's final
save): accelerator.get_state_dict, then save_pretrained with that state dict on rank 0. A thread samples the
process's resident memory (psutil) every 2 ms around the save; OUT_DIR/rank<N>.json gets the rise above the
level before it, with the bytes of the model's parameters.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
from pathlib import Path

import psutil
import torch
from accelerate import Accelerator
from transformers import AutoConfig, AutoModelForCausalLM

from tunedeck.backend.recipe.objectives import _switch_cpu_ranks_to_fsdp2

# What `accelerate launch` exports from the FSDP 2 config tunedeck renders (backend/render/accelerate_yaml.py).
FSDP_ENV = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer",
}


class PeakRss:
    """The largest resident set size seen by a sampling thread while the block runs."""

    def __init__(self, interval_s: float = 0.002):
        self.process, self.interval_s, self.peak = psutil.Process(), interval_s, 0
        self._done = threading.Event()

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._done.wait(self.interval_s)

    def __enter__(self):
        self.before = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.after = self.process.memory_info().rss
        self.peak = max(self.peak, self.after)


def main() -> None:
    model_dir, out_dir = sys.argv[1], Path(sys.argv[2])
    os.environ.update(FSDP_ENV)
    accelerator = Accelerator(cpu=True)
    assert _switch_cpu_ranks_to_fsdp2(accelerator), "the CPU ranks did not switch to FSDP 2"  # as train_sft.py does
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # FSDP 2 prepares a model with its optimizer; SGD without momentum holds no state to count
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    gc.collect()
    accelerator.wait_for_everyone()
    with PeakRss() as rss:
        with PeakRss() as gather:
            state_dict = accelerator.get_state_dict(model)
        if accelerator.is_main_process:
            accelerator.unwrap_model(model).save_pretrained(out_dir / "saved", state_dict=state_dict)
        del state_dict
    accelerator.wait_for_everyone()
    report = {
        "rank": accelerator.process_index,
        "distributed_type": str(accelerator.distributed_type),
        "model_class": type(model).__name__,
        "model_bytes": model_bytes,
        "rss_before": rss.before,
        "rss_peak": rss.peak,
        "rss_gather_peak": gather.peak,  # within get_state_dict alone
        "rss_gathered": gather.after,  # when it returned: the state dict held
        "largest_param_bytes": max(p.numel() * p.element_size() for p in accelerator.unwrap_model(model).parameters()),
    }
    (out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(report), encoding="utf-8")
    accelerator.end_training()


if __name__ == "__main__":
    main()
