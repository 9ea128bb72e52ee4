"""Temporal activities: thin wrappers over the runner, the integrity gate and the fixers."""
