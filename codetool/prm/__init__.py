"""The generative process reward model (PRM) of CodeTool: prompt, training, scoring, serving.

- :mod:`codetool.prm.format`: ``PRMFormat`` and ``PromptEncoder``, the one prompt renderer
  (shared prefix + per-candidate suffix) used by training and scoring;
- :mod:`codetool.prm.modeling`: label tokens, ``PRMModel`` (LM + two label rows), checkpoints
  (``save_prm``, ``load_prm``, ``export_merged``);
- :mod:`codetool.prm.data`: PRM example rows -> pre-tokenised rows, splits, the collator;
- :mod:`codetool.prm.trainer`: ``codetool train-prm``: ``PRMConfig`` (extends TRL's ``SFTConfig``)
  and ``PRMTrainer`` (an ``SFTTrainer``); :mod:`codetool.prm.train`: the light ``TrainConfig``
  the pipeline embeds;
- :mod:`codetool.prm.packing`: prefix-shared packing (block mask, one forward) for training and
  scoring; :mod:`codetool.prm.stepwise`: TRL's stepwise-supervision layout, exported and read;
- :mod:`codetool.prm.scorer`: ``LocalPRMScorer`` (shared-prefix KV cache), ``load_scorer``,
  ``codetool score``; :mod:`codetool.prm.client`: ``HTTPScorer``;
  :mod:`codetool.prm.vllm_backend`: ``VLLMScorer`` (vLLM in-process, CUDA or CPU build);
- :mod:`codetool.prm.server`: ``codetool serve-prm``;
- :mod:`codetool.prm.evaluate`: ``codetool eval-prm`` (pairwise accuracy, AUC, calibration);
- :mod:`codetool.prm.synthetic`: made-up PRM rows for tests, benchmarks and smoke runs.

Importing this package imports nothing heavy; the search only needs
``codetool.prm.scorer.load_scorer(spec)``.
"""
