"""Building blocks of the Transformer: attention, masks, positions, FFN, norms, layers."""
