"""``jobkeeper verify``: the chaos check a user runs against their own
deployment (its own queue and task, workers it starts, kills, pauses and
restarts, the history checker, a verdict, and a clean-up).
"""

from jobkeeper.verify.run import BadInput, Verdict, VerifyConfig, preflight, run_verify

__all__ = ["BadInput", "Verdict", "VerifyConfig", "preflight", "run_verify"]
