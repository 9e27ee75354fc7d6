"""The launcher's own signal handling: SIGINT stops a launch even where the launcher
inherited it ignored; a signal while the workers start is raised once they all have (so the
launcher knows every one it must stop); one while they are being stopped cuts nothing short.
Each case runs 10 times: the e2e test (tests/e2e/test_signals.py) sends the real signals to a
real launcher."""

import os
import signal

import pytest

from terngrad.train.launch import Stopped, _Signals

REPEATS = 10


@pytest.fixture(autouse=True)
def _handlers():
    """Every test leaves the process's handlers as it found them."""
    before = {s: signal.getsignal(s) for s in _Signals.SIGNALS}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def _send(sig):
    os.kill(os.getpid(), sig)  # (the handler runs before the next line)


@pytest.mark.parametrize("sig", _Signals.SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_each_signal_stops_the_launch_even_if_it_was_ignored(sig):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background command of a plain shell
    raised = KeyboardInterrupt if sig == signal.SIGINT else Stopped
    for _ in range(REPEATS):
        with pytest.raises(raised), _Signals():
            _send(sig)
            pytest.fail("the signal was not raised")
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # put back after the launch


@pytest.mark.parametrize("sig", _Signals.SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_signal_while_the_workers_start_is_raised_once_all_have_started(sig):
    for _ in range(REPEATS):
        started = []
        signals = _Signals()
        with pytest.raises((Stopped, KeyboardInterrupt)) as exc, signals, signals.held():
            _send(sig)
            started.append("every worker")  # not cut short
        assert started == ["every worker"]
        assert getattr(exc.value, "signum", signal.SIGINT) == sig


def test_a_second_signal_cannot_cut_the_stopping_short():
    for _ in range(REPEATS):
        stopped = []
        with pytest.raises(Stopped) as exc, _Signals() as signals:
            try:
                _send(signal.SIGTERM)
            except Stopped:
                with signals.held():
                    _send(signal.SIGINT)
                    _send(signal.SIGHUP)
                    stopped.append("every worker")
                raise
        assert stopped == ["every worker"] and exc.value.signum == signal.SIGTERM
