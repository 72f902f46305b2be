"""What the plugin registers, importable without torch: the names it registers, the options of
its ``algorithm:`` section and its recipe. The manifest (``__init__``) imports this module and
names the implementation (:mod:`dare_plugin_myalgo.algorithm`, torch) with ``lazy(...)``, so
``dare --help``, ``dare list`` and config errors never import torch."""

from __future__ import annotations

import attrs

from dare_core.api import one_of, option, positive

# Every name this plugin registers, in one place (component names are global across the
# installed plugins: keep the plugin id as their prefix).
ALGORITHM = "myalgo"
CORRUPTION = "myalgo_mask_response"
LOSS = "myalgo_pg"
PAPER = "Williams 1992 (REINFORCE); arXiv:2504.12216 (one-step estimate)"
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@attrs.frozen
class MyalgoConfig:
    """Options of the ``algorithm:`` section when ``--algo myalgo`` is chosen.

    Every field carries help text (shown by ``dare config show``) and a validator that states
    its invariant; the config loader reports every violated one at once.
    """

    norm_adv_by_std: bool = option(
        False,
        "Divide the group-centred rewards by the group std; false = plain group-mean baseline, as REINFORCE.",
    )
    adv_eps: float = option(
        1e-6, "Added to the group std before dividing (only used when norm_adv_by_std is true).", positive
    )
    loss_agg_mode: str = option(
        "token-mean", "How token losses become a scalar: " + ", ".join(AGG_MODES) + ".", one_of(AGG_MODES)
    )


# Defaults for other run-config sections, applied below a checkpoint's dare_defaults.yaml, the
# --config file and key=value overrides. On-policy REINFORCE: one optimizer step per rollout batch.
RECIPE = {
    "trainer": {"group_size": 8, "ppo_epochs": 1, "mini_batch_size": 0},
}
