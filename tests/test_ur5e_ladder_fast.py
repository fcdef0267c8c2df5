"""UR5e expert ladder, fast: each degraded checkpoint does measurably worse than the expert.

The full-length version (10 episodes per rung, whole episodes) is `test_ladder_degrades` in
test_ur5e_tasks.py, outside `make test`; this one runs two episodes per rung, cut at CAP steps.
"""

import numpy as np
import pytest

from robot_drivers.experts.ur5e import LADDER
from robot_drivers.registry import expert_ladder, make_task

SEEDS = (7000, 7001)
CAP = 100  # steps; the expert inserts in about 50-60 on these seeds, a failure counts as CAP


def steps_to_success(task, policy, seed: int) -> int:
    """Steps until the task reports success, CAP if it does not within CAP steps."""
    obs = task.reset(seed)
    policy.reset(seed)
    for step in range(1, CAP + 1):
        res = task.step(policy.act(obs))
        obs = res.obs
        if res.success:
            return step
        if res.terminated or res.truncated:
            return CAP
    return CAP


@pytest.mark.slow  # expert episodes on every rung
@pytest.mark.parametrize("name", ["peg", "table_leg"])
def test_every_degraded_rung_is_measurably_worse_than_the_expert(name):
    task = make_task(name, "sim", cameras=())
    try:
        ladder = expert_ladder(task)
        assert [p.name for p in ladder] == [d.name for d in LADDER]
        steps = np.array([[steps_to_success(task, p, s) for s in SEEDS] for p in ladder])
    finally:
        task.close()
    expert, degraded = steps[0], steps[1:]
    assert np.all(expert < CAP), f"{name}: the expert itself failed: {steps.tolist()}"
    # each rung: fewer insertions within CAP, or a quarter more steps on average
    for rung, rung_steps in zip(LADDER[1:], degraded):
        fewer = np.sum(rung_steps < CAP) < np.sum(expert < CAP)
        slower = rung_steps.mean() >= 1.25 * expert.mean()
        assert fewer or slower, f"{name}: {rung.name} not worse than the expert: {steps.tolist()}"
    assert np.all(degraded[-1] == CAP), f"{name}: the worst rung inserted: {steps.tolist()}"
