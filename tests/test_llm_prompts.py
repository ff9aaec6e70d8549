"""Prompts for the variation operators, and code extraction from replies."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from actors.search.llm import prompts
from actors.search.llm.client import LlmClient, LlmConfig
from actors.search.llm.extract import NoCodeFound, extract_kernel
from actors.search.llm.prompts import RejectionEvidence, crossover, fix, improve
from gpu_workers.cpu.backend import CpuBackend
from kernels.loading import load_problem
from tests.fake_openai import FakeOpenAI, Reply

SOFTMAX = load_problem("softmax")
SIGNATURE = "void kernel(const float *x, float *y, int64_t rows, int64_t cols)"

GOOD = """\
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *in = x + r * cols;
        float *out = y + r * cols;
        float m = in[0], s = 0.0f;
        for (int64_t c = 1; c < cols; ++c) m = in[c] > m ? in[c] : m;
        for (int64_t c = 0; c < cols; ++c) { out[c] = expf(in[c] - m); s += out[c]; }
        for (int64_t c = 0; c < cols; ++c) out[c] /= s;
    }
}
"""

BROKEN = GOOD.replace("s += out[c];", "s += out[c] /* } */;\n        total_sum += s;")


def user_text(messages: list[dict[str, str]]) -> str:
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[1]["content"]


def test_every_prompt_states_the_problem_exactly() -> None:
    lessons = ["threads=0 with simdlen=16 was fastest (2.1x, 6 kernels)"]
    for messages in (
        improve(SOFTMAX, GOOD, lessons),
        fix(SOFTMAX, GOOD, RejectionEvidence(stage="run", reason="crashed"), lessons),
        crossover(SOFTMAX, GOOD, GOOD.replace("expf", "exp"), lessons),
    ):
        system, user = messages[0]["content"], user_text(messages)
        assert SOFTMAX.c_signature() == SIGNATURE
        assert SIGNATURE in system and SIGNATURE in user
        assert SOFTMAX.description in user
        assert '{"rows": 37, "cols": 1000}' in user  # a verified shape
        assert '{"rows": 4096, "cols": 4096}' in user  # the timed shape
        assert "0.0001" in user  # rtol
        assert "`x` [rows, cols] input" in user and "`y` [rows, cols] output" in user
        assert lessons[0] in user
        assert "kfactory-flags" in system


def test_improve_carries_the_parent_source() -> None:
    user = user_text(improve(SOFTMAX, GOOD, []))
    assert GOOD.rstrip("\n") in user
    assert "(none yet)" in user


def test_crossover_carries_both_parents() -> None:
    other = GOOD.replace("expf", "__builtin_expf")
    user = user_text(crossover(SOFTMAX, GOOD, other, ["a lesson"]))
    assert GOOD.rstrip("\n") in user and other.rstrip("\n") in user
    assert user.index("Kernel A") < user.index(GOOD.rstrip("\n")) < user.index("Kernel B")


def test_the_fix_prompt_contains_the_compiler_error_verbatim(tmp_path: Path) -> None:
    outcome = CpuBackend(cache_dir=tmp_path).compile(SOFTMAX, BROKEN, ("-O2",))
    rejection = outcome.rejection
    assert rejection is not None and rejection.stage == "compile"
    log = rejection.evidence["log"]
    assert "total_sum" in log and "error" in log

    evidence = RejectionEvidence(
        stage=rejection.stage,
        reason=rejection.reason,
        message=rejection.message,
        evidence=rejection.evidence,
    )
    user = user_text(fix(SOFTMAX, BROKEN, evidence, ["compile errors: 3 of 10 kernels"]))
    assert log.rstrip("\n") in user  # every line, trailing spaces included
    assert rejection.message in user
    assert "Stage: compile" in user and f"Reason: {rejection.reason}" in user
    assert BROKEN.rstrip("\n") in user


def test_a_huge_log_is_capped_keeping_its_head_and_tail() -> None:
    head = "kernel.c:1:1: error: the first error\n"
    tail = "kernel.c:999:1: error: the last error"
    log = head + "note: noise\n" * 20_000 + tail
    evidence = RejectionEvidence(stage="compile", reason="compile_error", evidence={"log": log})
    user = user_text(fix(SOFTMAX, GOOD, evidence))
    assert head in user and tail in user
    assert "characters omitted" in user
    assert len(user) < len(GOOD) + prompts.MAX_EVIDENCE_VALUE_CHARS + 5_000


def test_non_text_evidence_is_rendered_as_json() -> None:
    evidence = RejectionEvidence(
        stage="compare",
        reason="wrong_value",
        message="y[3, 17] = 0.5, expected 0.25",
        evidence={"index": [3, 17], "expected": 0.25, "got": 0.5},
    )
    user = user_text(fix(SOFTMAX, GOOD, evidence))
    assert "[3, 17]" in user and "y[3, 17] = 0.5, expected 0.25" in user


# --- extraction -------------------------------------------------------------------------


def test_extraction_picks_the_block_that_defines_the_kernel() -> None:
    reply = (
        "First a helper you might like:\n\n"
        "```c\nstatic inline float max2(float a, float b) { return a > b ? a : b; }\n```\n\n"
        "And a Python check:\n```python\nprint('void kernel(')\n```\n\n"
        f"Here is the kernel:\n```c\n// kfactory-flags: -O3 -march=native\n{GOOD}```\n"
        "It should be about 3x faster."
    )
    found = extract_kernel(reply, SOFTMAX)
    assert found.source == GOOD
    assert found.flags == ("-O3", "-march=native")


def test_extraction_takes_the_last_definition_when_several_blocks_define_it() -> None:
    first = GOOD.replace("expf", "exp")
    reply = f"Draft:\n```c\n{first}```\nBetter:\n```C\n{GOOD}```\n"
    assert extract_kernel(reply, SOFTMAX).source == GOOD


def test_extraction_without_flags_says_so() -> None:
    found = extract_kernel(f"```c\n{GOOD}```", SOFTMAX)
    assert found.flags is None and found.source == GOOD


def test_unfenced_code_is_found_and_trailing_prose_dropped() -> None:
    reply = f"Sure. Here it is.\n\n{GOOD}\nThis keeps three passes but vectorises them."
    assert extract_kernel(reply, SOFTMAX).source == GOOD


def test_a_fenced_block_is_taken_whole_with_helpers_after_the_kernel() -> None:
    code = (
        "#include <stdint.h>\nstatic void row(const float *x, float *y, int64_t n);\n"
        "void kernel(const float *x, float *y, int64_t rows, int64_t cols) {\n"
        "    for (int64_t r = 0; r < rows; ++r) row(x + r * cols, y + r * cols, cols);\n}\n"
        "static void row(const float *x, float *y, int64_t n) { (void)x; (void)y; (void)n; }\n"
    )
    assert extract_kernel(f"```c\n{code}```\nDone.", SOFTMAX).source == code


def test_braces_in_comments_and_strings_do_not_confuse_the_body() -> None:
    tricky = GOOD.replace(
        "float m = in[0]", 'const char *t = "}}"; (void)t; /* } */ float m = in[0]'
    )
    assert extract_kernel(f"```c\n{tricky}```", SOFTMAX).source == tricky


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("I cannot help with that.", "no code block and no C code"),
        ("```c\nvoid other(float *x) { x[0] = 1; }\n```", "defines the kernel function kernel"),
        (
            "```c\nvoid kernel(const float *x, float *y, int64_t rows, int64_t cols);\n```",
            "defines the kernel function kernel",
        ),
        ("```c\nvoid kernel(const float *x, float *y) { y[0] = x[0]; }\n```", "2 parameters"),
        (f"```c\n{GOOD[: len(GOOD) // 2]}", "not closed"),  # the reply was cut off
        ("```python\ndef kernel(x): return x\n```", "no code block"),
    ],
)
def test_replies_without_the_kernel_are_rejected_with_a_reason(reply: str, why: str) -> None:
    with pytest.raises(NoCodeFound, match=why):
        extract_kernel(reply, SOFTMAX)


# --- through the wire -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_broken_reply_leads_to_a_fix_request_carrying_the_compiler_log(
    tmp_path: Path,
) -> None:
    """improve -> reply with broken code -> compile -> fix prompt sent to the endpoint."""
    with FakeOpenAI([Reply(f"Try this:\n```c\n{BROKEN}```"), Reply(f"```c\n{GOOD}```")]) as srv:
        cfg = LlmConfig(base_url=srv.base_url, model="fake", max_attempts=1, timeout_s=5.0)
        async with LlmClient(cfg, api_key="dummy", rng=random.Random(1)) as llm:
            first = await llm.complete(improve(SOFTMAX, GOOD, []))
            broken = extract_kernel(first.text, SOFTMAX)
            rejection = CpuBackend(cache_dir=tmp_path).compile(SOFTMAX, broken.source, ("-O2",))
            assert rejection.rejection is not None
            evidence = RejectionEvidence(
                stage=rejection.rejection.stage,
                reason=rejection.rejection.reason,
                message=rejection.rejection.message,
                evidence=rejection.rejection.evidence,
            )
            second = await llm.complete(fix(SOFTMAX, broken.source, evidence))
        sent = srv.requests[1]["messages"][1]["content"]
    assert rejection.rejection.evidence["log"].rstrip("\n") in sent
    assert extract_kernel(second.text, SOFTMAX).source == GOOD
