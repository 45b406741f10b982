"""The fine-tune on a device: the recipe, the closed loop and the cap control, checkpoints, and what
runs learn (records, belief, trust, exploration)."""
