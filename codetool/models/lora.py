"""The LoRA settings that both trainers compose (``train-prm``'s :class:`~codetool.prm.config.PRMConfig`
and ``train-policy``'s :class:`~codetool.policy.config.TrainPolicyConfig`) and the PEFT config they
make (:meth:`LoRAGroup.lora_config`). LoRA: Hu et al., 2021; PEFT's ``LoraConfig``."""

from __future__ import annotations

from dataclasses import dataclass

from codetool.config import option
from codetool.config_groups import Group


@dataclass
class LoRAGroup(Group):
    """Fine-tuning mode and LoRA adapter settings (keys flat: ``finetune``, ``lora_r``, ...).
    ``train-policy`` composes it with a larger rank (:func:`codetool.config_groups.with_defaults`)."""

    finetune: str = option("lora", "LoRA adapter or full fine-tuning", choices=("lora", "full"))
    lora_r: int = option(8, "LoRA rank")
    lora_alpha: int = option(16, "LoRA alpha")
    lora_dropout: float = option(0.0, "LoRA dropout")
    lora_target_modules: list[str] = option(default_factory=lambda: ["all-linear"],
                                            help="modules that get LoRA ('all-linear' or names)")

    def lora_config(self, *, targets: list[str] | None = None, layers: list[int] | None = None):
        """PEFT's ``LoraConfig`` for a causal LM, or ``None`` when ``finetune`` is ``full``.

        Args:
            targets (`list[str]`, *optional*): module names instead of ``lora_target_modules``
                (PEFT takes a layer list only with named modules).
            layers (`list[int]`, *optional*): decoder layer indices that get adapters (all: ``None``).
        """
        if self.finetune != "lora":
            return None
        from peft import LoraConfig

        targets = list(self.lora_target_modules) if targets is None else targets
        return LoraConfig(r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                          task_type="CAUSAL_LM", target_modules=targets[0] if targets == ["all-linear"] else targets,
                          layers_to_transform=layers)
