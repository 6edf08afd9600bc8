"""One augmentation spec for both backends: the op table (ops.py) and the policy parser (policy.py),
a leaf that the config's checks and the draws (fastloader/draws.py: each sample's seed into every
random parameter it gets) build on. The backends only apply them (torch_loader/augment.py,
dali_loader/augment.py)."""
