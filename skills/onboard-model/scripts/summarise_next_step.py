#!/usr/bin/env python3
"""Condense `onboard next-step NAME --json` into what to read and fix next.

Usage: onboard next-step NAME --json | python summarise_next_step.py
       python summarise_next_step.py step.json

Prints the error first (the rung, or the port under test, raised), then the rung and
status, each failed criterion (value, threshold, hint), and for a parity failure the first
divergent module and the section of references/parity.md that covers it. Standard library
only, so it runs in any Python the agent has.
"""

from __future__ import annotations

import json
import sys

# first_divergence_module pattern -> section heading in references/parity.md (checked by tests)
PARITY_SECTIONS = (
    ("tok_embeddings", "Embedding"),
    ("attention_norm", "Norms"),
    ("ffn_norm", "Norms"),
    ("attention.wq", "Projections and the adapter"),
    ("attention.wk", "Projections and the adapter"),
    ("attention.wv", "Projections and the adapter"),
    ("attention.wo", "Projections and the adapter"),
    ("attention.q_norm", "Inside attention"),
    ("attention.k_norm", "Inside attention"),
    ("attention", "Inside attention"),
    ("feed_forward", "MLP"),
    ("moe", "MoE"),
    ("output", "Output head"),
    ("norm", "Norms"),
)
# criteria whose failure points to a section even when no module diverged
CRITERION_SECTIONS = {
    "state_dict_same_keys": "State-dict round trip",
    "state_dict_round_trip": "State-dict round trip",
    "loss_abs_diff": "Loss and gradients",
    "grad_max_rel_l2": "Loss and gradients",
    "aux_loss": "MoE",
    "init_matches_upstream": "Init",
    "pytest_passed": "Running the test by hand",
}
EAGER_SECTIONS = {
    "all_finite": "all_finite fails",
    "loss_falls": "loss_falls fails",
    "step1_loss_near_expected": "step1_loss_near_expected fails",
}


def parity_section(module: str) -> str:
    """The references/parity.md section for a first divergent module such as layers.0.attention."""
    parts = module.split(".", 2)
    if parts[0] == "layers" and len(parts) == 2:
        return "Block structure"  # the whole block differs while its compared parts agree
    leaf = parts[2] if parts[0] == "layers" else module
    for pattern, section in PARITY_SECTIONS:
        if leaf == pattern or leaf.startswith(pattern + "."):
            return section
    return "Reading a parity failure"


def later_layer(module: str) -> bool:
    """True for a first divergence in layer 1 or later: layer 0 agreed, so look for per-layer options."""
    parts = module.split(".")
    return parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) > 0


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else json.dumps(value)


def summarise(step: dict) -> list[str]:
    if "error" in step and "rung" not in step:
        return [f"bad input (exit 2): {step['error']}", "fix the input named above; nothing was recorded"]
    lines = []
    # the error comes first: when the rung (or the port under test) raised, it is the cause
    # and the failed criteria below are only its consequence (they were never measured)
    if step.get("error"):
        lines.append(f"error: {step['error']}")
    lines.append(f"rung {step.get('rung')}, attempt {step.get('attempt')}: {step.get('status')}")
    if step.get("message"):
        lines.append(step["message"])
    rung = step.get("rung")
    failed = [c for c in step.get("criteria", []) if not c.get("ok")]
    sections: list[str] = []
    for c in failed:
        bound = "true" if c.get("comparator") == "is_true" else f"{c.get('comparator')} {_fmt(c.get('threshold'))}"
        lines.append(f"FAILED {c['name']}: {c.get('metric')} = {_fmt(c.get('value'))}, needs {bound}")
        lines.append(f"  hint: {c.get('hint')}")
        if rung == "eager" and c["name"] in EAGER_SECTIONS:
            sections.append(f"references/eager.md: {EAGER_SECTIONS[c['name']]}")
    m = step.get("measurements", {})
    if rung == "parity" and not m.get("first_divergence_module"):
        # no module diverged: the failed criteria themselves say where to look
        named = [CRITERION_SECTIONS[c["name"]] for c in failed if c["name"] in CRITERION_SECTIONS]
        sections += [f"references/parity.md: {section}" for section in named]
    if rung == "parity" and failed and m.get("first_divergence_module"):
        module = m["first_divergence_module"]
        lines.append(
            f"first divergence: {module} (upstream {m.get('first_divergence_upstream')}), "
            f"rel L2 {_fmt(m.get('first_divergence_rel_l2'))}"
        )
        sections.insert(0, f"references/parity.md: {parity_section(module)}")
        if later_layer(module):
            sections.insert(1, "references/parity.md: Only some layers")
    if rung == "parity" and failed and m.get("grad_worst_param"):
        lines.append(f"worst gradient: {m['grad_worst_param']} rel L2 {_fmt(m.get('grad_max_rel_l2'))}")
    if step.get("attempt_dir"):
        lines.append(f"attempt folder: {step['attempt_dir']} (results.json, logs)")
    for section in dict.fromkeys(sections):
        lines.append(f"read: {section}")
    if step.get("waived"):
        lines.append(f"WAIVED (on the record): {', '.join(step['waived'])}")
    return lines


def main(argv: list[str]) -> int:
    text = open(argv[1]).read() if len(argv) > 1 else sys.stdin.read()
    try:
        step = json.loads(text)
    except json.JSONDecodeError as e:
        print(f"not JSON from `onboard next-step --json`: {e}", file=sys.stderr)
        return 2
    print("\n".join(summarise(step)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
