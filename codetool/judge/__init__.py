"""The judge: an LLM labels a final answer Solved / Unsure / Unsolved, or picks the better of two.

- :mod:`codetool.judge.records`: the requests, verdicts and preferences, the :class:`Judge`
  interface and :class:`ScriptedJudge`;
- :mod:`codetool.judge.llm`: :class:`LLMJudge` over any ``codetool.models`` backend;
- :mod:`codetool.judge.cache`: the verdict cache;
- :mod:`codetool.judge.config`: ``JudgeConfig`` (the ``judge.*`` settings);
- :mod:`codetool.judge.reference_prompts`: a reference's prompts and forced functions, read from
  the user's own checkout.

``codetool.assemble.make_judge`` builds the judge a config describes. Evaluation
(:mod:`codetool.eval`) and the trees (leaf success ``judged``) stand on this package; it stands on
``codetool.models`` only.
"""
