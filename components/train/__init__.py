"""Training stages (SFT, DPO, GRPO) and the pure tensor losses they share."""
