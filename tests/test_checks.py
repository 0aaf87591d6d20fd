import pytest
import torch

from transformer_lib.checks import ExerciseCheckError, check_against


def reference(x):
    return x.softmax(-1)


CASES = [{"x": torch.randn(2, 3)}, {"x": torch.randn(1, 5)}]


def test_a_correct_answer_passes(capsys):
    check_against(lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), reference, CASES, name="softmax")
    assert "Well done: softmax matches the reference on all 2 test inputs" in capsys.readouterr().out


def test_wrong_shape_is_reported():
    with pytest.raises(ExerciseCheckError, match=r"case 1 of 2.*expected shape \(2, 3\), got \(3, 2\)"):
        check_against(lambda x: x.softmax(-1).T, reference, CASES, name="softmax")


def test_wrong_values_get_the_diagnosis_of_the_matching_mistake():
    hints = {"the softmax runs over the wrong axis": lambda x: x.softmax(0)}
    with pytest.raises(ExerciseCheckError, match=r"values differ.*\nLikely cause: the softmax runs over the wrong axis"):
        check_against(lambda x: x.softmax(0), reference, CASES, name="softmax", hints=hints)


def test_the_stub_error_passes_through_and_crashes_are_explained():
    def stub(x):
        raise NotImplementedError("write it")

    with pytest.raises(NotImplementedError):
        check_against(stub, reference, CASES, name="softmax")
    with pytest.raises(ExerciseCheckError, match="your function raised ZeroDivisionError"):
        check_against(lambda x: 1 / 0, reference, CASES, name="softmax")


def test_boolean_masks_name_the_first_wrong_entry():
    with pytest.raises(ExerciseCheckError, match=r"at index \(0, 1\): expected False, got True"):
        check_against(lambda n: torch.ones(n, n, dtype=torch.bool), lambda n: torch.ones(n, n, dtype=torch.bool).tril(),
                      [{"n": 3}], name="mask")
