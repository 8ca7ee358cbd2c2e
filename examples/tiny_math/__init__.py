"""tiny_math: the CPU quickstart's synthetic task, data preparation and SFT warm start."""
