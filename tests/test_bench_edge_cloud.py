"""bench/edge_cloud.py's network table: each arm's totals and their ratio to the strong arm."""

from tests.helpers.bench import load_bench


def totals(requests, prompt, completion, sent, received):
    return {"network": {"total": {"requests": requests, "prompt_tokens": prompt, "completion_tokens": completion,
                                  "bytes_sent": sent, "bytes_received": received}}}


def test_each_arm_is_set_against_the_strong_arm_and_nothing_is_divided_by_zero():
    bench = load_bench("edge_cloud")
    report = {"arms": {"strong": totals(10, 1000, 400, 8000, 4000), "specagent": totals(15, 3000, 100, 30000, 6000),
                       "weak": totals(0, 0, 0, 0, 0)}}
    table = bench.network_table(report)
    assert table["strong"]["completion_tokens_ratio"] == 1.0
    assert table["specagent"]["completion_tokens_ratio"] == 0.25
    assert table["specagent"]["bytes_sent_ratio"] == 3.75 and table["specagent"]["requests"] == 15
    assert table["weak"]["requests_ratio"] == 0.0
    report["arms"]["strong"] = totals(0, 0, 0, 0, 0)
    assert bench.network_table(report)["specagent"]["requests_ratio"] is None
