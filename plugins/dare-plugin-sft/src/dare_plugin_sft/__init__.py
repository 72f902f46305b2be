"""dare-plugin-sft: masked-diffusion NELBO supervised fine-tuning."""

from dare_core import hookimpl
from dare_core.interfaces import AlgorithmSpec, ComponentSpec

from dare_plugin_sft.objective import RECIPE, NELBOLoss, SFTConfig, build

__version__ = "0.1.0"


@hookimpl
def dare_register_policy_losses(register):
    register(ComponentSpec(
        "nelbo", NELBOLoss, "masked-diffusion NELBO: sum CE/t over masked tokens / #masked",
        reference="arXiv:2502.09992",
    ))


@hookimpl
def dare_register_algorithms(register):
    register(AlgorithmSpec(
        name="sft",
        workflow="sft",
        config_cls=SFTConfig,
        build=build,
        components={"corruption": "random_ratio", "estimator": "masked_token_logprob", "loss": "nelbo"},
        paper="arXiv:2502.09992",
        description="supervised fine-tuning with the masked-diffusion NELBO",
        recipe=RECIPE,
    ))
