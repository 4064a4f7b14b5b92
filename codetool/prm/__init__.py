"""The generative process reward model (PRM) of CodeTool: prompt, training, scoring, serving.

- :mod:`codetool.prm.format`: ``PRMFormat`` and ``PromptEncoder``, the one prompt renderer
  (shared prefix + per-candidate suffix) used by training and scoring;
- :mod:`codetool.prm.modeling`: label tokens, ``PRMModel`` (LM + two label rows);
  :mod:`codetool.prm.folder`: PRM folders (``save_prm``, ``load_prm``, ``export_merged``);
- :mod:`codetool.prm.rows`: PRM example rows as read (``read_rows``: our layout and TRL's
  stepwise one), ``query_key``;
- :mod:`codetool.prm.data`: PRM example rows -> pre-tokenised rows, splits, the collator;
- :mod:`codetool.prm.config`: ``PRMConfig`` (extends TRL's ``SFTConfig``), the settings of
  ``codetool train-prm`` and the pipeline's ``train`` section; :mod:`codetool.prm.trainer`:
  ``PRMTrainer`` (an ``SFTTrainer``), which ``codetool train-prm`` runs;
- :mod:`codetool.prm.packing`: prefix-shared packing (block mask, one forward) for training and
  scoring; :mod:`codetool.prm.stepwise`: our rows exported in TRL's stepwise-supervision layout;
- :mod:`codetool.prm.scorer`: ``LocalPRMScorer`` (shared-prefix KV cache), ``load_scorer``;
  :mod:`codetool.prm.client`: ``HTTPScorer``;
  :mod:`codetool.prm.vllm_backend`: ``VLLMScorer`` (vLLM in-process, CUDA or CPU build);
- :mod:`codetool.prm.server`: ``create_app``, the app ``codetool serve-prm`` serves;
  :mod:`codetool.prm.schema`: its request and response bodies (OpenAPI, ``/docs``);
  :mod:`codetool.prm.parse`: a ``/score`` body checked and turned into items;
- :mod:`codetool.prm.evaluate`: the metrics ``codetool eval-prm`` reports (pairwise accuracy, AUC,
  calibration);
- :mod:`codetool.prm.synthetic`: made-up PRM rows for tests, benchmarks and smoke runs.

The commands (``train-prm``, ``eval-prm``, ``score``, ``serve-prm``) are in :mod:`codetool.commands`.

Importing this package imports nothing heavy; the search only needs
``codetool.prm.scorer.load_scorer(spec)``.
"""
