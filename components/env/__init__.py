"""The coding environment: episodes, tool sets, the safety monitor, reward terms."""
