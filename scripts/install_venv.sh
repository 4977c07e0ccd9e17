#!/usr/bin/env bash
# `make install` without uv or pipx (a fresh Mac often has neither): coderouter in a private virtual
# environment of its own, its two commands linked into ~/.local/bin, the same layout pipx uses.
#
#   venv:  ${XDG_DATA_HOME:-~/.local/share}/coderouter/venv   (dependencies from the hashed lock)
#   links: ~/.local/bin/coderouterd, ~/.local/bin/corectl
#
# Run it again after a `git pull`: the venv is updated in place (a venv cannot be moved once built: its
# scripts name their interpreter by absolute path, so it is not built elsewhere and swapped in).
# Overrides, for tests: PY (the interpreter), CODEROUTER_LOCK (the lock), CODEROUTER_SRC (a directory or wheel).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
py="${PY:-python3}"
lock="${CODEROUTER_LOCK:-$here/requirements/runtime.txt}"
src="${CODEROUTER_SRC:-$here}"
venv="${XDG_DATA_HOME:-$HOME/.local/share}/coderouter/venv"
bin_dir="$HOME/.local/bin"
commands=(coderouterd corectl)

if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "make install needs Python 3.11 or newer as '$py' (found: $("$py" --version 2>&1 || echo none))." >&2
    echo "Install one (python.org, Homebrew: brew install python@3.12) or name it: make install PY=python3.12" >&2
    exit 1
fi

echo "neither uv nor pipx found: installing coderouter into a private virtual environment"

# A link we would replace must be ours (or dangling); anything else on that path belongs to the user.
for cmd in "${commands[@]}"; do
    link="$bin_dir/$cmd"
    if [ -e "$link" ] || [ -L "$link" ]; then
        if [ ! -L "$link" ] || { [ -e "$link" ] && [ "$(readlink "$link")" != "$venv/bin/$cmd" ]; }; then
            echo "$link exists and is not coderouter's link into $venv; move it away and run make install again." >&2
            exit 1
        fi
    fi
done

# A venv whose interpreter is gone or too old (Python upgraded or removed since) is built anew.
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    action="updated"
else
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv"
    action="created"
fi
# Exact versions, every file checked against the lock's sha256; then the project itself, built by the
# locked setuptools (no build isolation: nothing unpinned is fetched) and without touching the dependencies.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes -r "$lock"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$src"

mkdir -p "$bin_dir"
for cmd in "${commands[@]}"; do
    ln -sfn "$venv/bin/$cmd" "$bin_dir/$cmd"
done

version="$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("coderouter"))')"
echo "coderouter $version: $action the virtual environment $venv"
echo "linked ${commands[*]} into $bin_dir"
case ":$PATH:" in
    *":$bin_dir:"*)
        found="$(command -v corectl || true)"
        if [ "$found" != "$bin_dir/corectl" ]; then
            echo "$bin_dir is on PATH, but 'corectl' runs $found (earlier on PATH); remove that one or put $bin_dir first."
        else
            echo "$bin_dir is on PATH: coderouterd and corectl are ready in every shell."
        fi
        ;;
    *)
        case "${SHELL:-}" in
            */zsh) rc="~/.zshrc" ;;
            */bash) rc="~/.bashrc" ;;
            *) rc="your shell's start-up file" ;;
        esac
        echo "$bin_dir is not on PATH: add this line to $rc, then open a new shell:"
        echo "    export PATH=\"\$HOME/.local/bin:\$PATH\""
        ;;
esac
echo "To remove it: rm -r $venv $bin_dir/coderouterd $bin_dir/corectl"
