"""Hand-written graders for the book's coding exercises: run a learner's function on fresh inputs, compare it
with the reference piece from transformer_lib and say, in plain words, what differs.

    from transformer_lib.grading import grade_attention
    grade_attention(my_attention)  # prints "Well done: ..." or raises ExerciseGradeError with the likely cause

Graders are named grade_*; the input validation of the library's own modules is named check_* (check_mask,
check_token_ids and the like: they refuse wrong arguments to transformer_lib's functions with a clear error).

There is one grader, grade_<what it grades>, per coding exercise (see EXERCISE_GRADERS). Each draws new random inputs on every call
(pass seed=... to repeat a run), of several shapes and with the exercise's edge cases, and knows the usual wrong
answers of its exercise. All of them run on the generic engine grade_against, which also works on its own:

    grade_against(my_fn, reference_fn, cases, name="my_fn")

The package holds the engine and what the graders share (engine.py) and the graders of each chapter in a module
named after the chapter's notebook (ch01_text_to_tensors.py for book/01_text_to_tensors.ipynb, ...). Import the
graders from here, as above.
"""

from collections.abc import Callable

from .ch01_text_to_tensors import grade_bpe_segment, grade_embedding_inverse
from .ch02_positional_encoding import grade_shift_encoding
from .ch03_attention import grade_attention
from .ch04_masking import grade_packed_mask
from .ch05_multi_head_attention import grade_blockwise_attention, grade_head_outputs
from .ch06_encoder_decoder import grade_parameter_count
from .ch07_training_toy import grade_label_smoothed_loss
from .ch08_translation import grade_average_checkpoints
from .ch09_attention_heatmaps import grade_attention_rollout
from .ch10_since_2017 import grade_rms_norm
from .engine import Diagnosis, ExerciseGradeError, grade_against

# The grader of every coding exercise of the book, by the exercise's label.
EXERCISE_GRADERS: dict[str, Callable[..., None]] = {
    "ex-text-bpe-segment": grade_bpe_segment,
    "ex-text-embedding-inverse": grade_embedding_inverse,
    "ex-positional-shift": grade_shift_encoding,
    "ex-attention-write": grade_attention,
    "ex-masking-packed": grade_packed_mask,
    "ex-multihead-head-outputs": grade_head_outputs,
    "ex-multihead-online-softmax": grade_blockwise_attention,
    "ex-encoder-decoder-parameters": grade_parameter_count,
    "ex-training-toy-smoothing": grade_label_smoothed_loss,
    "ex-translation-average-checkpoints": grade_average_checkpoints,
    "ex-heatmaps-rollout": grade_attention_rollout,
    "ex-since-rms-norm": grade_rms_norm,
}

__all__ = [
    "EXERCISE_GRADERS",
    "Diagnosis",
    "ExerciseGradeError",
    "grade_against",
    "grade_attention",
    "grade_attention_rollout",
    "grade_average_checkpoints",
    "grade_blockwise_attention",
    "grade_bpe_segment",
    "grade_embedding_inverse",
    "grade_head_outputs",
    "grade_label_smoothed_loss",
    "grade_packed_mask",
    "grade_parameter_count",
    "grade_rms_norm",
    "grade_shift_encoding",
]
