"""``terngrad bench network``: rates, the summary, errors, and a real 2-rank testbed run.

The testbed run needs root and iproute2 (network namespaces, veth, tc); without them it is
skipped with the reason. It uses its own namespace prefix, so it never touches a benchmark the
user may be running at the same time.
"""

import json
import os
import shutil
import subprocess

import pytest

from terngrad.bench import network, testbed
from terngrad.cli import main

PREFIX = "tgtest"


def _can_build_namespaces() -> str | None:
    """Why the testbed cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = subprocess.run(["ip", "netns", "add", f"{PREFIX}-probe"], capture_output=True)
    if probe.returncode:
        return f"cannot create network namespaces: {probe.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "delete", f"{PREFIX}-probe"], capture_output=True)
    return None


WHY_NOT = _can_build_namespaces()


def test_rates():
    assert testbed.rate_bits("1gbit") == 10**9
    assert testbed.rate_bits("100mbit") == 10**8
    assert testbed.rate_bits("2.5gbit") == 2_500_000_000
    assert testbed.rate_bits("unlimited") is None
    for bad in ("fast", "0gbit", "-1mbit", "1gb", ""):
        with pytest.raises(ValueError, match="bandwidth must be a rate"):
            testbed.rate_bits(bad)


def test_summary_takes_the_slowest_rank_and_the_median_step():
    raw = {
        "ranks": [
            {
                "compute_seconds": [1.0, 2.0, 3.0],
                "probe_seconds": [0.5, 0.2, 0.3],
                "methods": [
                    {"method": "fp32", "step_seconds": [4.0, 4.0, 9.0],
                     "wire_bytes_per_step": 100.0, "codec_seconds_per_step": 0.0},
                    {"method": "terngrad", "step_seconds": [1.0, 3.0, 1.0],
                     "wire_bytes_per_step": 10.0, "codec_seconds_per_step": 0.5,
                     "retransmitted_per_step": 1.5},
                ],
            },
            {
                "compute_seconds": [2.0, 1.0, 1.0],
                "probe_seconds": [0.4, 0.3, 0.1],
                "methods": [
                    {"method": "fp32", "step_seconds": [5.0, 3.0, 3.0],
                     "wire_bytes_per_step": 120.0, "codec_seconds_per_step": 0.0},
                    {"method": "terngrad", "step_seconds": [2.0, 2.0, 1.0],
                     "wire_bytes_per_step": 14.0, "codec_seconds_per_step": 0.3,
                     "retransmitted_per_step": 0.5},
                ],
            },
        ]
    }  # fmt: skip
    s = network.summarise(raw, 2, "1gbit", "mlp")
    assert s["compute_seconds"] == 2.0  # per step the slowest rank: 2, 2, 3 -> median 2
    fp32, tern = s["methods"]
    assert fp32["step_seconds"] == 5.0  # 5, 4, 9 -> 5
    assert tern["step_seconds"] == 2.0  # 2, 3, 1 -> 2
    assert tern["speedup_vs_fp32"] == 2.5
    assert tern["wire_bytes_per_rank_per_step"] == 12.0
    assert tern["max_wire_bytes_per_rank_per_step"] == 14.0
    assert tern["tcp_retransmits_per_step"] == 2.0 and fp32["tcp_retransmits_per_step"] == 0.0
    probe = s["link_probe"]  # slowest rank per repeat: 0.5, 0.3, 0.3 -> 0.3
    assert probe["seconds"] == 0.3
    assert probe["bytes_per_rank"] == network.PROBE_NUMEL * 4  # 2 (N-1)/N x 4 bytes, N = 2
    assert probe["bytes_per_second"] == pytest.approx(network.PROBE_NUMEL * 4 / 0.3)
    assert tern["codec_share"] == pytest.approx(0.4 / 2.0)
    assert "terngrad" in network.table(s)


def test_host_checks_say_what_is_missing(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(testbed.TestbedUnavailable, match="needs root"):
        testbed.check_host()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else "/usr/bin/ip")
    with pytest.raises(testbed.TestbedUnavailable, match="'tc' command from iproute2"):
        testbed.check_host()


def test_cli_refuses_bad_input(capsys):
    for argv, message in [
        (["bench", "network", "--bandwidth", "fast"], "bandwidth must be a rate"),
        (["bench", "network", "--workers", "9"], "2 to 8 ranks"),
        (["bench", "network", "--methods", "zip"], "unknown method 'zip'; choose from"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_the_old_spelling_of_workers_still_runs_with_a_warning(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "network", "--ranks", "9"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--ranks is deprecated: use --workers" in err and "2 to 8 ranks" in err


@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_two_rank_testbed_run(tmp_path):
    summary = network.run(
        2, "1gbit", "mlp", ["fp32", "terngrad"], tmp_path, steps=2, warmup=1, timeout=300,
        prefix=PREFIX,
    )  # fmt: skip
    assert not [n for n in testbed._namespaces() if n.startswith(f"{PREFIX}-")]  # torn down
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    assert (tmp_path / "speedup.png").stat().st_size > 0
    fp32, tern = summary["methods"]
    # an MLP of 669,706 parameters: the fp32 ring moves 2 (N-1)/N 4 bytes a parameter and more
    # (headers); TernGrad well under a tenth of that
    assert fp32["wire_bytes_per_rank_per_step"] > 669_706 * 4
    assert tern["wire_bytes_per_rank_per_step"] < fp32["wire_bytes_per_rank_per_step"] / 8
    assert fp32["speedup_vs_fp32"] == 1.0 and 0 < tern["codec_share"] < 1
    assert fp32["tcp_retransmits_per_step"] >= 0  # counted inside the ranks' namespaces
    assert summary["link_probe"]["bytes_per_second"] > 0


@pytest.mark.skipif(WHY_NOT is not None, reason=f"testbed: {WHY_NOT}")
def test_leftovers_are_refused_then_cleaned_up():
    subprocess.run(["ip", "netns", "add", f"{PREFIX}-r1"], check=True)
    try:
        with (
            pytest.raises(testbed.TestbedUnavailable, match="already exist"),
            testbed.Testbed(2, prefix=PREFIX),
        ):
            pass
    finally:
        assert testbed.cleanup(PREFIX) == [f"{PREFIX}-r1"]
    assert f"{PREFIX}-r1" not in testbed._namespaces()


def test_only_the_tools_own_namespaces_count():
    assert testbed._ours("tg-hub", "tg") and testbed._ours("tg-r12", "tg")
    for other in ("tg-router", "tg-r", "tg-r1x", "tgx-r1", "tg", "other-r1"):
        assert not testbed._ours(other, "tg")
