"""Code run by this interpreter in a fresh process (nothing the test run imported is loaded
there), from the checkout's root: what it printed, or what it loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping

from tests.support.checkout import ROOT


def run_python(code: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -c CODE`` (with ``env`` for its environment, if given); its output as text."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def modules_loaded_by(modules: str) -> set[str]:
    """Every module a fresh interpreter holds after ``import MODULES`` (one, or several
    separated by commas)."""
    result = run_python(f"import json, sys, {modules}\nprint(json.dumps(sorted(sys.modules)))")
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))
