"""Seeing inside a model: attention pictures and an HTML explorer, the positional encoding, forward-pass
traces (``explain``) and complexity benchmarks. Submodules import matplotlib only when they draw.

* :mod:`aiayn.viz.style`: the one plotting style (fonts with CJK fallback, colours, saving PNGs);
* :mod:`aiayn.viz.attention` and :mod:`aiayn.viz.explorer`: attention weights as PNG grids / one HTML file;
* :mod:`aiayn.viz.positional`: the sinusoid table and its dot product against distance;
* :mod:`aiayn.viz.explain`: a stage-by-stage trace of one forward pass;
* :mod:`aiayn.viz.complexity`: time and memory against sequence length.
"""
