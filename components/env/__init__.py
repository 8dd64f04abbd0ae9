"""The coding environment: sandbox, tools, safety monitor, verifier, policies."""
