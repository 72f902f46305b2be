"""The HF-layout export from sharded weights: every rank writes the slices it holds, then the
ranks merge them into whole tensors, file by file, so no rank ever holds the whole model.

``torch.distributed.checkpoint`` writes each rank's shards (``HuggingFaceStorageWriter`` with
``save_distributed=True``: safetensors files with each slice's offsets) into ``sharded/``;
``consolidate_safetensors_files_on_every_rank`` then writes the published layout
(``model-0000i-of-0000n.safetensors`` of at most :data:`MAX_FILE_BYTES` each and
``model.safetensors.index.json``; one ``model.safetensors`` for a smaller model), one output file
per rank at a time, one tensor in memory at a time. The names are those ``save_pretrained`` writes (a tied weight under the one name
transformers keeps), the config and generation config as it writes them.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files_on_every_rank
from torch.distributed.checkpoint._hf_utils import _gen_file_name
from torch.distributed.tensor import DTensor
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from dare_core.api import DivergenceError

#: the largest safetensors file of an export (the hub's usual 5 GB shards)
MAX_FILE_BYTES = 5 * 2**30
SHARDED = "sharded"


def exported_names(skeleton: torch.nn.Module) -> list[str]:
    """The state-dict names ``save_pretrained`` writes for this model: every persistent tensor,
    each tied group under the one name transformers keeps.

    Args:
        skeleton: the model before sharding (on the meta device), ties intact.
    """
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    return list(remove_tied_weights_from_state_dict(skeleton.state_dict(), skeleton))


def first_nonfinite(state: dict[str, torch.Tensor]) -> Optional[str]:
    """The first floating-point tensor of ``state`` with a non-finite value in this rank's part."""
    for name, t in state.items():
        local = t.to_local() if isinstance(t, DTensor) else t
        if local.is_floating_point() and not bool(torch.isfinite(local).all()):
            return name
    return None


def file_index(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, int]:
    """Each name's output file (1, 2, ...): in state-dict order, a new file past
    :data:`MAX_FILE_BYTES` (sizes of the whole tensors in the storage dtype)."""
    index, used, out = 1, 0, {}
    for name, t in state.items():
        size = t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())
        if used and used + size > MAX_FILE_BYTES:
            index, used = index + 1, 0
        out[name], used = index, used + size
    return out


def write_sharded(engine: Any, wrapper: Any, names: list[str], directory: str, dtype: torch.dtype) -> None:
    """Write ``wrapper``'s sharded weights into ``directory`` in HF layout (see the module
    docstring). Collective.

    Args:
        engine: the fsdp engine (its rank and collectives).
        wrapper: the prepared policy, its module's parameters sharded DTensors.
        names: :func:`exported_names` of the policy.
        directory: an existing, empty directory every rank sees.
        dtype: the storage dtype of the floating-point weights.

    Raises:
        DivergenceError: a weight is not finite on some rank (nothing written).
    """
    full = wrapper.module.state_dict()
    state = {n: full[n] for n in names}
    bad = next((b for b in engine.gather([first_nonfinite(state)]) if b is not None), None)
    if bad is not None:
        raise DivergenceError(
            f"not writing {os.path.basename(directory).removeprefix('.tmp-')}: weight {bad} is not "
            f"finite (earlier checkpoints are kept); lower trainer.lr or check the data"
        )
    state = {n: t.to(dtype) if t.is_floating_point() else t for n, t in state.items()}
    index = file_index(state, dtype)
    sharded = os.path.join(directory, SHARDED)
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(sharded, fqn_to_index_mapping=index, save_distributed=True))
    consolidate_safetensors_files_on_every_rank(sharded, directory, index)
    engine.barrier()
    if engine.is_main:
        shutil.rmtree(sharded)
        if max(index.values()) == 1:  # one file: named as save_pretrained names it, no index
            os.replace(os.path.join(directory, _gen_file_name(1, 1)), os.path.join(directory, SAFE_WEIGHTS_NAME))
            os.remove(os.path.join(directory, SAFE_WEIGHTS_INDEX_NAME))
        write_metadata(wrapper, directory)


def write_metadata(wrapper: Any, directory: str) -> None:
    """The config (with the ``dtype`` and ``architectures`` ``save_pretrained`` records), the
    generation config and the tokenizer, as ``save_pretrained`` writes them."""
    module = wrapper.module
    module.config.dtype = str(module.dtype).split(".")[1]
    module.config.architectures = [type(module).__name__.removeprefix("FSDP")]
    module.config.save_pretrained(directory)
    if module.can_generate():
        module.generation_config.save_pretrained(directory)
    wrapper.tokenizer.save_pretrained(directory)
