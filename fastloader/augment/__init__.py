"""One augmentation spec for both backends: the op table (ops.py), the policy parser (policy.py)
and the vectorized draws (draws.py) that turn each sample's seed into every random parameter it
gets. The backends only apply them (torch_loader/augment.py, dali_loader/augment.py)."""
