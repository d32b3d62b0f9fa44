"""verl's SFT trainer on the CPU platform: ``torchrun -m seal.warm_start.cpu_sft <verl SFT overrides>``.

verl's own ``verl.trainer.sft_trainer`` entry opens a ``cpu:gloo,<device>:<backend>`` process group,
which on the CPU platform reads ``cpu:gloo,cpu:gloo`` and torch refuses. This entry composes the
same config (verl's ``sft_trainer_engine``), opens a gloo group, registers verl's FSDP engine for
the ``cpu`` device (:mod:`seal.trainer.verl.cpu`) and runs verl's ``SFTTrainer`` unchanged.
:func:`seal.warm_start.verl_sft.sft_command` picks it when the warm start runs on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import hydra
import verl.trainer.sft_trainer as verl_sft

CPU_OVERRIDES = (
    "trainer.device=cpu",
    # FSDP1 cannot hold CPU parameters; a CPU without bf16 instructions emulates bf16 slowly.
    "engine.strategy=fsdp2",
    "engine.use_torch_compile=false",
    "+engine.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
)


@hydra.main(config_path=str(Path(verl_sft.__file__).parent / "config"), config_name="sft_trainer_engine",
            version_base=None)
def main(config) -> None:
    from verl.utils.distributed import destroy_global_process_group

    from seal.trainer.verl.cpu import open_gloo_group, register_cpu_engine, use_cpu_platform_here

    use_cpu_platform_here()
    open_gloo_group()
    register_cpu_engine()
    trainer = verl_sft.SFTTrainer(config=config)
    trainer.fit()
    destroy_global_process_group()


if __name__ == "__main__":
    main()
