"""The upstream side: transformers' own model for a config.json (hf_model), a fresh init's
statistics against it (init_check) and an HF checkpoint's headers checked on meta
(weights_headers). Knows no workspace, ladder or rung: every comparison with upstream starts here."""
