import math

import pytest
import torch

from transformer_lib.grading import ExerciseGradeError, grade_against


def reference(x):
    return x.softmax(-1)


CASES = [{"x": torch.randn(2, 3)}, {"x": torch.randn(1, 5)}]


def test_a_correct_answer_passes(capsys):
    grade_against(lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), reference, CASES, name="softmax")
    assert "Well done: softmax matches the reference on all 2 test inputs" in capsys.readouterr().out


def test_wrong_shape_is_reported():
    with pytest.raises(ExerciseGradeError, match=r"case 1 of 2.*expected shape \(2, 3\), got \(3, 2\)"):
        grade_against(lambda x: x.softmax(-1).T, reference, CASES, name="softmax")


def test_wrong_values_get_the_diagnosis_of_the_matching_mistake():
    hints = {"the softmax runs over the wrong axis": lambda x: x.softmax(0)}
    with pytest.raises(ExerciseGradeError, match=r"values differ.*\nLikely cause: the softmax runs over the wrong axis"):
        grade_against(lambda x: x.softmax(0), reference, CASES, name="softmax", hints=hints)


def test_an_untouched_stub_prints_one_line_and_crashes_are_explained(capsys):
    def stub(x):
        raise NotImplementedError("write it")

    grade_against(stub, reference, CASES, name="my_softmax", check="grade_softmax")  # no error: Run all goes on
    assert capsys.readouterr().out == ("Exercise not attempted yet: write my_softmax above, then run this cell again "
                                       "(grade_softmax checks it).\n")
    with pytest.raises(ExerciseGradeError, match="values differ"):  # a wrong answer still raises
        grade_against(lambda x: x.softmax(0), reference, CASES, name="softmax")


def test_strict_grading_counts_an_untouched_stub_as_failed(monkeypatch):  # what an autograder needs
    def stub(x):
        raise NotImplementedError("write it")

    monkeypatch.setenv("TRANSFORMER_LIB_STRICT_GRADING", "1")
    with pytest.raises(ExerciseGradeError, match=r"^Exercise not attempted yet: write my_softmax above"):
        grade_against(stub, reference, CASES, name="my_softmax")
    with pytest.raises(ExerciseGradeError, match="your function raised ZeroDivisionError"):
        grade_against(lambda x: 1 / 0, reference, CASES, name="softmax")


def test_boolean_masks_name_the_first_wrong_entry():
    with pytest.raises(ExerciseGradeError, match=r"at index \(0, 1\): expected False, got True"):
        grade_against(lambda n: torch.ones(n, n, dtype=torch.bool), lambda n: torch.ones(n, n, dtype=torch.bool).tril(),
                      [{"n": 3}], name="mask")


def test_notes_name_the_case_and_must_match_the_cases():
    with pytest.raises(ExerciseGradeError, match=r"case 2 of 2 \(a single row; x: shape \(1, 5\)\)"):
        grade_against(lambda x: x.softmax(-1) if x.size(0) == 2 else x, reference, CASES, name="softmax",
                      notes=["", "a single row"])
    with pytest.raises(ValueError, match="notes must hold one entry per case: got 1 notes for 2 cases"):
        grade_against(reference, reference, CASES, name="softmax", notes=["only one"])


def test_mask_differences_are_said_in_words():
    causal = lambda n: torch.ones(n, n, dtype=torch.bool).tril()[None, None]  # noqa: E731
    with pytest.raises(ExerciseGradeError, match=r"\nIn words: your mask lets position 0 see position 1 "
                                                 r"\(a later position\); your mask lets position 1 see position 2"):
        grade_against(lambda n: torch.ones(n, n, dtype=torch.bool).tril(1)[None, None], causal, [{"n": 3}],
                      name="mask", masks=True)
    with pytest.raises(ExerciseGradeError, match=r"your mask stops position 2 from seeing position 1 "
                                                 r"\(an earlier position\)"):
        grade_against(lambda n: torch.eye(n, dtype=torch.bool)[None, None] | causal(n).triu(1).mT.triu(), causal,
                      [{"n": 3}], name="mask", masks=True)
    with pytest.raises(ExerciseGradeError, match=r"exact opposite of the reference: here True means 'may attend'"):
        grade_against(lambda n: ~causal(n), causal, [{"n": 3}], name="mask", masks=True)
    padding = torch.tensor([[5, 6, 0], [7, 0, 0]])
    with pytest.raises(ExerciseGradeError, match=r"In words: in batch row 0: your mask lets every query see key "
                                                 r"position 2; in batch row 1: your mask lets every query see key "
                                                 r"position 1"):
        grade_against(lambda ids: torch.ones_like(ids, dtype=torch.bool)[:, None, None, :],
                      lambda ids: (ids != 0)[:, None, None, :], [{"ids": padding}], name="mask", masks=True)


def test_tuples_name_their_items_and_report_what_explains_the_first_difference():
    def attention(q, k, dim=-1):
        weights = (q @ k.mT).softmax(dim)
        return weights @ k, weights

    case = [{"q": torch.randn(2, 4, 3), "k": torch.randn(2, 4, 3)}]
    with pytest.raises(ExerciseGradeError, match=r"item 0 \(output\): .*values differ.*\nIn item 1 \(weights\): "
                                                 r"each row of the reference sums to 1 over the last dimension "
                                                 r"\(dim=-1\); yours sum to 1 over dim=-2 instead"):
        grade_against(lambda q, k: attention(q, k, dim=-2), attention, case, name="attention",
                      item_names=("output", "weights"))


def test_constant_factors_and_shifts_are_named():
    x = [{"x": torch.rand(3, 4) + 0.5}]
    with pytest.raises(ExerciseGradeError, match=r"Every value you return is the expected one times 2\.828 "
                                                 r"\(= sqrt\(8\)\)"):
        grade_against(lambda x: x * 8**0.5, lambda x: x, x, name="scale")
    with pytest.raises(ExerciseGradeError, match=r"Every value you return is the expected one times 1\.443 "
                                                 r"\(= 1/ln 2\)"):
        grade_against(lambda x: x / math.log(2), lambda x: x, x, name="bits")
    with pytest.raises(ExerciseGradeError, match=r"Every value you return is the expected one plus -0\.01"):
        grade_against(lambda x: x - 0.01, lambda x: x, x, name="shift")


def test_shapes_dtypes_and_non_tensors_get_advice():
    one = [{"x": torch.randn(4)}]
    with pytest.raises(ExerciseGradeError, match=r"expected shape \(4,\), got \(1, 4\)\nThe sizes other than 1 are "
                                                 r"right, but you have 1 extra dimension of size 1"):
        grade_against(lambda x: x[None], lambda x: x, one, name="f")
    with pytest.raises(ExerciseGradeError, match=r"got NoneType None\nYour function returned None: is the `return`"):
        grade_against(lambda x: None, lambda x: x, one, name="f")
    with pytest.raises(ExerciseGradeError, match=r"got float .*\nReturn a tensor, not a Python number"):
        grade_against(lambda x: x.sum().item(), lambda x: x.sum(), one, name="f")
    with pytest.raises(ExerciseGradeError, match=r"expected dtype torch\.bool, got torch\.float32\nA mask holds"):
        grade_against(lambda x: (x > 0).float(), lambda x: x > 0, one, name="f")
    with pytest.raises(ExerciseGradeError, match=r"You return a single number, but the reference returns a tensor "
                                                 r"of shape \(4,\)"):
        grade_against(lambda x: x.sum(), lambda x: x, one, name="f")


def test_a_hint_must_explain_every_case_not_just_the_failing_one():
    cases = [{"x": torch.rand(3) + 1, "p": 1.0}, {"x": torch.rand(3) + 1, "p": 0.5}]
    learner = lambda x, p: x**p * 2  # noqa: E731  (wrong on both cases, by a factor of 2)
    coincides_on_case_1 = {"the exponent p is ignored": lambda x, p: x * 2}
    with pytest.raises(ExerciseGradeError) as error:
        grade_against(learner, lambda x, p: x**p, cases, name="power", hints=coincides_on_case_1)
    assert "Likely cause" not in str(error.value)
    assert "times 2" in str(error.value)
    explains_both = {**coincides_on_case_1, "doubled": lambda x, p: x**p * 2}
    with pytest.raises(ExerciseGradeError, match=r"\nLikely cause: doubled\.$"):
        grade_against(learner, lambda x, p: x**p, cases, name="power", hints=explains_both)


def test_diagnose_speaks_when_no_hint_matches_and_never_hides_the_difference():
    with pytest.raises(ExerciseGradeError, match=r"values differ(.|\n)*\nthe diagnosis for case \(2, 3\)$"):
        grade_against(lambda x: x.softmax(0), reference, CASES[:1], name="softmax",
                      diagnose=lambda case, got, want: f"the diagnosis for case {tuple(case['x'].shape)}")

    def broken(case, got, want):
        raise RuntimeError("a bug in the diagnosis")

    with pytest.raises(ExerciseGradeError, match=r"values differ"):
        grade_against(lambda x: x.softmax(0), reference, CASES[:1], name="softmax", diagnose=broken)


def test_changing_an_argument_in_place_is_caught():
    def in_place(x):
        return x.exp_() / x.sum(-1, keepdim=True)

    with pytest.raises(ExerciseGradeError, match=r"your function changed its argument 'x' in place"):
        grade_against(in_place, reference, CASES, name="softmax")
    before = CASES[0]["x"].clone()
    grade_against(lambda x: reference(x), reference, CASES, name="softmax")
    assert torch.equal(CASES[0]["x"], before)


def test_wrong_parameter_names_are_explained():
    with pytest.raises(ExerciseGradeError, match=r"unexpected keyword argument 'x'\nThe check passes the arguments "
                                                 r"by name \(x\)"):
        grade_against(lambda logits: logits.softmax(-1), reference, CASES, name="softmax")
