"""tuning.utils.graceful_stop: real signals stop real training at a step boundary; the stop agreement costs one
all-reduce per step for both stopping callbacks on two real gloo ranks (torchrun)."""

import json
import signal
import subprocess

import pytest
from transformers import TrainerControl

from tests.helpers.graceful_stop import SignalAtStep, tiny_trainer
from tests.helpers.training import TORCHRUN, run_python, two_ranks
from tuning.utils.error_logging import TrainingInterrupted, build_error_report, last_global_step
from tuning.utils.graceful_stop import GracefulStopCallback, StopAgreement, Vote


@pytest.mark.parametrize("save_at_stop", [True, False])
def test_sigterm_stops_training_at_the_step_boundary(tmp_path, save_at_stop):
    before = signal.getsignal(signal.SIGTERM)
    stop = GracefulStopCallback(save_at_stop=save_at_stop)
    trainer = tiny_trainer(tmp_path, [SignalAtStep(2, signal.SIGTERM), stop])  # checkpoints due at 3, 6...
    trainer.train()
    assert trainer.state.global_step == 2
    assert stop.received_signal == signal.SIGTERM
    assert last_global_step() == 2
    assert sorted(path.name for path in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-2"] * save_at_stop
    assert signal.getsignal(signal.SIGTERM) == stop._handle  # kept past train end, while the report is due
    stop.restore_signal_handlers()
    assert signal.getsignal(signal.SIGTERM) is before
    report = build_error_report(TrainingInterrupted(stop.received_signal), global_step=last_global_step())
    assert (report["category"], report["exit_code"], report["global_step"]) == ("interrupted", 143, 2)


def test_second_sigint_falls_back_to_keyboard_interrupt(tmp_path):
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever ran in this process
    try:
        stop = GracefulStopCallback()
        trainer = tiny_trainer(tmp_path, [SignalAtStep(2, signal.SIGINT, signal.SIGINT), stop])
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


# Two runs in one process, in the order a process can survive them: a SIGTERM after the agreed stop (as torchrun sends
# it to every worker once one has exited) must not cut the error report short; then, handlers restored to those found
# at train begin, a fresh callback's second SIGTERM falls back to the default action, which ends the process.
SIGTERM_AFTER_THE_STOP_THEN_A_SECOND_SIGTERM_SCRIPT = """
import os, pathlib, signal, sys
from tests.helpers.graceful_stop import SignalAtStep, tiny_trainer
from tuning.utils.graceful_stop import GracefulStopCallback
tmp = pathlib.Path(sys.argv[1])
stop = GracefulStopCallback()
trainer = tiny_trainer(tmp / "reporting", [SignalAtStep(2, signal.SIGTERM), stop])
trainer.train()
os.kill(os.getpid(), signal.SIGTERM)  # as torchrun sends it to every worker once one has exited
print("survived", trainer.state.global_step, flush=True)
stop.restore_signal_handlers()
print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
callbacks = [SignalAtStep(2, signal.SIGTERM, signal.SIGTERM), GracefulStopCallback()]
tiny_trainer(tmp / "second", callbacks).train()
print("survived the second SIGTERM")
"""


@pytest.fixture(scope="module")
def sigtermed_twice(tmp_path_factory) -> subprocess.CompletedProcess:
    """The script above in its own Python process: a signal that kills it must not kill pytest."""
    tmp = tmp_path_factory.mktemp("sigtermed-twice")
    return run_python("-c", SIGTERM_AFTER_THE_STOP_THEN_A_SECOND_SIGTERM_SCRIPT, str(tmp), timeout=180)


@pytest.mark.slow
def test_sigterm_after_the_agreed_stop_does_not_cut_the_report_short(sigtermed_twice):
    """The lines printed after that SIGTERM: the process lived on, its handlers then put back (how the process ends,
    in the second run: the next test's)."""
    ours = [line for line in sigtermed_twice.stdout.splitlines() if line.startswith(("survived", "restored"))]
    assert ours[:2] == ["survived 2", "restored True"], sigtermed_twice.stderr[-2000:]


@pytest.mark.slow
def test_second_sigterm_falls_back_to_the_default_action(sigtermed_twice):
    """After the first run's lines (the test above), the second run's second SIGTERM ended the process."""
    ours = [line for line in sigtermed_twice.stdout.splitlines() if line.startswith(("survived", "restored"))]
    assert ours == ["survived 2", "restored True"], sigtermed_twice.stderr[-2000:]
    assert sigtermed_twice.returncode == -signal.SIGTERM, sigtermed_twice.stderr[-2000:]


def test_agreement_decides_once_every_joined_callback_has_voted():
    """In one process: no decision until the step's last vote, whichever kind votes first; then every handler."""
    agreed = []
    agreement = StopAgreement()
    agreement.join(Vote.SIGNAL, lambda value, control: agreed.append(("signal", value)))
    agreement.join(Vote.STOP_REASON, lambda value, control: agreed.append(("reason", value)))
    control = TrainerControl()
    agreement.vote(Vote.STOP_REASON, 2, control)
    assert agreed == []
    agreement.vote(Vote.SIGNAL, 0, control)
    assert agreed == [("signal", 0), ("reason", 2)]
    agreement.vote(Vote.SIGNAL, signal.SIGTERM, control)
    agreement.vote(Vote.STOP_REASON, 0, control)
    assert agreed[2:] == [("signal", signal.SIGTERM), ("reason", 0)]


# Under torchrun, two gloo ranks, both stopping callbacks sharing one agreement: rank 1 alone has a stop rule that
# fires at step 3 (the graceful stop voting first). The script's own wrapper of dist.all_reduce counts the MAX
# all-reduces (the stop agreement's op) between consecutive step ends. (Rank 1 alone SIGTERMed, the callbacks in
# bench_train's order: test_bench_train::test_sigterm_to_one_rank_stops_both_after_the_same_step counts the same.)
TWO_RANK_SCRIPT = """
import json, os, pathlib, sys
import torch.distributed as dist
from transformers import TrainerCallback
from tests.helpers.graceful_stop import tiny_trainer
from tuning.benchmarking.callback import BenchmarkCallback
from tuning.benchmarking.stopping import StopRule
from tuning.utils.graceful_stop import GracefulStopCallback, StopAgreement

out = pathlib.Path(sys.argv[1])
rank = int(os.environ["RANK"])
max_reduces = [0]
all_reduce = dist.all_reduce

def counting_all_reduce(tensor, op=dist.ReduceOp.SUM, *args, **kwargs):
    if op == dist.ReduceOp.MAX:
        max_reduces[0] += 1
    return all_reduce(tensor, op, *args, **kwargs)

dist.all_reduce = counting_all_reduce

class CountPerStep(TrainerCallback):
    per_step = []

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(max_reduces[0])
        max_reduces[0] = 0

agreement = StopAgreement()
graceful = GracefulStopCallback(agreement)
if rank == 1:  # settled (any tolerance) once 2 steps are measured after a 1-step warmup
    rule = StopRule(auto_stop=True, min_steps=2, min_seconds=0, tolerance=1e9)
else:
    rule = StopRule(stop_after_seconds=3600)
bench = BenchmarkCallback(None, rule, warmup_steps=1, stop_agreement=agreement)
trainer = tiny_trainer(out / f"rank{rank}", [graceful, bench, CountPerStep()])
trainer.train()
result = {
    "step": trainer.state.global_step,
    "received_signal": graceful.received_signal,
    "stop_reason": bench.stop_reason,
    "max_reduces_per_step": CountPerStep.per_step,
}
(out / f"rank{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
# This bare script's interpreter teardown can abort in torch's C++ threads ("terminate called without an active
# exception") once the group is gone: what it measured is written, so it ends here.
os._exit(0)
"""


@pytest.mark.slow
def test_two_ranks_stop_after_the_same_step_with_one_all_reduce_per_step(tmp_path):
    """Rank 1's stop rule alone fires: both ranks stop after step 3, rank 0 with rank 1's reason."""
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANK_SCRIPT)
    result = run_python(*TORCHRUN, *two_ranks(script, [str(tmp_path)]), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        ended = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert ended == {
            "step": 3,
            "received_signal": None,
            "stop_reason": "auto_stop",
            "max_reduces_per_step": [1, 1, 1],
        }, rank
