"""The training loops: one per workflow kind (rl, sft, preference)."""
