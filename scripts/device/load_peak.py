"""One rank's memory while a run's model is loaded and prepared by its engine (the set-up of
``dare train``: load on ``Engine.load_device``, precision cast, sharding), for the prepared GPU
check (scripts/device/engines.sh, stages ``load_*``). Started by torchrun for distributed
engines; prints one JSON line: the device's peak allocated bytes (CUDA) and the private host
memory gained (Linux ``RssAnon``), against the model's parameter bytes.

    torchrun --nproc_per_node=1 scripts/device/load_peak.py --algo sft --model llada \
        model.path=CKPT model.device=cuda engine.name=fsdp
"""

from __future__ import annotations

import argparse
import json

import torch

from dare_core.api import get_dare, resolve, setup
from dare_core.testing.memory import PeakSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", default="sft", help="Algorithm of the run config.")
    parser.add_argument("--model", default="llada", help="Model family.")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Run config fields.")
    args = parser.parse_args()
    dare = get_dare()
    config = resolve(dare, algo=args.algo, model=args.model, overrides=args.overrides)
    dare.registries.models.get(args.model).load(config.model.path, device="meta")  # imports first
    cuda = torch.cuda.is_available() and config.model.device != "cpu"
    with PeakSampler("RssAnon") as host:
        ctx = setup(dare, config)
    params = sum(p.numel() for p in ctx.wrapper.module.parameters())  # DTensors: the whole model
    print(
        json.dumps(
            {
                "engine": ctx.engine.name,
                "rank": ctx.engine.rank,
                "parameters": params,
                "held_bytes": ctx.engine.memory()["parameters"],
                "device_peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                "host_private_peak_bytes": host.gain,
            }
        )
    )
    ctx.engine.close()


if __name__ == "__main__":
    main()
