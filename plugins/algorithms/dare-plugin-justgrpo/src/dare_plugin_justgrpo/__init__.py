"""dare-plugin-justgrpo: JustGRPO, left-to-right decoding with exact log-probabilities
(arXiv:2601.15165)."""

from dare_core.api import AlgorithmSpec, ComponentSpec, RolloutNeeds, hookimpl, lazy
from dare_objectives import STEP_REPLAY_RECORDS
from dare_plugin_justgrpo.config import LEFT_TO_RIGHT_FIELDS, RECIPE, JustConfig, left_to_right

__version__ = "0.1.0"


@hookimpl
def dare_register_likelihood_estimators(register):
    register(
        ComponentSpec(
            "tempered_token_logprob",
            lazy("dare_plugin_justgrpo.algorithm:TemperedTokenLogProb"),
            "log softmax(logits / T)[y_j] at every response position of every state row (MASK logit removed)",
            requires=frozenset({"mask_token"}),
            reference="arXiv:2601.15165",
        )
    )


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="justgrpo",
            workflow="rl",
            config_cls=JustConfig,
            build=lazy("dare_plugin_justgrpo.algorithm:build"),
            kinds=frozenset({"masked"}),
            requires=frozenset({"mask_token"}),  # exact left-to-right probabilities of MASK states
            components={
                "trajectory": "step_replay",
                "estimator": "tempered_token_logprob",
                "loss": "replay_clipped_pg",
                "advantage": "group_norm",
            },
            rollout=RolloutNeeds(
                records=STEP_REPLAY_RECORDS, fields=frozenset(LEFT_TO_RIGHT_FIELDS), adjust=left_to_right
            ),
            paper="arXiv:2601.15165",
            description="generate left to right one token per step; token GRPO with exact "
            "autoregressive-order log-probabilities at the sampling temperature",
            recipe=RECIPE,
        )
    )
