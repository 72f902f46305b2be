"""The core's training loops (the ``rl`` and ``sft`` workflows) and what they share; plugins
register other workflows (``dare_register_workflows``)."""
