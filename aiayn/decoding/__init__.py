"""Decoding strategies, outside the model classes."""

from aiayn.decoding.greedy import greedy_decode

__all__ = ["greedy_decode"]
