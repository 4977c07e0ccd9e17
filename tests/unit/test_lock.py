"""The locks `make` installs from still say what pyproject.toml asks for.

Dependencies are added in pyproject.toml; `make lock` regenerates requirements/*.txt. A dependency added or
narrowed without `make lock` would otherwise show only as a failed `pip install --require-hashes` on the
next fresh clone (or, worse, a pin outside the range the code was written for).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "requirements" / "runtime.txt"
TEST = ROOT / "requirements" / "test.txt"
FIX = "run `make lock` and commit requirements/ (see README, Dependencies)"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _pins(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = _PIN.match(line)
        if not m:
            continue
        pins[canonicalize_name(m.group(1))] = Version(m.group(2))
        # Every pin carries its hashes: pip's --require-hashes refuses the whole file otherwise.
        following = lines[i + 1] if i + 1 < len(lines) else ""
        assert "--hash=sha256:" in following, f"{path.name}: {m.group(1)} has no hash; {FIX}"
    return pins


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _check(reqs: list[str], pins: dict[str, Version], lock: Path) -> list[str]:
    problems = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue  # not for this platform; the universal lock carries it under a marker
        name = canonicalize_name(req.name)
        if name not in pins:
            problems.append(f"{req.name} is in pyproject.toml but not in {lock.name}")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"pyproject.toml asks for {text}, {lock.name} pins {req.name}=={pins[name]}")
    return problems


def test_the_runtime_lock_satisfies_pyproject():
    project = _project()
    build = project["build-system"]["requires"]
    problems = _check(project["project"]["dependencies"] + build, _pins(RUNTIME), RUNTIME)
    assert not problems, "; ".join(problems) + f": {FIX}"


def test_the_test_lock_satisfies_pyproject_with_the_test_extra():
    project = _project()
    reqs = (project["project"]["dependencies"] + project["project"]["optional-dependencies"]["test"]
            + project["build-system"]["requires"])
    problems = _check(reqs, _pins(TEST), TEST)
    assert not problems, "; ".join(problems) + f": {FIX}"


def test_both_locks_name_the_same_version_of_every_shared_package():
    runtime, test = _pins(RUNTIME), _pins(TEST)
    differ = [f"{n}: runtime {runtime[n]}, test {test[n]}" for n in runtime if n in test and runtime[n] != test[n]]
    assert not differ, "; ".join(differ) + f": {FIX}"
    assert set(runtime) <= set(test), f"only in the runtime lock: {sorted(set(runtime) - set(test))}; {FIX}"


def test_the_build_backend_in_the_lock_is_the_one_pyproject_builds_with():
    # requirements/build.in feeds the lock; pyproject's [build-system] is what pip would use in isolation.
    build_in = [ln.strip() for ln in (ROOT / "requirements" / "build.in").read_text().splitlines()
                if ln.strip() and not ln.lstrip().startswith("#")]
    assert sorted(build_in) == sorted(_project()["build-system"]["requires"])
