"""Evaluation of a policy on held-out tasks (every MISSION.md metric) and the safety suite."""
