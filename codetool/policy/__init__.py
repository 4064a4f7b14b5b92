"""Policy RL with the PRM: GRPO over code-tool episodes (``codetool train-policy``, issue 31).

The policy writes one code step at a time; each rollout is a whole episode run in our executor
and tool environment, its prompts rendered as the search renders them
(:mod:`codetool.policy.rollout`). Each step earns named rewards (:mod:`codetool.policy.rewards`):
the on-the-spot reward, the PRM's latent reward (one scorer call per episode, its steps sharing
their prefix), and the episode's outcome (``grounded`` success, ``judged`` with a judge), with an
optional LIT tool cost. They become the learning signal either through TRL's sequence-level
GRPO advantage (``aggregate: min | mean | last | sum`` of each step reward) or through process
supervision (DeepSeekMath's process-supervised GRPO: each step's reward normalised within its
group, a token's advantage the sum of its own and later steps' normalised rewards;
:mod:`codetool.policy.advantages`), computed by a small ``GRPOTrainer`` subclass
(:mod:`codetool.policy.trainer`). Evaluation before and after training runs the stepwise search
itself on held-out queries (:mod:`codetool.policy.evaluate`).

Layering: this package sits above the stages it trains with (models, tools, executor, search,
prm, eval, assemble) and below the commands (``codetool.commands.train_policy``).
"""
