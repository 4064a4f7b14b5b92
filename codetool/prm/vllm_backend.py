"""PRM scoring with vLLM on a GPU (``--prm vllm:FOLDER``); needs ``pip install 'codetool[vllm]'``.

vLLM runs the full model of the checkpoint (a LoRA checkpoint is first merged once into
``FOLDER/merged``; its LM head then carries the trained label rows). Each prompt gets one
greedy token restricted to the two label tokens, with ``logprobs_mode="processed_logprobs"`` so
the two returned log-probabilities are those of the restricted distribution; the score is
renormalised over the two (softmax over the label logits, DESIGN.md §4). vLLM's automatic prefix
caching computes a shared prefix once, like ``LocalPRMScorer`` does on CPU.

This path needs a GPU and was not run on the CPU-only machines this code was written on; the CPU
path (``codetool.prm.scorer.LocalPRMScorer``) is the reference it must agree with.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from codetool import CodetoolError
from codetool.rewards import PRMItem

logger = logging.getLogger(__name__)


class VLLMScorer:
    """A :class:`codetool.rewards.PRMScorer` backed by ``vllm.LLM``.

    Args:
        path (`str`): a ``codetool train-prm`` checkpoint folder.
        gpu_memory_utilization (`float`, *optional*, defaults to 0.85): passed to vLLM.
        tensor_parallel_size (`int`, *optional*, defaults to 1): GPUs per model.

    Raises:
        CodetoolError: if vLLM is not installed or the folder is not a PRM checkpoint.
    """

    def __init__(self, path: str, *, gpu_memory_utilization: float = 0.85, tensor_parallel_size: int = 1):
        try:
            from vllm import LLM, SamplingParams
        except ImportError:
            raise CodetoolError("the vLLM scorer needs vLLM on a GPU machine: pip install 'codetool[vllm]'; "
                                "or pass the checkpoint folder itself to score with transformers.") from None
        from transformers import AutoTokenizer

        from codetool.prm.format import PRMFormat, PromptEncoder
        from codetool.prm.modeling import export_merged, read_prm_config

        meta = read_prm_config(path)
        model_dir = Path(path)
        if meta.get("adapter"):
            model_dir = Path(path) / "merged"
            if not (model_dir / "config.json").is_file():
                logger.info("merging the LoRA adapter of %s into %s for vLLM", path, model_dir)
                export_merged(path, model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        fmt = PRMFormat.from_saved(meta["format"])
        self.encoder = PromptEncoder(tokenizer, fmt)
        self.llm = LLM(model=str(model_dir), tokenizer=str(model_dir), enable_prefix_caching=True,
                       logprobs_mode="processed_logprobs", max_model_len=fmt.max_length,
                       gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size)
        self.params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=2,
                                     allowed_token_ids=list(self.encoder.label_ids))

    def score(self, items: list[PRMItem]) -> list[float]:
        if not items:
            return []
        pos, neg = self.encoder.label_ids
        prompts = [{"prompt_token_ids": self.encoder.encode(item).input_ids} for item in items]
        scores = []
        for output in self.llm.generate(prompts, self.params, use_tqdm=False):
            logprobs = output.outputs[0].logprobs[0]
            if pos not in logprobs or neg not in logprobs:
                raise CodetoolError(f"vLLM returned log-probabilities for {sorted(logprobs)} instead of the label ids "
                                    f"{(pos, neg)}; this vLLM version may not support logprobs_mode.")
            a, b = logprobs[pos].logprob, logprobs[neg].logprob
            scores.append(1.0 / (1.0 + math.exp(min(b - a, 700.0))))
        return scores
