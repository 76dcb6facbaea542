"""The per-trial side of hpsearch: seed, device, data, model and the canonical training loop.

Only `adapter` imports Ray; everything else runs on its own (see `python -m trainable`).
"""
