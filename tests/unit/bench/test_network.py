"""``terngrad bench network``: rates, the summary of the ranks' measurements, the host checks,
the namespaces the tool owns."""

import os
import shutil

import pytest

from terngrad.bench import network, testbed


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


def test_only_the_tools_own_namespaces_count():
    assert testbed._ours("tg-hub", "tg") and testbed._ours("tg-r12", "tg")
    for other in ("tg-router", "tg-r", "tg-r1x", "tgx-r1", "tg", "other-r1"):
        assert not testbed._ours(other, "tg")


def test_namespaces_of_the_users_in_the_way_are_status_2_and_nothing_is_written(
    monkeypatch, tmp_path, capsys
):
    """A namespace with the testbed's name that it did not make is the user's to clear: one
    line, status 2 (it was 1, as for a machine that cannot host the testbed), before the
    results folder is made. (Nothing is made: the host's namespaces are listed, not touched.)"""
    from terngrad.cli import main

    monkeypatch.setattr(testbed, "check_host", lambda: None)
    monkeypatch.setattr(testbed, "_read_record", lambda prefix: None)
    monkeypatch.setattr(testbed, "_namespaces", lambda: ["tg-r1", "other"])
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "network", "--workers", "2", "--methods", "fp32", "--out", str(out)])
    assert exc.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]  # (after the line it starts with)
    assert said.startswith("terngrad: error: namespaces tg-r1 already exist and terngrad's "
                           "testbed did not make them"), said  # fmt: skip
    assert not out.exists()
