"""process_results of tokenrl_math500.yaml: the harness's own MATH scorers, applied to a \\boxed{} response.

- exact_match: lm-eval's Hendrycks MATH check (last \\boxed{} of the response, remove_boxed, is_equiv's string
  normalisation), from lm_eval.tasks.hendrycks_math.utils, against the dataset's `answer`.
- math_verify: lm-eval minerva_math's second metric, verify(gold=parse(solution), target=parse(response)).
  (minerva_math's module itself asserts antlr4 4.11 at import, while tokenrl pins the 4.9.3 hydra needs, so the
  same two calls are made here.)
"""

from __future__ import annotations

from lm_eval.tasks.hendrycks_math.utils import is_equiv, last_boxed_only_string, remove_boxed


def boxed_answer(response: str) -> str | None:
    boxed = last_boxed_only_string(response)
    if boxed is None:
        return None
    try:
        return remove_boxed(boxed)
    except AssertionError:  # `\boxed{` never closed, or `\fbox{...}`, which remove_boxed does not read
        return None


def process_results(doc: dict, results: list[str]) -> dict[str, int]:
    from math_verify import parse, verify

    answer = boxed_answer(results[0])
    exact = int(answer is not None and is_equiv(answer, doc["answer"]))
    try:
        mv = int(bool(verify(gold=parse(doc["solution"]), target=parse(results[0]))))
    except Exception:  # noqa: BLE001 - the harness counts a parser failure as wrong
        mv = 0
    return {"exact_match": exact, "math_verify": mv}
