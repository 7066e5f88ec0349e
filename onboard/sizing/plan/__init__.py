"""`onboard plan`: the full model planned for a target. planner.py (the plan: target, layouts, the choice),
search.py (the layouts tried and why the chosen degrees won), layout_memory.py and step_time.py (what a layout
costs), hardware.py (the target devices), published.py (the runs the time model is fitted on), levers.py
(the recipe's levers re-decided for the target), accept.py (titan_core's verdict on each candidate's recipe),
workspace.py (a workspace's plan and the recipe file), check.py (`--check`: the planned layout run here)."""
