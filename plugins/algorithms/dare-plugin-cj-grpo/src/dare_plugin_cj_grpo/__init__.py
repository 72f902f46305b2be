"""dare-plugin-cj-grpo: CJ-GRPO, consistency-trajectory GRPO (arXiv:2509.23924)."""

from dare_core.api import AlgorithmSpec, RolloutNeeds, hookimpl
from dare_objectives import STEP_REPLAY_RECORDS
from dare_plugin_cj_grpo.algorithm import RECIPE, CJConfig, build  # torch-free: options and composition

__version__ = "0.1.0"


@hookimpl
def dare_register_algorithms(register):
    register(
        AlgorithmSpec(
            name="cj_grpo",
            workflow="rl",
            config_cls=CJConfig,
            build=build,
            requires=frozenset({"mask_token"}),  # replays the visited states: MASK where not yet revealed
            components={
                "trajectory": "step_replay",
                "estimator": "response_token_logprob",
                "loss": "replay_clipped_pg",
                "advantage": "group_norm",
            },
            paper="arXiv:2509.23924",
            description="GRPO on every recorded denoising transition (exact trajectory replay; "
            "block models: paper-exact block-parallel local steps)",
            rollout=RolloutNeeds(records=STEP_REPLAY_RECORDS),
            recipe=RECIPE,
        )
    )
