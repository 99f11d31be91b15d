"""Every script in examples/ runs to the end (small synthetic data, no network)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))
EXPECT = {"quickstart.py": "ReconEval on", "federated_checkpoints.py": "uninterrupted one: True",
          "tune_on_unseen_users.py": "best:", "implicit_recommend.py": "ndcg@10",
          "offline_ctr.py": "true CTR", "custom_phases.py": "custom phases: ok",
          "custom_estimator.py": "custom estimator: ok",
          "slate_ope.py": "exact CTR of the target"}


def test_every_example_is_listed():
    assert sorted(p.name for p in EXAMPLES) == sorted(EXPECT)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, tmp_path):
    res = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert EXPECT[path.name] in res.stdout
    assert "Traceback" not in res.stderr
