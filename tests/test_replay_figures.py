"""The default replay's figures are pinned: a speed-up of the policy or the simulator must not
change any decision (scripts/pin_replay_figures.py writes tests/data/replay_figures_extract.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from pin_replay_figures import MEASURED_PREFIXES, PINNED, default_inputs, differences  # noqa: E402

from rollmux.policies import SCHEDULER_POLICIES  # noqa: E402
from rollmux.sim.simulator import simulate  # noqa: E402

HINT = ("the default replay's figures changed: if a decision changed on purpose, re-pin with "
        "`python scripts/pin_replay_figures.py --write` and say why in the commit; otherwise a speed-up changed a decision")


def test_group_forming_policies_reproduce_the_pinned_default_replay_exactly():
    pinned = json.loads(PINNED.read_text())
    jobs, cluster, cfg = default_inputs()
    res = simulate(jobs, cluster, SCHEDULER_POLICIES, seed=cfg.seed, config=cfg)
    horizon_s = pinned["horizon_h"] * 3600.0  # the common horizon of the full default run (all policies)
    opt = pinned["policies"]["optimal"]["avg_cost_usd_per_h"]
    assert set(SCHEDULER_POLICIES) == {"rollmux", "random", "most-idle"}
    for name in SCHEDULER_POLICIES:
        m = res.runs[name].metrics(horizon_s)
        m["cost_vs_optimal"] = m["avg_cost_usd_per_h"] / opt
        got = {k: v for k, v in m.items() if not k.startswith(MEASURED_PREFIXES)}
        diff = differences(json.loads(json.dumps(got)), pinned["policies"][name], f"/{name}")
        assert not diff, f"{HINT}: {diff[:8]}"
    # the figures a policy cannot change on its own are consistent with the pins
    assert pinned["policies"]["rollmux"]["jobs"] == len(jobs) == 165
    assert pinned["policies"]["rollmux"]["jobs_moved"] > 0  # re-packing is exercised
