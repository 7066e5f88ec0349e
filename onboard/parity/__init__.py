"""The parity rung's machinery: upstream HF model vs the workspace's native port.

native.py builds the workspace's model (the upstream one is onboard/upstream/hf_model.py),
compare.py and localise.py measure, results.py stores, criteria.py reads the thresholds, check.py
runs it all for one workspace. Kept import-free so the rung can read results without torch.
"""
