"""A real-size model on a small machine: will the gates' runs fit (fit), the structure-preserving twin the
gates run on (twin; its heads twin_heads, its layers twin_layers; twin_setup), the full checkpoint checked on
meta without loading it (weights_headers, over titan_core/weights), and the plan for the target (plan, workspace_plan)."""
