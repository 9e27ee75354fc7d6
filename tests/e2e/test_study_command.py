"""``terngrad study`` from the command line, fresh and from a ``terngrad train`` checkpoint with
the run's own optimizer."""

import json
import math

import pytest
import torch

from terngrad.bench import study as st
from terngrad.cli import main


@pytest.mark.slow  # a whole experiment: make test-slow
def test_study_command_and_checkpoint(tmp_path, capsys):
    args = ["study", "--model", "mlp", "--dataset", "synthetic", "--steps", "3", "--draws", "2",
            "--methods", "terngrad", "terngrad-noclip", "signsgd"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "terngrad study --model mlp" in (tmp_path / "a" / "report.md").read_text()
    # a checkpoint as terngrad train writes it
    from terngrad.train import checkpoints, data, models
    from terngrad.train.checkpoints import FORMAT as CHECKPOINT_FORMAT
    from terngrad.train.config import TrainConfig

    ds = data.load("synthetic", None, synthetic_shape=models.default_input_shape("mlp"),
                   synthetic_classes=10, seed=0)  # fmt: skip
    model = models.build("mlp", ds.input_shape, ds.num_classes)
    cfg = TrainConfig(out=str(tmp_path / "run"), model="mlp", dataset="synthetic")
    ckpt = {"format": CHECKPOINT_FORMAT, "config": cfg.to_dict(), "model": model.state_dict()}
    checkpoints.save(tmp_path / "checkpoint.pt", ckpt)
    assert main([*args[:1], "--from-checkpoint", str(tmp_path / "checkpoint.pt"), *args[5:],
                 "--out", str(tmp_path / "b")]) == 0  # fmt: skip
    assert "(from a checkpoint)" in (tmp_path / "b" / "report.md").read_text()
    capsys.readouterr()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    for path, message in ((bad, "not a terngrad training checkpoint"),
                          (tmp_path / "none.pt", "no checkpoint")):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            main(["study", "--from-checkpoint", str(path), "--out", str(tmp_path / "c")])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    ckpt["config"]["model"] = "lenet"  # weights of another model
    checkpoints.save(tmp_path / "other.pt", ckpt)
    with pytest.raises(SystemExit) as exc:
        main(["study", "--from-checkpoint", str(tmp_path / "other.pt"), "--dataset", "synthetic",
              "--out", str(tmp_path / "c")])  # fmt: skip
    assert exc.value.code == 2 and "does not fit lenet" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["study", "--methods", "topk", "--out", str(tmp_path / "c")])
    assert exc.value.code == 2 and "unknown method 'topk'" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()  # nothing written for bad input
    saved = json.loads((tmp_path / "b" / "study.json").read_text())
    assert math.isfinite(saved["steps"][0]["loss"])


def test_study_from_checkpoint_goes_on_with_the_runs_optimizer(tmp_path, monkeypatch):
    """An AdamW run's checkpoint: the study trains on with AdamW, its moments and its
    scheduled learning rate (not SGD at 0.01); --lr replaces only the rate."""
    from terngrad.train import checkpoints, data, models
    from terngrad.train.checkpoints import FORMAT as CHECKPOINT_FORMAT
    from terngrad.train.config import TrainConfig
    from terngrad.train.setup import make_optimizer

    ds = data.load("synthetic", None, synthetic_shape=models.default_input_shape("mlp"),
                   synthetic_classes=10, seed=0)  # fmt: skip
    model = models.build("mlp", ds.input_shape, ds.num_classes)
    cfg = TrainConfig(out=str(tmp_path / "run"), model="mlp", dataset="synthetic",
                      optimizer="adamw", lr=1e-3, weight_decay=0.1)  # fmt: skip
    optimizer = make_optimizer(cfg, model)
    x, y = ds.train_batch(torch.arange(8), torch.Generator().manual_seed(0))
    models.loss(model(x), y).backward()
    optimizer.step()
    for group in optimizer.param_groups:
        group["lr"] = 3e-4  # where a schedule had taken it
    ckpt = {"format": CHECKPOINT_FORMAT, "config": cfg.to_dict(), "model": model.state_dict(),
            "optimizer": optimizer.state_dict()}  # fmt: skip
    checkpoints.save(tmp_path / "checkpoint.pt", ckpt)
    seen = []
    real = st.study
    monkeypatch.setattr(st, "study", lambda *a, **k: seen.append(k["optimizer"]) or real(*a, **k))
    args = ["study", "--from-checkpoint", str(tmp_path / "checkpoint.pt"), "--steps", "1",
            "--draws", "2", "--methods", "terngrad"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--lr", "0.05", "--out", str(tmp_path / "b")]) == 0
    for opt, lr in zip(seen, (3e-4, 0.05), strict=True):
        assert isinstance(opt, torch.optim.AdamW)
        assert [g["lr"] for g in opt.param_groups] == [lr, lr]
        assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
        assert all(int(s["step"]) >= 2 for s in opt.state.values())  # its moments went on
