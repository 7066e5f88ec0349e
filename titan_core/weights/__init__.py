"""Hugging Face safetensors checkpoints read without loading them: headers (st_headers), their names
mapped through an adapter on meta (name_mapping), checked against a model (header_check), and how a
converted tensor is a strided view of a stored one (strided), so a rank reads only its slice."""
