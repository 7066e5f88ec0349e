"""Gate evaluation: every comparator, threshold references, missing metrics, waivers, checklist validation."""

import math

import pytest
import yaml

from onboard.ladder.gates import COMPARATORS, ChecklistError, evaluate, gate_passed, load_checklist, parse_checklist


def checklist(*criteria, human=()):
    return parse_checklist({"rung": "r", "title": "t", "criteria": list(criteria), "human": list(human)}, "test")


def crit(name="c", metric="m", comparator="<=", threshold=1.0, hint="why it fails"):
    return {"name": name, "metric": metric, "comparator": comparator, "threshold": threshold, "hint": hint}


@pytest.mark.parametrize(
    "comparator, value, threshold, ok",
    [
        ("<=", 1.0, 1.0, True),
        ("<=", 1.0000001, 1.0, False),
        ("<", 0.5, 1.0, True),
        ("<", 1.0, 1.0, False),
        (">=", 512, 512, True),
        (">=", 511, 512, False),
        (">", 2, 1, True),
        (">", 1, 1, False),
        ("==", 0.0, 0, True),
        ("==", 1e-12, 0.0, False),
    ],
)
def test_each_comparator(comparator, value, threshold, ok):
    [r] = evaluate(checklist(crit(comparator=comparator, threshold=threshold)), {"m": value})
    assert r["ok"] is ok and r["raw_ok"] is ok and r["waived"] is False
    assert r["value"] == value and r["threshold"] == threshold


def test_is_true_accepts_only_a_real_true():
    cl = checklist(crit(comparator="is_true", threshold=None))
    assert evaluate(cl, {"m": True})[0]["ok"]
    assert not evaluate(cl, {"m": False})[0]["ok"]
    r = evaluate(cl, {"m": 1})[0]  # truthy is not true: a rung must say true
    assert not r["ok"] and "true/false" in r["hint"]


def test_missing_metric_fails_with_a_hint_naming_it():
    [r] = evaluate(checklist(crit(metric="logits_rel_l2")), {"other": 0.0})
    assert r["ok"] is False and r["value"] is None
    assert r["hint"] == "rung did not measure logits_rel_l2"
    [r] = evaluate(checklist(crit(metric="x")), {"x": None})
    assert r["ok"] is False


def test_nan_and_inf_never_pass():
    cl = checklist(crit(comparator="<=", threshold=1.0), crit(name="d", metric="n", comparator=">=", threshold=0))
    results = evaluate(cl, {"m": float("nan"), "n": "nan"})
    assert [r["ok"] for r in results] == [False, False]
    assert not evaluate(checklist(crit(comparator="<", threshold=1e9)), {"m": math.inf})[0]["ok"]


def test_repr_strings_compare_as_numbers_and_other_strings_fail():
    assert evaluate(checklist(crit()), {"m": "0.5"})[0]["ok"]
    r = evaluate(checklist(crit()), {"m": "fast"})[0]
    assert not r["ok"] and "not a number" in r["hint"]


def test_threshold_references_measurements_and_evidence():
    cl = checklist(
        crit(name="falls", metric="last", comparator="<", threshold="measurements.first"),
        crit(name="bare", metric="last", comparator="<", threshold="first"),
        crit(name="vs_eager", metric="loss", comparator="<=", threshold="evidence.eager.step1_loss"),
    )
    results = evaluate(cl, {"last": 3.0, "first": 7.0, "loss": 7.5}, {"eager": {"step1_loss": 7.6}})
    assert [r["ok"] for r in results] == [True, True, True]
    assert results[0]["threshold"] == 7.0 and results[0]["threshold_ref"] == "measurements.first"
    assert results[2]["threshold"] == 7.6
    # the referenced value is what the comparison uses: move it and the verdict moves
    results = evaluate(cl, {"last": 3.0, "first": 2.0, "loss": 7.5}, {"eager": {"step1_loss": 7.0}})
    assert [r["ok"] for r in results] == [False, False, False]


def test_unavailable_threshold_reference_fails():
    cl = checklist(crit(metric="loss", threshold="evidence.eager.step1_loss"))
    r = evaluate(cl, {"loss": 1.0}, {})[0]
    assert not r["ok"] and "no passed evidence" in r["hint"]
    r = evaluate(cl, {"loss": 1.0}, {"eager": {}})[0]
    assert not r["ok"] and "did not record" in r["hint"]
    r = evaluate(checklist(crit(threshold="measurements.absent")), {"m": 0.0})[0]
    assert not r["ok"] and "absent" in r["hint"]


def test_waiver_turns_a_failure_into_ok_but_waived():
    cl = checklist(crit(name="a"), crit(name="b"))
    plain = evaluate(cl, {"m": 2.0})
    assert not gate_passed(plain)
    waived = evaluate(cl, {"m": 2.0}, waivers={"a": {"why": "known upstream bug"}})
    assert waived[0] == {**plain[0], "ok": True, "waived": True, "why": "known upstream bug"}
    assert waived[0]["raw_ok"] is False  # the measurement alone still failed, on the record
    assert not gate_passed(waived)  # b is not waived
    both = evaluate(cl, {"m": 2.0}, waivers={"a": {"why": "x"}, "b": {"why": "y"}})
    assert gate_passed(both)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"rung": "r", "criteria": [crit(comparator="~=")]}, "comparator"),
        ({"rung": "r", "criteria": [crit(), crit()]}, "duplicate"),
        ({"rung": "r", "criteria": [{"name": "x", "metric": "m", "comparator": "<="}]}, "missing hint"),
        ({"rung": "r", "criteria": [crit(threshold=None)]}, "needs a threshold"),
        ({"rung": "r", "criteria": []}, "no criteria"),
        ({"criteria": [crit()]}, "missing 'rung'"),
        (["not", "a", "mapping"], "mapping"),
    ],
)
def test_malformed_checklists_are_rejected(bad, message):
    with pytest.raises(ChecklistError, match=message):
        parse_checklist(bad, "test.yaml")


def test_shipped_eager_checklist_matches_design():
    cl = load_checklist("eager")
    by_name = {c.name: c for c in cl.criteria}
    assert by_name["all_finite"].comparator == "is_true"
    assert (by_name["loss_falls"].metric, by_name["loss_falls"].comparator) == ("last_loss", "<")
    assert by_name["loss_falls"].threshold == "measurements.step1_loss"
    assert by_name["step1_loss_near_expected"].threshold == 0.25  # DESIGN section 5: within 25% of ln(vocab)
    assert cl.human


def test_load_checklist_checks_the_rung_name(tmp_path):
    p = tmp_path / "eager.yaml"
    p.write_text(yaml.safe_dump({"rung": "parity", "criteria": [crit()]}))
    with pytest.raises(ChecklistError, match="expected 'eager'"):
        load_checklist("eager", p)
    with pytest.raises(ChecklistError, match="no checklist"):
        load_checklist("tuning", tmp_path / "absent.yaml")


def test_comparator_set_is_the_contract():
    assert set(COMPARATORS) == {"<=", "<", ">=", ">", "==", "is_true"}
