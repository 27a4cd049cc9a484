"""Lesson 19 (the capstone's third axis) runs headless from a fresh kernel and computes what it
states: the memory per rank of a GPT-3-shaped model on each grid, the groups of the 2 × 2 × 2
grid, the parameters after training on eight simulated ranks equal to one process (float64),
four gloo processes within the float32 yardstick the lesson measures, and the bytes of each
axis in one step, read from the trace and checked here against the formulas."""

from __future__ import annotations

import pytest
from notebook_runner import lesson, output_texts, run_lesson

pytestmark = pytest.mark.slow

FETCH = [
    "[gpt3_parameters, memory_rows, BYTES_PER_PARAMETER, MEMORY]",
    "[tensor_per_stream, pipeline_per_stream, blocks_per_stage]",
    "places",
    "layout",
    "toy_rows",
    "[sim_parameter_gap, sim_parameter_units, sim_loss_gap, replicas_agree, len(units), "
    "len(training.weights), STEPS, float(one_losses[0] - one_losses[-1])]",
    "[one_process32, float32_rounding, tolerance, gloo_gap, wrong_gap, MICRO, GLOO]",
    "[sent, stream, sends, BATCH, DP, TP, PP, MICRO]",
    "[config.vocab, config.context, config.width, config.hidden, config.layers]",
    "[one_seconds, sim_seconds, gloo_seconds]",
    "stage_orders",
]


@pytest.fixture(scope="module")
def executed():
    nb, values = run_lesson(lesson(19), FETCH)
    texts = "\n".join(output_texts(nb, "text/markdown"))
    return nb, values, texts


def _per_rank(V, n, d, h, L, tp, pp):
    """Parameters of the fullest stage, counted here from the model's definition: the first
    stage adds the embeddings, the last the final norm and the head."""
    block = 4 * d * d // tp + 2 * d * h // tp + 2 * d
    first = V * d + n * d + L // pp * block
    last = L // pp * block + d + d * V
    return max(first, last) if pp > 1 else first + last - L // pp * block


def test_the_memory_per_rank_of_a_gpt3_shaped_model(executed):
    _, v, texts = executed
    total, rows, per_parameter, memory = v[FETCH[0]]
    V, n, d, L = 50257, 2048, 12288, 96
    assert per_parameter == 16 and memory == 80e9
    assert total == 2 * V * d + n * d + L * (4 * d * d + 2 * d * 4 * d + 2 * d) + d
    assert f"{total / 1e9:.1f} billion parameters" in texts
    for tp, pp, ranks, billions, gigabytes, fits in rows:
        per_rank = _per_rank(V, n, d, 4 * d, L, tp, pp)
        assert ranks == tp * pp and billions == f"{per_rank / 1e9:.2f}"
        assert gigabytes == f"{per_rank * 16 / 1e9:.0f}"
        assert fits == ("yes" if per_rank * 16 < 80e9 else "no")
        assert f"| {tp} | {pp} | {ranks} | {billions} | {gigabytes} | {fits} |" in texts
    assert [fits for *_, fits in rows] == ["no", "no", "no", "no", "yes", "yes"]
    tensor, pipeline, blocks = v[FETCH[1]]
    assert blocks == 12 and tensor == 4 * 12 * 2 * 7 / 8 and pipeline == 2
    assert f"| ratio | {tensor / pipeline:g} |" in texts


def test_the_groups_of_the_grid(executed):
    nb, v, texts = executed
    assert v["places"] == [
        [0, 0, 0, 0, [0, 1], [0, 2], [0, 4]],
        [1, 0, 0, 1, [0, 1], [1, 3], [1, 5]],
        [2, 0, 1, 0, [2, 3], [0, 2], [2, 6]],
        [3, 0, 1, 1, [2, 3], [1, 3], [3, 7]],
        [4, 1, 0, 0, [4, 5], [4, 6], [0, 4]],
        [5, 1, 0, 1, [4, 5], [5, 7], [1, 5]],
        [6, 1, 1, 0, [6, 7], [4, 6], [2, 6]],
        [7, 1, 1, 1, [6, 7], [5, 7], [3, 7]],
    ]
    assert v["layout"]["pipeline"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    images = [t for t in output_texts(nb, "text/markdown") if "data:image/png" in t]
    assert len(images) == 1


def test_eight_simulated_ranks_end_with_one_process_parameters(executed):
    _, v, texts = executed
    gap, units, loss_gap, agree, measured, parameters, steps, learned = v[FETCH[5]]
    assert gap < 1e-12 and units < 10 and loss_gap < 1e-12 and agree
    assert measured == parameters == 20 and steps == 12 and learned > 1.0
    assert f"| all 20 parameters | {gap:.1e} | {units:.1f} |" in texts
    toy = dict(v["toy_rows"])
    vocab, context, width, hidden, layers = v[FETCH[8]]
    block = 4 * width * width + 2 * width * hidden + 2 * width
    total = 2 * vocab * width + context * width + layers * block + width
    assert toy["1 × 1 × 1"] == total
    sharded = 4 * width * width // 2 + 2 * width * hidden // 2 + 2 * width
    assert toy["2 × 2 × 1"] == total - layers * block + layers * sharded
    assert toy["2 × 2 × 2"] == max(
        vocab * width + context * width + sharded, sharded + width + width * vocab
    )


def test_each_stage_ran_the_1f1b_order(executed):
    _, v, texts = executed
    orders = v[FETCH[10]]
    # 2 stages, 2 micro-batches: stage 0 one forward ahead, the last stage none
    assert [order for _, _, order in orders] == ["F0 F1 B0 B1"] * 4 + ["F0 B0 F1 B1"] * 4
    assert "| 0 | 0 | F0 F1 B0 B1 |" in texts and "| 7 | 1 | F0 B0 F1 B1 |" in texts


def test_four_gloo_processes_within_the_float32_yardstick(executed):
    _, v, texts = executed
    orders, rounding, tolerance, gloo_gap, wrong_gap, micro, grid = v[FETCH[6]]
    assert len(orders) == 5 and rounding == max(orders) and tolerance == 4 * rounding
    assert 0 < rounding < 1e-4 and 0 < gloo_gap <= tolerance
    assert wrong_gap > 100 * tolerance and micro == 2 and grid == [1, 2, 2]
    for value in (rounding, tolerance, gloo_gap, wrong_gap, min(orders)):
        assert f"| {value:.1e} |" in texts


def test_the_bytes_of_each_axis_follow_the_formulas(executed):
    _, v, texts = executed
    sent, stream, sends, batch, dp, tp, pp, micro = v[FETCH[7]]
    vocab, context, width, hidden, layers = v[FETCH[8]]
    assert stream == batch // dp * context * width * 8
    sharded_block = 4 * width * width // tp + 2 * width * hidden // tp + 2 * width
    held = [vocab * width + context * width + sharded_block, sharded_block + width + width * vocab]
    for rank, axes in enumerate(sent):
        stage = rank // (dp * tp)
        assert axes["tensor"] == 4 * 1 * 2 * (tp - 1) / tp * stream  # one block per stage
        assert axes["pipeline"] == stream  # two stages: one neighbour each
        loss = 8 if stage == pp - 1 else 0
        assert axes["data"] == 2 * (dp - 1) / dp * (held[stage] * 8 + loss)
        row = f"| {rank} | {stage} | {int(axes['data'])} | {int(axes['tensor'])} | "
        assert row + f"{int(axes['pipeline'])} | yes |" in texts
    assert sends == dp * tp * (pp - 1) * micro * 2
    assert f"{sends} sends in the step" in texts and f"each of {stream // micro} bytes" in texts


def test_the_lesson_is_fast(executed):
    _, v, _ = executed
    assert sum(v[FETCH[9]]) < 60
