"""A twin: the smaller config of the same structure that the gates run when the full model does not fit.
derive.py (the twin and its rows), heads.py and kept_layers.py (which heads and layers it keeps), flux_twin.py
(FLUX's twin), setup.py (`new-model`'s twin put into the planned workspace)."""
