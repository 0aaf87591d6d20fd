"""Hand-written checks for the book's coding exercises: run a learner's function on fresh inputs, compare it
with the reference piece from transformer_lib and say, in plain words, what differs.

    from transformer_lib.checks import check_attention
    check_attention(my_attention)  # prints "Well done: ..." or raises ExerciseCheckError with the likely cause

These grade a learner's answers; they are not the input validation of the library's own modules (check_mask,
check_token_ids and the like, which refuse wrong arguments to transformer_lib's functions with a clear error).

There is one named check per coding exercise (see EXERCISE_CHECKS). Each draws new random inputs on every call
(pass seed=... to repeat a run), of several shapes and with the exercise's edge cases, and knows the usual wrong
answers of its exercise. All of them run on the generic engine check_against, which also works on its own:

    check_against(my_fn, reference_fn, cases, name="my_fn")

The package holds the engine and what the checks share (engine.py) and the checks of each chapter in a module
named after the chapter's notebook (ch01_text_to_tensors.py for book/01_text_to_tensors.ipynb, ...). Import the
checks from here, as above.
"""

from collections.abc import Callable

from .ch01_text_to_tensors import check_token_embedding
from .ch02_positional_encoding import check_sinusoidal_encoding
from .ch03_attention import check_attention
from .ch04_masking import check_packed_mask
from .ch05_multi_head_attention import check_blockwise_attention, check_head_outputs
from .ch06_encoder_decoder import check_parameter_count
from .ch07_training_toy import check_label_smoothed_loss
from .ch08_translation import check_average_checkpoints
from .ch09_attention_heatmaps import check_attention_rollout
from .engine import Diagnosis, ExerciseCheckError, check_against

# The named check of every coding exercise of the book, by the exercise's label.
EXERCISE_CHECKS: dict[str, Callable[..., None]] = {
    "ex-text-one-hot": check_token_embedding,
    "ex-positional-table": check_sinusoidal_encoding,
    "ex-attention-write": check_attention,
    "ex-masking-packed": check_packed_mask,
    "ex-multihead-head-outputs": check_head_outputs,
    "ex-multihead-online-softmax": check_blockwise_attention,
    "ex-encoder-decoder-parameters": check_parameter_count,
    "ex-training-toy-smoothing": check_label_smoothed_loss,
    "ex-translation-average-checkpoints": check_average_checkpoints,
    "ex-heatmaps-rollout": check_attention_rollout,
}

__all__ = [
    "EXERCISE_CHECKS",
    "Diagnosis",
    "ExerciseCheckError",
    "check_against",
    "check_attention",
    "check_attention_rollout",
    "check_average_checkpoints",
    "check_blockwise_attention",
    "check_head_outputs",
    "check_label_smoothed_loss",
    "check_packed_mask",
    "check_parameter_count",
    "check_sinusoidal_encoding",
    "check_token_embedding",
]
