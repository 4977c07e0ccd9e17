"""`make install` on a machine with neither uv nor pipx: a private venv, the two commands linked into
~/.local/bin, and a report of what it did and whether that directory is on PATH.

Runs the real Makefile target and script with HOME in a temporary directory and a PATH from which uv and
pipx are gone. To stay fast and offline, nothing comes from PyPI: the lock given to the script is empty, the
project is a wheel built from this tree, and the `python3` on that PATH makes its venvs without pip (the
ensurepip step alone took 8-11 s here) and pointed at this venv's packages, pip included, so the script's
own pip steps and the linked commands run. The full install, from the real lock and PyPI, is
test_fallback_installs_the_real_lock_from_pypi (network, opt-in).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = {"uv", "pipx", "corectl", "coderouterd", "python3"}


def _path_without_uv_or_pipx(tmp: Path, real_python: bool = False) -> str:
    """A bin directory with every command of this PATH except uv, pipx and ours, and a python3 (see above)."""
    fake = tmp / "fakebin"
    fake.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d or not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            target = fake / entry.name
            if entry.name in HIDDEN or target.exists() or target.is_symlink():
                continue
            if os.access(entry.path, os.X_OK) and not entry.is_dir():
                target.symlink_to(entry.path)
    # The interpreter behind this venv (not the venv itself, whose packages a venv made from it would not see).
    real = os.path.realpath(sys._base_executable)
    packages = sysconfig.get_paths()["purelib"]
    if real_python:
        (fake / "python3").symlink_to(real)
    else:
        wrapper = fake / "python3"
        wrapper.write_text(f"""#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
    "{real}" -m venv --without-pip "$3" || exit 1
    for site in "$3"/lib/python3*/site-packages; do echo "{packages}" > "$site/deps_from_test_venv.pth"; done
    exit 0
fi
exec "{real}" "$@"
""")
        wrapper.chmod(0o755)
    return str(fake)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds, which the rest of the
    # suite is importing from (and another build of the same tree may be writing) at the same time.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("coderouterd", "corectl"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return next(out.glob("coderouter-*.whl"))


def _make_install(home: Path, path: str, lock: Path, src: Path) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PATH": path, "CODEROUTER_LOCK": str(lock), "CODEROUTER_SRC": str(src),
           "SHELL": "/bin/zsh", "LANG": "C.UTF-8"}
    return subprocess.run(["make", "-s", "--no-print-directory", "install"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_without_uv_or_pipx_it_builds_a_private_venv_and_links_both_commands(tmp_path, wheel):
    home = tmp_path / "home"
    home.mkdir()
    path = _path_without_uv_or_pipx(tmp_path)
    lock = tmp_path / "empty.lock"
    lock.write_text("# the dependencies come from the test's own venv (see the module's docstring)\n")

    first = _make_install(home, path, lock, wheel)
    assert first.returncode == 0, first.stdout + first.stderr
    venv = home / ".local/share/coderouter/venv"
    bin_dir = home / ".local/bin"
    assert f"created the virtual environment {venv}" in first.stdout
    assert f"linked coderouterd corectl into {bin_dir}" in first.stdout
    assert f"{bin_dir} is not on PATH: add this line to ~/.zshrc" in first.stdout
    for cmd in ("coderouterd", "corectl"):
        assert (bin_dir / cmd).is_symlink() and os.readlink(bin_dir / cmd) == str(venv / "bin" / cmd)

    # The linked command runs from its own venv.
    status = subprocess.run([str(bin_dir / "corectl"), "--socket", str(tmp_path / "none.sock"), "status"],
                            env={"HOME": str(home), "PATH": path}, capture_output=True, text=True, timeout=60)
    assert status.returncode == 3, status.stdout + status.stderr  # 3: the daemon is not running

    # Again (after a git pull): the venv is updated in place, and now ~/.local/bin is on PATH.
    again = _make_install(home, f"{bin_dir}{os.pathsep}{path}", lock, wheel)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"updated the virtual environment {venv}" in again.stdout
    assert f"{bin_dir} is on PATH: coderouterd and corectl are ready in every shell." in again.stdout


def test_it_never_replaces_a_command_of_the_users_own(tmp_path, wheel):
    home = tmp_path / "home"
    mine = home / ".local/bin/corectl"
    mine.parent.mkdir(parents=True)
    mine.write_text("#!/bin/sh\necho mine\n")
    lock = tmp_path / "empty.lock"
    lock.write_text("")
    result = _make_install(home, _path_without_uv_or_pipx(tmp_path), lock, wheel)
    assert result.returncode != 0
    assert f"{mine} exists and is not coderouter's link" in result.stderr
    assert mine.read_text() == "#!/bin/sh\necho mine\n"
    assert not (home / ".local/share/coderouter").exists()


@pytest.mark.skipif(not os.environ.get("CODEROUTER_TEST_NETWORK"),
                    reason="installs every locked dependency from PyPI; set CODEROUTER_TEST_NETWORK=1")
def test_fallback_installs_the_real_lock_from_pypi(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    path = _path_without_uv_or_pipx(tmp_path, real_python=True)
    result = _make_install(home, path, ROOT / "requirements/runtime.txt", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    corectl = home / ".local/bin/corectl"
    out = subprocess.run([str(corectl), "--help"], env={"HOME": str(home), "PATH": path},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "status" in out.stdout, out.stdout + out.stderr
