"""A real-size model on a small machine: will the gates' runs fit (fit.py), the structure-preserving twin the
gates run on (twin/) and the plan for a target (plan/), which asks the rungs' helpers what a run would do;
shrink.py holds the rules a twin and a compat tiny config share. The full checkpoint checked on meta
without loading it is onboard/upstream/weights_headers.py."""
