"""``terngrad bench overhead`` for real: 2 ranks, an MLP, a few steps; every part of TernGrad's
exchange is on the clock."""

import json

from terngrad.cli import main


def test_two_ranks_profile_the_hook(tmp_path, capsys):
    out = tmp_path / "overhead.json"
    argv = ["bench", "overhead", "--models", "mlp", "--workers", "2", "--steps", "3",
            "--untimed-steps", "1", "--batch-size", "8", "--json", str(out),
            "--methods", "fp32", "fp16", "terngrad", "terngrad-fused"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "| fp32 |" in text and "| fp16 |" in text and "terngrad's hook, per step" in text
    (summary,) = json.loads(out.read_text())["models"]
    tern = summary["methods"]["terngrad"]
    for part in ("grid_prepare", "grid_pack", "sum_packed", "decode_into", "all_reduce",
                 "all_to_all", "all_gather", "seal_frame", "read_frame", "glue"):  # fmt: skip
        assert part in tern["parts"], part
    assert tern["calls"]["all_to_all"] >= 1 and tern["bytes"]["all_to_all"] > 0
    assert summary["methods"]["fp16"]["parts"]["hook thread"] > 0
    fused = summary["methods"]["terngrad-fused"]  # a method of the table, not a quantizer
    assert fused["calls"]["all_to_all"] == 1 and fused["calls"]["all_gather"] == 1
