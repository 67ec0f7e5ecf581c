"""The on-disk checkpoint format, one concept in one package (training uses it; inference loads it).

- ``directory``: file names, the atomic write with its ``COMPLETE`` marker (sizes and sha256), verification, finding a run's checkpoints
- ``weights``: safetensors reading and writing, tied weights kept tied, strict loading, pickle refused
- ``state``: what a training checkpoint holds (model, optimizer, trainer, RNG and per-rank state) and loading it back
- ``tensor_tree``, ``rng_state``: nested state as tensors + JSON; generator states
- ``retention``, ``averaging``: which checkpoints to keep; the paper's checkpoint averaging
- ``atomic_io``: write-then-rename of files and directories
"""
