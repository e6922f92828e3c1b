"""Run by torchrun on 2 CPU ranks: the process groups a Ulysses run makes, then train.py's close of them.

Writes held-<rank>.json in the current folder: whether torch and DeepSpeed still hold a group after the close: a group that outlives
it is destroyed in the interpreter's teardown, where its gloo threads can abort a finished run.
"""

import json
import os
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.runtime.sequence_parallel import parallel_state_sp
from deepspeed.utils import groups

from tunedeck.backend.recipe import train_sft

deepspeed.init_distributed(dist_backend="gloo")
parallel_state_sp.initialize_sequence_parallel(2)  # as accelerate's Ulysses setup does (sp_size 2)
total = torch.ones(1)
dist.all_reduce(total, group=parallel_state_sp.get_sequence_parallel_group())
train_sft._close_process_group(clean=True)
held = {
    "torch initialized": dist.is_initialized(),
    "sequence group": parallel_state_sp._SEQUENCE_PARALLEL_GROUP is not None,
    "sequence data group": parallel_state_sp._SEQUENCE_DATA_PARALLEL_GROUP is not None,
    "DeepSpeed world group": groups._WORLD_GROUP is not None,
}
Path(f"held-{os.environ['RANK']}.json").write_text(json.dumps({"sum": total.item(), "held": held}))
