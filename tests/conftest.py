import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton kernels run on CPU tensors through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels():
    """Compile the numba kernels once, before any test spawns ranks that would each compile."""
    from terngrad.kernels import warm_up

    warm_up(levels=True)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
    yield


#: the small run the folder and checkpoint tests start from (2 workers, evaluated every 2 steps)
SMALL_RUN = ["train", "--model", "mlp", "--dataset", "synthetic", "--quiet", "--workers", "2",
             "--eval-every", "2"]  # fmt: skip


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """``finished_run(steps, dest)``: a copy in ``dest`` of ``SMALL_RUN`` trained ``steps``
    (2 or 4) steps — trained once per session, copied for each test that alters it."""
    import shutil

    from terngrad.cli import main

    trained = {}
    for steps in (2, 4):
        out = tmp_path_factory.mktemp("finished") / f"run{steps}"
        assert main([*SMALL_RUN, "--steps", str(steps), "--out", str(out)]) == 0
        trained[steps] = out

    def copy(steps, dest):
        shutil.copytree(trained[steps], dest)
        return dest

    return copy


def refused(capsys, argv) -> str:
    """Run the CLI on ``argv``, which must be refused: exit status 2 and one line, returned."""
    from terngrad.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err
