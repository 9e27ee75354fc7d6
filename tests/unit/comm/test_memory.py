"""Error feedback: what a skipped step leaves in the memory."""

import torch


def test_error_feedback_of_a_skipped_step_is_dropped():
    from terngrad.comm.rank.memory import ErrorFeedback

    memory = ErrorFeedback()
    memory.update(("a",), (3,), torch.tensor([1.0, 2.0, 3.0]), torch.zeros(3))
    memory.commit()
    memory.update(("a",), (3,), torch.tensor([float("nan")] * 3), torch.zeros(3))
    memory.discard()  # the step was skipped
    assert torch.equal(memory.residuals["a"], torch.tensor([1.0, 2.0, 3.0]))
