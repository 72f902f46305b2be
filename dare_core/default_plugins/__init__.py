"""The core's own default plugins: generic components, rollout backends and tasks."""
