"""Model-wrapper machinery: :mod:`~dare_core.models.base` (Hugging Face wrappers), :mod:`~dare_core.models.lora`."""
