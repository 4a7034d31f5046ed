"""``manta-aggregator search`` on bad input (one line, non-zero exit, before any slow work) and with
no peer online (a local search that says so)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aggregator.cli import main
from aggregator.task_publication import build_task_spec
from protocol.identity import Identity
from protocol.sealing import seal
from supernet.checkpoint import save_trained
from supernet.workload import workload_for
from tests.supernet.threads import single_torch_thread  # noqa: F401


@pytest.fixture(scope="module")
def agg_dir(tmp_path_factory):
    """An aggregator data directory: its identity, its sealed task and one checkpoint."""
    folder = tmp_path_factory.mktemp("agg")
    identity = Identity.load_or_create(folder / "identity.key")
    (folder / "task.sealed").write_bytes(seal(build_task_spec("digits", identity), identity))
    workload = workload_for("digits", dict(width_mult=0.25, head_channels=64, channel_divisor=4,
                                           bn_calibration_batches=1))  # fmt: skip
    save_trained(folder / "checkpoints" / "round-00000002.pt", workload, workload.build(), round_index=2)
    return folder


def _run(*args: str):
    result = CliRunner().invoke(main, ["search", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data-dir", "{tmp}"], "not an aggregator data directory"),
        (["--data-dir", "{agg}", "--identity", "{stranger}", "--max-mflops", "5"], "is not an aggregator key"),
        (["--data-dir", "{agg}", "--identity", "{key}", "--max-mflops", "5"], "no multiaddrs.txt"),
        (["--data-dir", "{agg}", "--identity", "{key}", "--peers-wait", "0"], "give exactly one budget"),
        (["--data-dir", "{agg}", "--identity", "{key}", "--initial-peers", "nonsense", "--max-mflops", "5"],
         "initial peer must look like"),
        (["--data-dir", "{agg}", "--identity", "{key}", "--peers-wait", "0", "--max-mflops", "5",
          "--checkpoint", "{tmp}/missing.pt"], "does not exist"),
    ],
    ids=["no-task", "stranger", "no-peers-given", "no-budget", "bad-multiaddr", "no-checkpoint"],
)  # fmt: skip
def test_bad_input_is_one_line(agg_dir, tmp_path, args, message):
    stranger = Identity.load_or_create(tmp_path / "stranger.key")
    fill = dict(tmp=tmp_path, agg=agg_dir, key=agg_dir / "identity.key", stranger=stranger.path)
    code, output = _run(*[a.format(**fill) for a in args])
    assert code != 0 and message in output, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output


def test_without_peers_it_searches_locally_and_says_so(agg_dir, tmp_path):
    code, output = _run(
        "--data-dir", str(agg_dir), "--identity", str(agg_dir / "identity.key"), "--peers-wait", "0",
        "--max-mflops", "1000", "--evaluations", "3", "--population", "3", "--val-samples", "16",
        "--bn-batches", "1", "--latency-repeats", "1", "--latency-table", str(tmp_path / "lat.json"),
        "--json", str(tmp_path / "out.json"),
    )  # fmt: skip
    assert code == 0, output
    assert "no peer online: evaluating every sub-network locally" in output
    assert "evaluated locally (no peer online)" in output
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["distributed"]["peers"] == [] and len(report["distributed"]["evaluated"]) == 3
    assert report["distributed"]["checkpoint"].endswith("round-00000002.pt")
