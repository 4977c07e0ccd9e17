"""Instructions per small request through coderouterd, counted by valgrind: this tree against a base tree, or
this tree with a team key required against none.

    .venv/bin/python bench/instructions.py --base TREE_OR_REV [-n 300] [--repeats 3]
    .venv/bin/python bench/instructions.py --keys [-n 300] [--repeats 3]

Why count: on the benchmark VM, CPU time and wall-clock latency of one tree move by more than the differences
worth finding (bench/README.md, round 3). An instruction count does not depend on the machine's load.

How. Each daemon runs as a process, `python bench/instructions.py --daemon TREE ...` under
`valgrind --tool=callgrind`: a wrapper that loads a tiny C library (compiled here from valgrind's own
callgrind.h) and runs the tree's unchanged `coderouterd.__main__`. A wrapper thread waits on a pipe and, on
"dump", has valgrind write out its counters (a callgrind client request). A dump's `summary:` is every
instruction the process ran since the previous dump, in every thread (the event loop and the state writer
thread). So start-up and warm-up are never counted: after a warm-up of every scenario, each scenario's window
is dump, N sequential requests, 1.5 s for the last request's record to finish, dump, and the second dump's count
divided by N is the figure. (Callgrind's
ZERO_STATS is not used: it leaves `summary:` counting from the previous dump.) Callgrind's Ir is the same counter as cachegrind's (instructions executed);
callgrind is used because valgrind 3.19 (Debian 12's) has no instrumentation toggle for cachegrind (3.22+), and
running N and 0 requests under cachegrind and subtracting leaves start-up's noise in the difference.

The load generator, the official `openai` and `anthropic` SDKs (sync, one keep-alive connection, no retries),
and the fake upstreams (tests/fakes, loopback) run outside valgrind and are not counted.

Background. The daemon's timers (uvicorn's 0.1 s tick, the 1 s loops of probes, warm saves and the state flush,
the memory sampler) run about 1.2 M instructions a second while idle. Under valgrind a small request takes
~60 ms of wall time instead of ~1 ms, so inside a window that background is ~5% of the count, and it follows the
machine's load (a slower run counts more of it). Idle windows (no requests) before and after the scenarios
measure its rate. The compared figure fits one background rate over every run of both sides (raw = count + rate
x wall time: the same timers on both sides) and subtracts it per run; the idle windows' own rate is printed as a
cross-check (it over-subtracts slow runs: a busy loop's timers fire less often than an idle one's: on this tree
against itself it showed +1.8% and +2.9%, the fit +0.1% and -1.0%), and so is the raw count. The repeats'
spread is what remains of the noise.

--base: another checkout (a directory), or a git revision checked out into a temporary worktree (removed at the
end). --keys: this tree twice, once with no team key (loopback open) and once with one key created by
`corectl --json keys create` (every request then presents it: Bearer for the OpenAI SDK, x-api-key for the
Anthropic SDK).

Needs valgrind and a C compiler: `sudo apt-get install valgrind gcc` (Debian/Ubuntu), `sudo dnf install
valgrind gcc` (Fedora). Not part of `make test`; tests/unit/test_bench_instructions.py checks the parsing only.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

# The client requests, from valgrind's header: the only way to count a window of a process we do not edit.
CLIENT_LIB_C = r"""
#include <valgrind/callgrind.h>
void cr_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
int cr_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
"""

HOW_TO_GET_VALGRIND = ("valgrind is needed: `sudo apt-get install valgrind` (Debian/Ubuntu), `sudo dnf install "
                       "valgrind` (Fedora); with a C compiler (gcc) and valgrind's headers (/usr/include/valgrind, "
                       "in Debian's valgrind package; valgrind-devel on Fedora)")

SCENARIOS = {
    "openai": "OpenAI SDK chat.completions → OpenAI upstream",
    "anthropic": "Anthropic SDK messages → Anthropic upstream (passthrough)",
}


# --------------------------------------------------------------------------------------------- valgrind's output


def parse_summary(text: str) -> dict[str, int]:
    """The totals of one cachegrind or callgrind out file: {event: count}, from its `events:` line and its
    `summary:` line (`totals:` when a file has no summary). Raises ValueError when either is missing."""
    events: list[str] | None = None
    summary: list[str] | None = None
    totals: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split(":", 1)[1].split()
        elif line.startswith("summary:"):
            summary = line.split(":", 1)[1].split()
        elif line.startswith("totals:"):
            totals = line.split(":", 1)[1].split()
    counts = summary if summary is not None else totals
    if events is None or counts is None:
        raise ValueError("not a cachegrind/callgrind out file: no events: or summary: line")
    # A trailing event may be omitted when it is zero (callgrind's compressed form).
    values = [int(v) for v in counts] + [0] * (len(events) - len(counts))
    return dict(zip(events, values, strict=False))


def parse_annotate_ir(text: str) -> int:
    """Ir of the `PROGRAM TOTALS` line of cg_annotate's / callgrind_annotate's text output (digits with commas)."""
    for line in text.splitlines():
        if "PROGRAM TOTALS" in line:
            m = re.match(r"^\s*([\d,]+)", line)
            if m:
                return int(m.group(1).replace(",", ""))
    raise ValueError("no PROGRAM TOTALS line in the annotate output")


def instructions(path: Path) -> int:
    return parse_summary(path.read_text(errors="replace"))["Ir"]


# ------------------------------------------------------------------------------------------------- daemon side


def run_daemon(tree: str, lib: str, ctl_fd: int, ack_fd: int, argv: list[str]) -> int:
    """The tree's coderouterd, unchanged, with a thread that dumps valgrind's counters on request."""
    import ctypes
    import threading

    cg = ctypes.CDLL(lib)
    cg.cr_dump.argtypes = [ctypes.c_char_p]

    def control() -> None:
        with os.fdopen(ctl_fd, "r") as ctl, os.fdopen(ack_fd, "w") as ack:
            for line in ctl:
                cmd, _, arg = line.strip().partition(" ")
                if cmd == "dump":
                    cg.cr_dump(arg.encode())
                ack.write(f"ok {cmd}\n")
                ack.flush()

    threading.Thread(target=control, name="valgrind-control", daemon=True).start()
    # This file's directory is not the tree's: the tree alone is importable, as under `python -m coderouterd`.
    sys.path[0] = tree
    from coderouterd.__main__ import main as daemon_main

    return daemon_main(argv)


# --------------------------------------------------------------------------------------------------- load side


def ensure_tools(tmp: Path) -> Path:
    """The compiled client-request library; exits with how to get what is missing."""
    if not shutil.which("valgrind"):
        sys.exit(HOW_TO_GET_VALGRIND)
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        sys.exit(HOW_TO_GET_VALGRIND)
    src, lib = tmp / "vgclient.c", tmp / "libvgclient.so"
    src.write_text(CLIENT_LIB_C)
    r = subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compiling the client-request library failed:\n{r.stderr}\n{HOW_TO_GET_VALGRIND}")
    return lib


def valgrind_version() -> str:
    return subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()


def resolve_tree(base: str, tmp: Path) -> tuple[Path, str, Path | None]:
    """(directory, label, temporary worktree to remove or None): a directory as is, else a git revision of this
    repository checked out detached into a temporary worktree."""
    p = Path(base)
    if p.is_dir():
        return p.resolve(), f"{p.resolve()} @ {git_rev(p.resolve())}", None
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--short", f"{base}^{{commit}}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"--base {base!r} is neither a directory nor a git revision of {ROOT}")
    wt = tmp / "base-tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), base], check=True,
                   capture_output=True)
    return wt, f"{base} ({r.stdout.strip()})", wt


def git_rev(tree: Path) -> str:
    r = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (r.stdout.strip() or "?") + ("+changes" if dirty else "")


def write_config(tmp: Path, oa_url: str, an_url: str) -> Path:
    cfg = tmp / "instructions.toml"
    cfg.write_text(f"""
[server]
port = 0
[state]
enabled = true
[providers.oa]
kind = "openai"
base_url = "{oa_url}/v1"
model = "bench-model"
[providers.an]
kind = "anthropic"
base_url = "{an_url}/v1"
[profiles.default]
providers = ["oa"]
[profiles.pass]
providers = ["an"]
""")
    return cfg


@dataclass
class Run:
    """One daemon under valgrind: per scenario, instructions per request; and the idle rate."""
    raw: dict[str, float] = field(default_factory=dict)
    wall_per_request: dict[str, float] = field(default_factory=dict)  # the requests alone
    window_s: dict[str, float] = field(default_factory=dict)  # the requests and the settle after them
    n: int = 1
    idle_per_s: float = 0.0

    def net(self, scenario: str) -> float:
        """Instructions per request without the timers' background for the window's wall time."""
        return self.raw[scenario] - self.idle_per_s * self.window_s[scenario] / self.n


class ValgrindDaemon:
    def __init__(self, tree: Path, cfg: Path, lib: Path, work: Path) -> None:
        from bench.common import free_port

        self.tree, self.work = tree, work
        work.mkdir(parents=True)
        (work / "home").mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket = work / "admin" / "a.sock"
        ctl_r, self._ctl_w = os.pipe()
        self._ack_r, ack_w = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CODEROUTER_", "XDG_"))}
        env.update(HOME=str(work / "home"), CODEROUTER_STATE_DIR=str(work / "state"),
                   CODEROUTER_ADMIN__SOCKET=str(self.socket), PYTHONPATH=str(tree), PYTHONHASHSEED="0")
        self.env = env
        cmd = ["valgrind", "--tool=callgrind", "-q", f"--callgrind-out-file={work}/cg.out.%p",
               PY, str(Path(__file__).resolve()), "--daemon", str(tree), str(lib), str(ctl_r), str(ack_w), "--",
               "--config", str(cfg), "--port", str(self.port), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, pass_fds=(ctl_r, ack_w), stdout=subprocess.DEVNULL,
                                     stderr=open(work / "stderr.log", "wb"))  # noqa: SIM115 (closed with the process)
        os.close(ctl_r)
        os.close(ack_w)
        self._ack = os.fdopen(self._ack_r, "r")
        self._dumps = 0

    def wait_ready(self, timeout: float = 900.0) -> None:
        from bench.common import _healthz_ok

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon under valgrind exited: {self.stderr_tail()}")
            if _healthz_ok("127.0.0.1", self.port):
                return
            time.sleep(0.2)
        raise RuntimeError("the daemon under valgrind did not become ready")

    def stderr_tail(self) -> str:
        return (self.work / "stderr.log").read_text(errors="replace")[-2000:]

    def _command(self, line: str) -> None:
        os.write(self._ctl_w, (line + "\n").encode())
        ack = self._ack.readline()
        if not ack.startswith("ok"):
            raise RuntimeError(f"the valgrind control thread did not answer {line!r}: {self.stderr_tail()}")

    def dump(self, label: str) -> int:
        """Instructions of the whole process since the previous dump (or since start)."""
        self._command(f"dump {label}")
        self._dumps += 1
        return instructions(self.work / f"cg.out.{self.proc.pid}.{self._dumps}")

    def stop(self) -> None:
        from bench.common import stop

        os.close(self._ctl_w)
        stop(self.proc)
        self._ack.close()

    def admin_get(self, path: str, timeout: float = 600.0) -> int:
        """GET on the admin socket with valgrind's patience (corectl waits 15 s; the admin app's first answer under
        valgrind loads it, which can take longer). The HTTP status."""
        import http.client
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(str(self.socket))
        conn = http.client.HTTPConnection("coderouterd", timeout=timeout)
        conn.sock = sock
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    def create_key(self) -> str:
        """A team key made through corectl, as an operator would; the secret it prints once."""
        import json

        r = subprocess.run([PY, "-m", "corectl", "--json", "keys", "create", "bench"], cwd=self.tree,
                           env=self.env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"corectl --json keys create failed ({r.returncode}): {r.stderr.strip()[-600:]}")
        return str(json.loads(r.stdout)["key"])


def make_clients(url: str, key: str | None) -> dict[str, object]:
    """scenario -> a callable sending one small request the way each SDK does, on one keep-alive connection."""
    import anthropic
    import openai

    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=key or "unused", max_retries=0, timeout=120)
    an = anthropic.Anthropic(base_url=url, api_key=key or "unused", max_retries=0, timeout=120,
                             default_headers={"x-coderouter-profile": "pass"})

    def send_openai() -> None:
        r = oa.chat.completions.create(model="bench-model", max_tokens=16,
                                       messages=[{"role": "user", "content": "hello"}])
        assert r.choices, r

    def send_anthropic() -> None:
        r = an.messages.create(model="bench-model", max_tokens=16, messages=[{"role": "user", "content": "hello"}])
        assert r.content, r

    return {"openai": send_openai, "anthropic": send_anthropic}


# A request's record is finished after its answer (a 2 ms timer, then the state writer's batch within the 1 s
# flush interval): a window ends this long after its last request, so the last one's tail is in it too, and the
# next window does not start with it.
SETTLE_S = 1.5


def refuse_without_key(url: str) -> None:
    """Keys on means required: a request without the key must get a 401, or the comparison is void."""
    import openai

    try:
        openai.OpenAI(base_url=f"{url}/v1", api_key="not-a-key", max_retries=0, timeout=120).chat.completions.create(
            model="bench-model", max_tokens=16, messages=[{"role": "user", "content": "hello"}])
    except openai.AuthenticationError:
        return
    raise RuntimeError("keys on, yet a request without a key was served")


def measure(d: ValgrindDaemon, scenarios: list[str], n: int, warmup: int, idle_s: float,
            key: str | None) -> Run:
    clients = make_clients(d.url, key)
    if key is not None:
        refuse_without_key(d.url)
    for s in scenarios:  # imports, pools, caches, the first journal rows: not what a request costs
        for _ in range(warmup):
            clients[s]()  # type: ignore[operator]
    time.sleep(SETTLE_S)
    run = Run(n=n)
    idle_ir, idle_wall = idle_window(d, idle_s, "idle-before")
    for s in scenarios:
        d.dump(f"before-{s}")
        t0 = time.monotonic()
        for _ in range(n):
            clients[s]()  # type: ignore[operator]
        run.wall_per_request[s] = (time.monotonic() - t0) / n
        time.sleep(SETTLE_S)
        run.raw[s] = d.dump(s) / n
        run.window_s[s] = time.monotonic() - t0
    ir, wall = idle_window(d, idle_s, "idle-after")
    run.idle_per_s = (idle_ir + ir) / (idle_wall + wall)
    return run


def idle_window(d: ValgrindDaemon, seconds: float, label: str) -> tuple[int, float]:
    """(instructions, wall seconds) of a window in which no request arrives."""
    d.dump(f"before-{label}")
    t0 = time.monotonic()
    time.sleep(seconds)
    return d.dump(label), time.monotonic() - t0


# ------------------------------------------------------------------------------------------------------ report


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    med = statistics.median(values)
    return f"±{(max(values) - min(values)) / 2 / med * 100:.2f}%"


def fmt_m(v: float) -> str:
    return f"{v / 1e6:.4f} M"


def fit_common_background(points: dict[str, list[tuple[float, float]]]) -> tuple[float, dict[str, float]] | None:
    """Least squares over every run of every side: raw = a[side] + b x wall (wall: the window's seconds per
    request). b is the timers' background, common to both sides (the same timers); a[side] is the count at zero
    wall time. None when the runs' wall times do not vary enough to tell b."""
    sxx = sxy = 0.0
    for pts in points.values():
        wm = statistics.fmean(w for w, _ in pts)
        rm = statistics.fmean(r for _, r in pts)
        sxx += sum((w - wm) ** 2 for w, _ in pts)
        sxy += sum((w - wm) * (r - rm) for w, r in pts)
    if sxx <= 1e-9:
        return None
    slope = sxy / sxx
    return slope, {side: statistics.fmean(r for _, r in pts) - slope * statistics.fmean(w for w, _ in pts)
                   for side, pts in points.items()}


def fitted_slopes(runs: dict[str, list[Run]], a: str, b: str, scenarios: list[str]) -> dict[str, float | None]:
    """Per scenario, the background rate fitted over every run of both sides (None: wall times too alike)."""
    out: dict[str, float | None] = {}
    for s in scenarios:
        fit = fit_common_background({side: [(r.window_s[s] / r.n, r.raw[s]) for r in runs[side]] for side in (a, b)})
        out[s] = fit[0] if fit else None
    return out


def compare_rows(runs: dict[str, list[Run]], a: str, b: str, scenarios: list[str],
                 value: Callable[[Run, str], float]) -> list[list[str]]:
    """One row per scenario: the median over runs of each side, the spread of each, B/A and its change."""
    rows = []
    for s in scenarios:
        av = [value(r, s) for r in runs[a]]
        bv = [value(r, s) for r in runs[b]]
        ma, mb = statistics.median(av), statistics.median(bv)
        rows.append([SCENARIOS[s], fmt_m(ma), spread(av), fmt_m(mb), spread(bv), f"{mb / ma:.4f}",
                     f"{(mb / ma - 1) * 100:+.2f}%"])
    return rows


def report(sides: list[tuple[str, str]], runs: dict[str, list[Run]], scenarios: list[str], args: argparse.Namespace,
           vg: str) -> str:
    from bench.common import table

    (a, a_label), (b, b_label) = sides
    header = ["scenario", a, "spread", b, "spread", "ratio", "change"]
    idle = {name: statistics.median([r.idle_per_s for r in rs]) for name, rs in runs.items()}
    wall = {name: statistics.median([w for r in rs for w in r.wall_per_request.values()]) for name, rs in runs.items()}
    slopes = fitted_slopes(runs, a, b, scenarios)

    def fitted(r: Run, s: str) -> float:
        slope = slopes[s]
        return r.net(s) if slope is None else r.raw[s] - slope * r.window_s[s] / r.n

    return "\n".join([
        "instructions per small request, less one background rate fitted over every run of both sides "
        "(raw = count + rate x wall time; rate " + ", ".join(
            f"{s} {'-' if v is None else f'{v / 1e6:.2f} M/s'}" for s, v in slopes.items()) + "):",
        table(compare_rows(runs, a, b, scenarios, fitted), header),
        "",
        "cross-check, less each run's idle rate x its wall time (over-subtracts a slow run: a busy loop's timers "
        "fire less often than an idle one's):",
        table(compare_rows(runs, a, b, scenarios, Run.net), header),
        "",
        "raw (the background of the window's wall time included):",
        table(compare_rows(runs, a, b, scenarios, lambda r, s: r.raw[s]), header),
        "",
        f"{a}: {a_label}",
        f"{b}: {b_label}",
        f"conditions: instructions (valgrind Ir, {vg}, --tool=callgrind, every thread of the daemon process) per "
        f"small non-streaming request, median of {args.repeats} daemon runs per side (alternating sides; spread = "
        f"half the range over the median); per run: {args.warmup} warm-up requests per scenario, then per scenario "
        f"a window of {args.n} sequential requests on one keep-alive connection (official SDKs: openai, "
        f"anthropic; max_tokens 16, \"hello\"), counters dumped before the window and {SETTLE_S:g} s after its last "
        f"request (the record's tail); fake upstreams (tests/fakes) on loopback, outside valgrind; state enabled "
        f"(SQLite); PYTHONHASHSEED=0; Python {sys.version.split()[0]}; wall time per request under valgrind "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in wall.items())
        + f"; idle background ({args.idle:g} s windows before and after the scenarios) "
        + ", ".join(f"{k} {v / 1e6:.2f} M instructions/s" for k, v in idle.items())
        + f"; load average {os.getloadavg()[0]:.2f}",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--base", help="the other tree: a checkout directory, or a git revision (temporary worktree)")
    mode.add_argument("--keys", action="store_true", help="this tree with one team key required vs no key")
    ap.add_argument("-n", type=int, default=300, help="requests per scenario window")
    ap.add_argument("--warmup", type=int, default=30, help="requests per scenario before counting")
    ap.add_argument("--repeats", type=int, default=3, help="daemon runs per side")
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of the idle window")
    ap.add_argument("--scenario", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (valgrind's out files)")
    args = ap.parse_args(argv)
    scenarios = [s for s in args.scenario.split(",") if s]
    if unknown := [s for s in scenarios if s not in SCENARIOS]:
        ap.error(f"unknown scenario {unknown}; known: {', '.join(SCENARIOS)}")

    sys.path.insert(0, str(ROOT))
    from bench.common import start_fake, stop

    # A SIGTERM (timeout, kill) ends the run through the finally below: daemons, fakes and the worktree go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    tmp = Path(tempfile.mkdtemp(prefix="cr-instr-"))
    lib = ensure_tools(tmp)
    vg = valgrind_version()
    worktree: Path | None = None
    fakes: list[subprocess.Popen] = []
    try:
        this = (ROOT, f"{ROOT} @ {git_rev(ROOT)}")
        if args.keys:
            sides = [("keys off", this[1] + ", no team key (loopback open)"),
                     ("keys on", this[1] + ", one team key required and presented")]
            trees = {"keys off": ROOT, "keys on": ROOT}
        else:
            base_tree, base_label, worktree = resolve_tree(args.base, tmp)
            sides = [("base", base_label), ("this tree", this[1])]
            trees = {"base": base_tree, "this tree": ROOT}
        oa, oa_url = start_fake("openai", "ok")
        an, an_url = start_fake("anthropic", "ok")
        fakes += [oa, an]
        cfg = write_config(tmp, oa_url, an_url)
        runs: dict[str, list[Run]] = {name: [] for name, _ in sides}
        for rep in range(args.repeats):
            order = sides if rep % 2 == 0 else list(reversed(sides))
            for name, _ in order:
                d = ValgrindDaemon(trees[name], cfg, lib, tmp / f"run-{rep}-{name.replace(' ', '_')}")
                try:
                    d.wait_ready()
                    if args.keys:  # both sides: the admin app loaded, so only the key differs
                        d.admin_get("/v1/keys")
                    key = d.create_key() if name == "keys on" else None
                    run = measure(d, scenarios, args.n, args.warmup, args.idle, key)
                finally:
                    d.stop()
                runs[name].append(run)
                print(f"repeat {rep + 1}/{args.repeats} {name}: "
                      + ", ".join(f"{s} net {fmt_m(run.net(s))} raw {fmt_m(v)} "
                                  f"({run.wall_per_request[s] * 1000:.0f} ms)" for s, v in run.raw.items())
                      + f"; idle {run.idle_per_s / 1e6:.2f} M/s", flush=True)
        print()
        print(report(sides, runs, scenarios, args, vg))
    finally:
        for p in fakes:
            stop(p)
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--daemon":
        # --daemon TREE LIB CTL_FD ACK_FD -- coderouterd's arguments
        sys.exit(run_daemon(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[7:]))
    sys.exit(main())
