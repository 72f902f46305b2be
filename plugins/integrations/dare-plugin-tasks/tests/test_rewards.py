"""Reward rules (countdown and sudoku as in d1, arXiv:2504.12216; boxed math) and their oracles."""

from __future__ import annotations

import threading

import pytest

from dare_core.errors import DareError
from dare_core.interfaces.seams import Example, Score
from dare_plugin_tasks.rewards import (
    EXTRACTION_FAILED,
    UnsupportedDataSourceError,
    countdown_reward,
    extract_answer_tag,
    extract_boxed,
    grade_math_answer,
    math_reward,
    score_example,
    sudoku_reward,
)

# --------------------------------------------------------------------------- math oracles


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("Janet makes 9 * 2 = 18 dollars, so the answer is \\boxed{18}.", "18", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac12", 1.0),
        ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{2/4}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\frac{10}{2}}", "5", 1.0),
        ("\\boxed{5=7}", "7", 0.0),
        ("\\boxed{1,000}", "1000", 1.0),
    ],
)
def test_math_oracles(response, truth, expected):
    s = math_reward(response, truth)
    assert s.score == expected
    assert s.acc == expected


def test_math_no_box_is_extraction_failure():
    s = math_reward("The answer is 18.", "18")
    assert s == Score(score=0.0, acc=0.0, pred=EXTRACTION_FAILED)
    assert EXTRACTION_FAILED == "ERROR: Answer Extraction Failed"


# --------------------------------------------------------------------------- math details


def test_extract_boxed_last_balanced():
    assert extract_boxed("\\boxed{1} then \\boxed{\\frac{a}{b}} end") == "\\frac{a}{b}"
    assert extract_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"
    assert extract_boxed("\\boxed{unclosed {") is None
    assert extract_boxed("\\boxed 5") is None
    assert extract_boxed("\\fbox{7}") == "7"
    assert extract_boxed("no box") is None


def test_math_pred_is_extracted_answer():
    assert math_reward("so \\boxed{17}", "18") == Score(0.0, 0.0, "17")
    assert math_reward("so \\boxed{18}", "18").pred == "18"


def test_math_boxed_ground_truth_is_extracted():
    assert math_reward("\\boxed{5}", "The answer is \\boxed{5}.").score == 1.0
    assert math_reward("\\boxed{5}", "\\boxed{6}").score == 0.0


def test_math_several_ground_truths():
    assert math_reward("\\boxed{7}", ["6", "7"]).score == 1.0
    assert math_reward("\\boxed{8}", ["6", "7"]).score == 0.0


@pytest.mark.parametrize(
    "given, truth, expected",
    [
        ("\\dfrac{3}{4}", "0.75", True),
        ("\\frac{3}{2}", "1.5", True),
        ("\\frac{4}{2}", "2", True),
        ("12", "\\frac12", False),
        ("18.00", "18", True),
        ("\\$18", "18", True),
        ("10\\%", "10", True),
        ("5\\text{ cm}", "5", True),
        ("x=2", "2", True),
        ("x+1", "1+x", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
        ("1\\frac{1}{2}", "\\frac32", True),  # mixed number
        ("[1,2)", "[1, 2)", True),
        ("(1,2]", "[1, 2)", False),  # interval ends must match
        ("(1, 2, 3)", "(1, 2)", False),
        ("\\text{Evelyn}", "\\text{Evelyn}", True),
        ("E", "\\text{(E)}", True),
        ("\\pi", "3.14159", False),
        ("0.333", "\\frac13", False),
        ("\\frac{x}{23}", "\\frac{x2}{3}", False),
        ("-\\frac{1}{2}", "-0.5", True),
        ("1,\\!000", "1000", True),
        ("", "5", False),
    ],
)
def test_grade_math_answer(given, truth, expected):
    assert grade_math_answer(given, truth) is expected


def test_math_symbolic_check_works_off_the_main_thread():
    out = {}

    def work():
        out["s"] = math_reward("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}")

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out["s"].score == 1.0


# --------------------------------------------------------------------------- countdown


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<answer>\n2*4-3\n</answer>", 1.0),  # oracle
        ("<answer>2*4</answer>", 0.1),  # oracle: a number missing
        ("<answer>4*3-2</answer>", 0.1),  # oracle: evaluates to 10
        ("2*4-3", 0.0),  # oracle: no tag
        ("<reasoning>x</reasoning><answer>(2+3)*4/4</answer>", 0.1),  # 4 used twice
        ("<answer>2*4-3-0</answer>", 0.1),  # extra number
        ("<answer>2*4-x3</answer>", 0.0),  # not an expression of the grammar
        ("<answer>2*4-3=5</answer>", 0.0),  # '=' is outside the grammar
        ("<answer>4/(3-3)+2</answer>", 0.1),  # division by zero
        ("<answer>2 4 3</answer>", 0.0),  # does not parse
        ("<answer>-(3-2*4)</answer>", 1.0),  # unary minus, as Python's eval in the paper's code
        ("<answer>\n (4 * 2) - 3 \n</answer>", 1.0),
        ("<answer>3+2*4/4-0</answer>", 0.1),
        ("<answer>1</answer> no wait <answer>2*4-3</answer>", 1.0),  # last tag wins
        ("<answer>2*4-3</answer> <answer>4*3-2</answer>", 0.1),  # last tag wins
        ("<answer>2*4-3</answer>\nextra text after the answer", 1.0),
        ("<answer>2*4-3", 0.0),  # unterminated tag
        # DOTALL: the block is found, but like Python's eval the newlines break parsing
        ("<answer>\n2\n*4\n-3\n</answer>", 0.0),
        ("<answer>\n(2\n*4\n-3)\n</answer>", 1.0),
    ],
)
def test_countdown_rules(response, expected):
    s = countdown_reward(response, [2, 3, 4], 5)
    assert s.score == pytest.approx(expected)
    assert s.acc == (1.0 if expected == 1.0 else 0.0)


def test_countdown_accepts_json_numbers_and_string_target():
    assert countdown_reward("<answer>100-93+30-14</answer>", "[30, 100, 93]", "23").score == 0.1
    assert countdown_reward("<answer>30-(100-93)</answer>", "[30, 100, 93]", "23").score == 1.0
    assert countdown_reward("<answer>30-(100-93)</answer>", "[30, 100, 93]", "23").pred == ("30-(100-93)")


def test_countdown_division_is_exact():
    assert countdown_reward("<answer>1/3*3</answer>", [1, 3, 3], 1).score == 1.0
    assert countdown_reward("<answer>(1+1/3)*3</answer>", [1, 1, 3, 3], 4).score == 1.0
    assert countdown_reward("<answer>7/2+1</answer>", [7, 2, 1], 4).score == 0.1  # 4.5


def test_countdown_huge_power_is_refused_unevaluated():
    s = countdown_reward("<answer>9**9**9</answer>", [9, 9, 9], 5)
    assert s.score == 0.0


# --------------------------------------------------------------------------- sudoku

PUZZLE = "3102200002100320"
SOLUTION = "3142243142131324"


def test_sudoku_oracles():
    assert sudoku_reward(f"<answer>\n{SOLUTION}\n</answer>", PUZZLE, SOLUTION) == Score(1.0, 1.0, SOLUTION)
    one_wrong = SOLUTION[:2] + "1" + SOLUTION[3:]  # index 2 is an empty cell
    s = sudoku_reward(f"<answer>{one_wrong}</answer>", PUZZLE, SOLUTION)
    assert s.score == pytest.approx(0.875) and s.acc == 0.0
    s = sudoku_reward("<answer>31422431</answer>", PUZZLE, SOLUTION)
    assert s.score == pytest.approx(0.5)
    assert s.pred == "3142243100000000"  # padded with '0'


def test_sudoku_rules():
    assert sudoku_reward(SOLUTION, PUZZLE, SOLUTION).score == 0.0  # no tag
    assert sudoku_reward("<answer></answer>", PUZZLE, SOLUTION).score == 0.0
    # separators are ignored, only digits count
    spaced = "3142 2431\n4213-1324"
    assert sudoku_reward(f"<answer>{spaced}</answer>", PUZZLE, SOLUTION).score == 1.0
    # truncated to 16 digits
    assert sudoku_reward(f"<answer>{SOLUTION}9999</answer>", PUZZLE, SOLUTION).score == 1.0
    # a wrong given cell does not count (only empty cells are scored)
    given_wrong = "4" + SOLUTION[1:]
    assert sudoku_reward(f"<answer>{given_wrong}</answer>", PUZZLE, SOLUTION).score == 1.0
    # the last <answer> block wins
    both = f"<answer>{SOLUTION}</answer> hmm <answer>31422431</answer>"
    assert sudoku_reward(both, PUZZLE, SOLUTION).score == pytest.approx(0.5)
    both = f"<answer>31422431</answer><answer>{SOLUTION}</answer> trailing"
    assert sudoku_reward(both, PUZZLE, SOLUTION).score == 1.0
    # a full puzzle has no empty cell: 0
    assert sudoku_reward(f"<answer>{SOLUTION}</answer>", SOLUTION, SOLUTION).score == 0.0


def test_extract_answer_tag():
    assert extract_answer_tag("<answer> a </answer><answer>\n b \n</answer>") == "b"
    assert extract_answer_tag("nothing") is None


# --------------------------------------------------------------------------- dispatch


def _ex(source, gt, **info):
    return Example(prompt=[{"role": "user", "content": "q"}], ground_truth=gt, data_source=source, extra_info=info)


def test_score_example_dispatch():
    assert score_example(_ex("countdown", "5", numbers="[2, 3, 4]"), "<answer>2*4-3</answer>").score == 1.0
    assert score_example(_ex("sudoku", SOLUTION, puzzle=PUZZLE), "<answer>31422431</answer>").score == 0.5
    assert score_example(_ex("sudoku_4x4", SOLUTION, puzzle=PUZZLE), f"<answer>{SOLUTION}</answer>").acc == 1.0
    for source in ("gsm8k", "openai/gsm8k", "math", "math500", "aime2024", "aime2025", "openr1"):
        assert score_example(_ex(source, "18"), "\\boxed{18}").score == 1.0, source


@pytest.mark.parametrize("source", ["humaneval", "mbpp", "lcbv5"])
def test_score_example_code_in_unknown_format_is_unsupported(source):
    # tests that are neither HumanEval check() code nor a JSON list of asserts (e.g. stdin/stdout)
    with pytest.raises(ValueError, match="stdin/stdout tests are not supported yet") as info:
        score_example(_ex(source, "assert f() == 1"), "```python\ndef f(): return 1\n```")
    assert isinstance(info.value, DareError)
    assert "\n" not in str(info.value)


def test_score_example_unknown_source():
    with pytest.raises(UnsupportedDataSourceError, match="'trivia'.*supported data sources"):
        score_example(_ex("trivia", "x"), "x")


def test_score_example_missing_extra_info():
    with pytest.raises(ValueError, match="numbers"):
        score_example(_ex("countdown", "5"), "<answer>1</answer>")
    with pytest.raises(ValueError, match="puzzle"):
        score_example(_ex("sudoku", SOLUTION), "<answer>1</answer>")


@pytest.mark.parametrize(
    "response, truth, correct",
    [
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True),  # nested braces
        ("\\boxed{\\{1,2\\}} and later \\boxed{5}", "5", True),  # the last box counts
        ("<answer>\\boxed{7}</answer>", "7", True),  # d1's answer tags around it
        ("\\boxed{1,234}", "1234", True),  # thousands separators
        ("\\boxed{1{,}000}", "1000", True),
        ("\\boxed{3/4}", "\\frac{3}{4}", True),  # fractions
        ("\\boxed{\\dfrac{3}{4}}", "\\frac34", True),
        ("\\boxed{-\\frac{1}{2}}", "-0.5", True),
        ("\\boxed{18.00}", "18", True),
        ("\\boxed{\\$18}", "18", True),  # units and currency
        ("\\boxed{18 \\text{ dollars}}", "18", True),
        ("\\boxed{19}", "18", False),
    ],
)
def test_math_known_answers(response, truth, correct):
    score = math_reward(response, truth)
    assert score.acc == score.score == float(correct)


def test_gsm8k_hash_answer_is_not_read():
    # the grader reads \boxed{} only (as the DARE reference's math reward): GSM8K's own `#### 18`
    # solution format, or a bare number, is an extraction failure
    for response in ("so she makes 18 dollars.\n#### 18", "18"):
        assert math_reward(response, "18") == Score(0.0, 0.0, EXTRACTION_FAILED)
