"""A real-size model on a small machine: will the gates' runs fit (fit), the structure-preserving twin the
gates run on (twin; its heads twin_heads, its layers twin_layers; twin_setup) and the plan for the target
(plan, plan_levers, plan_check, workspace_plan), which asks the rungs' helpers what a run would do. The
full checkpoint checked on meta without loading it is onboard/upstream/weights_headers.py."""
