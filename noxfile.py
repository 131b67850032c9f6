"""Tasks of the mingru monorepo. ``nox`` runs the default sessions; ``nox -l`` lists them all.

Sessions keep their virtual environments under ``.nox`` and reuse them, so a second run installs
nothing new. Packages under test are installed without build isolation (hatchling is installed into
each environment), so no run needs the network once the environments exist.

With ``MINGRU_NOX_DISCARD=1`` each session deletes its environment when it ends, pass or fail, so that the
disk holds one environment at a time (about 2 GB for torch 2.13 with triton, 7 GB for the CUDA build of
torch 2.8) instead of all of them; ``.ci/run`` sets it.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from xml.etree import ElementTree

import nox

nox.needs_version = ">=2024.4.15"
nox.options.reuse_venv = "yes"
nox.options.error_on_external_run = True
nox.options.sessions = ["lint", "typecheck", "tests(torch='2.13.0')", "core_only", "build", "bench_smoke"]

ROOT = Path(__file__).resolve().parent
PACKAGES = {name: ROOT / "packages" / name for name in ("mingru-core", "mingru-triton", "mingru-compile")}
IMPORT_NAMES = {"mingru-core": "mingru", "mingru-triton": "mingru_triton", "mingru-compile": "mingru_compile"}
CORE = PACKAGES["mingru-core"]
DIST = ROOT / "dist"
REPORTS = ROOT / ".nox" / "_reports"

RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"
DEFAULT_TORCH = "2.13.0"
# The Triton release that goes with each supported torch release. CUDA wheels of torch pin it
# themselves (torch 2.8.0 pins triton 3.4.0); CPU wheels bring none, so it is always named here.
# 2.11.0 is the release on the GPU machines the kernels are measured on.
TRITON_FOR_TORCH = {"2.13.0": "triton==3.9.0", "2.11.0": "triton==3.6.0", "2.8.0": "triton==3.4.0"}
# The interpreters of triton 3.4 and 3.6 pass integer kernel arguments as 1-element arrays, which numpy 2.4
# no longer converts to Python ints (any `range()` over a runtime bound fails there); numpy 2.3 works.
NUMPY_FOR_TORCH = {"2.13.0": "numpy", "2.11.0": "numpy<2.4", "2.8.0": "numpy<2.4"}
HATCHLING = "hatchling>=1.24"
DISCARD_ENV = "MINGRU_NOX_DISCARD"
EDITABLE_BUILD_TOOLS = (HATCHLING, "editables")
# pytest-xdist workers of the tests sessions: the interpreter tests are single-threaded Python, so two workers
# on CI's two cores take about 400 s of them instead of 610 (the rest: 80 s instead of 170). At most four, as
# each worker imports torch; ``-- -n 0`` runs in one process.
TEST_WORKERS = ("-n", str(min(4, os.cpu_count() or 1)))
# One thread of torch's CPU kernels per worker, so that the workers do not share the cores with each other's
# thread pools (on CI's two cores the interpreter tests of one file ran 8-17% faster, and in a clean-clone
# run of .ci/run the main tests on torch 2.13.0 took 60 s against 172 s).
TEST_THREADS = {"OMP_NUM_THREADS": "1"} if TEST_WORKERS[1] != "1" else {}

CORE_ONLY_SMOKE = """
import importlib.util
import sys

try:
    import triton
except ImportError:
    pass
else:
    raise SystemExit(f"triton must not be importable here; found {triton.__file__}")
assert importlib.util.find_spec("mingru_triton") is None, "mingru-triton must not be installed here"

import torch
import mingru

assert "mingru.triton_scans" not in sys.modules, "import mingru imported mingru.triton_scans"
layer = mingru.MinGRU(16)
x = torch.randn(2, 7, 16)
y, state = layer(x)
assert y.shape == x.shape, y.shape
y_t, state_t = layer.step(x[:, 0])
assert y_t.shape == (2, 16), y_t.shape
reason = mingru.triton_scans.available()
assert isinstance(reason, str) and "not installed" in reason, reason
assert mingru.triton_scans.SCAN_IMPLS == {}
print("core_only smoke: forward", tuple(y.shape), "step", tuple(y_t.shape), "| triton_scans:", reason)
"""

BUILD_SMOKE = """
import importlib.metadata as metadata

import mingru
import mingru_compile
import mingru_triton

modules = {"mingru-core": mingru, "mingru-triton": mingru_triton, "mingru-compile": mingru_compile}
for dist, module in modules.items():
    assert "site-packages" in module.__file__, f"{module.__name__} imported from {module.__file__}"
    print(dist, metadata.version(dist), "->", module.__file__)
(entry_point,) = metadata.entry_points(group="mingru.backends", name="triton")
assert entry_point.load() is mingru_triton, entry_point
assert mingru.triton_scans.available is mingru_triton.available
print("entry point mingru.backends:triton ->", entry_point.value)
"""


def _discard_after(func: Callable[..., None]) -> Callable[..., None]:
    """Run a session, then delete its virtual environment when ``MINGRU_NOX_DISCARD`` is ``1``."""

    @functools.wraps(func)
    def run(session: nox.Session, **params: str) -> None:
        value = os.environ.get(DISCARD_ENV, "0")
        if value not in ("0", "1"):
            session.error(f"{DISCARD_ENV} must be 0 or 1; got {value!r}")
        try:
            func(session, **params)
        finally:
            location = getattr(session.virtualenv, "location", None)
            if value == "1" and location and Path(location).is_relative_to(ROOT / ".nox"):
                shutil.rmtree(location, ignore_errors=True)
                session.log(f"{DISCARD_ENV}=1: deleted {location}")

    return run


@nox.session
@_discard_after
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
@_discard_after
def typecheck(session: nox.Session) -> None:
    """mypy over the three packages' sources, with the settings of the root pyproject.toml."""
    session.install(MYPY, f"torch=={DEFAULT_TORCH}", "numpy")
    session.run("mypy")


@nox.session
@nox.parametrize("torch", list(TRITON_FOR_TORCH))
@_discard_after
def tests(session: nox.Session, torch: str) -> None:
    """Every package's tests on one torch release (editable installs), then the tests marked ``interpret``.

    The main run unsets TRITON_INTERPRET (compile and fake-tensor tests need the real dispatch); the
    second run sets TRITON_INTERPRET=1 and selects only tests marked ``interpret``: all of them on the
    default torch release; on the others, a cover of each test function's parameters (every value of each
    parameter in at least one of its cases, :func:`_parameter_cover`), about 60% of the cases in about
    half the time: every strategy, dtype and tile the tests name still runs under that release's Triton
    interpreter, and the full cross product runs on the default release. Arguments after ``--`` go to every
    pytest run (paths given there replace the default test folders).
    """
    session.install(f"torch=={torch}", TRITON_FOR_TORCH[torch])
    session.install("pytest", "pytest-xdist", NUMPY_FOR_TORCH[torch], *EDITABLE_BUILD_TOOLS)
    session.install(
        "--no-build-isolation", "--no-deps", *(arg for p in PACKAGES.values() for arg in ("-e", str(p)))
    )
    session.run("python", "-m", "pip", "check")
    session.run(
        "python",
        "-c",
        "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)",
    )
    main: dict[str, str | None] = {"TRITON_INTERPRET": None, **TEST_THREADS}
    _pytest(session, "main", *TEST_WORKERS, "-m", "not interpret", env=main)
    interpret: dict[str, str | None] = {"TRITON_INTERPRET": "1", **TEST_THREADS}
    chosen = () if torch == DEFAULT_TORCH else (f"@{_parameter_cover(session, interpret)}",)
    _pytest(session, "interpret", *TEST_WORKERS, "-m", "interpret", *chosen, env=interpret)


def _parameter_cover(session: nox.Session, env: dict[str, str | None]) -> Path:
    """A pytest arguments file naming, of the tests marked ``interpret``, each test function's cases in
    collection order that bring a parameter value (a dash-separated part of the case's id) not seen in its
    earlier ones: every value of every parameter runs at least once."""
    listing = session.run(
        "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "-m", "interpret", *session.posargs,
        env=env, silent=True,
    )  # fmt: skip
    seen: dict[str, set[str]] = {}
    chosen, total = [], 0
    lines = str(listing).splitlines()
    start = next((i for i, line in enumerate(lines) if "::" in line), len(lines))
    # -q lists the cases one per line, then a blank line and the summary (warnings may name tests too)
    for line in itertools.takewhile(str.strip, lines[start:]):
        total += 1
        item = line.strip()
        function, _, params = item.partition("[")
        values = set(params.removesuffix("]").split("-"))
        covered = seen.setdefault(function, set())
        if not covered or values - covered:
            chosen.append(item)
            covered |= values
    if not chosen:
        session.error(f"no test marked interpret was collected:\n{listing}")
    path = Path(session.create_tmp()) / "interpret-parameter-cover.txt"
    path.write_text("".join(f"{item}\n" for item in chosen))
    session.log(f"interpreter tests: {len(chosen)} of {total} cases cover every parameter value")
    return path


@nox.session
@_discard_after
def compile(session: nox.Session) -> None:
    """The CPU part of mingru-compile (tests marked ``compile``) on torch 2.13.0: full-graph compiles of every
    scan and layer, dynamic sequence lengths, the fake-tensor contract of every op; TRITON_INTERPRET unset
    (opcheck and fake tensors of a triton_op need the real dispatch). CUDA tests skip here; they run with
    ``scripts/gpu_tests.sh``. Arguments after ``--`` go to pytest."""
    session.install(f"torch=={DEFAULT_TORCH}", TRITON_FOR_TORCH[DEFAULT_TORCH])
    session.install("pytest", NUMPY_FOR_TORCH[DEFAULT_TORCH], *EDITABLE_BUILD_TOOLS)
    session.install(
        "--no-build-isolation", "--no-deps", *(arg for p in PACKAGES.values() for arg in ("-e", str(p)))
    )
    session.run("python", "-m", "pip", "check")
    tests = str(PACKAGES["mingru-compile"] / "tests")
    _pytest(session, "compile", tests, "-m", "compile", "--durations=10", env={"TRITON_INTERPRET": None})


@nox.session
@_discard_after
def core_only(session: nox.Session) -> None:
    """mingru-core alone (installed from its folder, not editable) on torch 2.13.0 without triton."""
    session.install(f"torch=={DEFAULT_TORCH}", "pytest", "numpy", HATCHLING)
    session.run("python", "-m", "pip", "uninstall", "--yes", "mingru-compile", "mingru-triton", "triton")
    session.install("--no-build-isolation", "--no-deps", "--force-reinstall", str(CORE))
    session.run("python", "-m", "pip", "check")
    session.run("python", "-c", CORE_ONLY_SMOKE)
    _pytest(session, "core", str(CORE / "tests"), env={"TRITON_INTERPRET": None})


@nox.session
@_discard_after
def build(session: nox.Session) -> None:
    """Wheel and sdist of each package into dist/; the wheels installed (no deps) and smoke-imported."""
    session.install("build", HATCHLING, f"torch=={DEFAULT_TORCH}")
    shutil.rmtree(DIST, ignore_errors=True)
    for package in PACKAGES.values():
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(DIST), str(package))
    wheels = sorted(DIST.glob("*.whl"))
    sdists = sorted(DIST.glob("*.tar.gz"))
    if len(wheels) != len(PACKAGES) or len(sdists) != len(PACKAGES):
        session.error(
            f"expected {len(PACKAGES)} wheels and sdists in dist/; got {[p.name for p in (*wheels, *sdists)]}"
        )
    for dist_name, import_name in IMPORT_NAMES.items():
        wheel = next(w for w in wheels if w.name.startswith(dist_name.replace("-", "_") + "-"))
        with zipfile.ZipFile(wheel) as archive:
            if f"{import_name}/py.typed" not in archive.namelist():
                session.error(f"{wheel.name} lacks {import_name}/py.typed")
    session.install("--no-deps", "--force-reinstall", *map(str, wheels))
    session.run("python", "-c", BUILD_SMOKE)


WHEELS = ROOT / ".whl"
LOST_CHECK = """
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
runs = {row["run"] for row in rows}
lost = [row for row in rows if "device context is lost" in row["status"]]
assert len(rows) == 8 and len(runs) == 1 and len(lost) == 1, (len(rows), runs, len(lost))
assert lost[0]["impl"].startswith("eager") and all(r["status"] == "ok" for r in rows if r["impl"] == "mingru")
assert {row["ours"] for row in rows} == {"0", "1"}, {row["ours"] for row in rows}  # written as ints
print(f"the run went on after the lost device: {len(rows)} rows, run {runs.pop()}")
"""


HOST_CHECK = """
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1], newline="")) if r["status"] == "ok" and r["ms"]]
timed = [r for r in rows if "one timed call" not in r["note"]]
assert timed and all(float(r["host_ms"]) > 0 for r in timed), [r["host_ms"] for r in timed][:5]
print(f"host time per call in {len(timed)} of {len(rows)} timed rows")
"""


@nox.session
@_discard_after
def bench_smoke(session: nox.Session) -> None:
    """The benchmark runner (and its summary rebuilt from its CSV), the launch-configuration sweeps, the
    host-overhead probe, the k = 1 strategy timer and the FAST-flag timer on tiny shapes on the CPU (kernels
    under the Triton interpreter): they run, check results and print their tables. Timings here mean
    nothing; see benchmarks/."""
    torch = DEFAULT_TORCH
    session.install(f"torch=={torch}", TRITON_FOR_TORCH[torch], "numpy", *EDITABLE_BUILD_TOOLS)
    session.install(
        "--no-build-isolation", "--no-deps", *(arg for p in PACKAGES.values() for arg in ("-e", str(p)))
    )
    bench = str(ROOT / "benchmarks" / "bench.py")
    table = Path(session.create_tmp()) / "smoke.csv"
    table.unlink(missing_ok=True)
    pin = ("--cpu", str(min(os.sched_getaffinity(0)))) if hasattr(os, "sched_getaffinity") else ()
    # A CUDA error that leaves the device unusable, simulated at the second measurement (an eager baseline):
    # the run goes on in a new process and its CSV holds every row under one run id.
    lost = Path(session.create_tmp()) / "lost.csv"
    lost.unlink(missing_ok=True)
    runner = [
        ("python", bench, "--smoke", *pin, "--csv", str(table), *session.posargs),
        ("python", "-c", HOST_CHECK, str(table)),
        ("python", bench, "--summary-from", str(table)),
        ("python", bench, "--smoke", "--groups", "seed,diag", "--dtypes", "float32", "--warm", "2"),
        ("python", bench, "--smoke", "--groups", "seed", "--dtypes", "float32", "--eager",
         "--simulate-lost-context", "2", "--csv", str(lost)),
        ("python", "-c", LOST_CHECK, str(lost)),
        ("python", bench, "--summary-from", str(lost)),  # the continued rows read back
    ]  # fmt: skip
    sweep = str(ROOT / "benchmarks" / "sweep.py")
    chunked = str(ROOT / "benchmarks" / "sweep_chunked.py")
    angle = ("python", chunked, "--smoke", "--family", "angle")
    scripts = [
        ("python", sweep, "--smoke", "--family", "linear"),
        ("python", sweep, "--smoke", "--family", "scan", "--modes", "fwd,bwd"),  # the adjoint alone
        ("python", sweep, "--smoke", "--family", "log", "--compile-workers", "2"),  # the worker pool
        ("python", chunked, "--smoke", "--family", "affine", "--compile-workers", "2"),
        (*angle, "--modes", "fwd"),
        (*angle, "--shapes", "1x40x2x4x1", "--pair-tiles", "off,1x1", "--pair-rows", "2"),
        (*angle, "--shapes", "1x40x2x4x1", "--lookback-tiles", "8x2x1"),
        ("python", str(ROOT / "benchmarks" / "overhead.py"), "--smoke"),
        ("python", str(ROOT / "benchmarks" / "strategies.py"), "--smoke"),
        ("python", str(ROOT / "benchmarks" / "layer_memory.py"), "--smoke", "--dtypes", "float32",
         "--autograd-chunks"),
        ("python", str(ROOT / "benchmarks" / "fast_math.py"), "--smoke", "--dtypes", "float32"),
    ]  # fmt: skip
    _side_by_side(session, runner, scripts)


def _side_by_side(session: nox.Session, *lanes: list[tuple[str, ...]]) -> None:
    """Run the lanes of commands at the same time, each lane's in order (on CI's two cores, the runner's
    lane and the other scripts' take about 220 s and 150 s, 370 s one after the other). A command's output
    is printed when it ends; the first failure fails the session once every lane has stopped."""

    def run(lane: list[tuple[str, ...]]) -> None:
        for command in lane:
            output = session.run(*command, silent=True)
            print(output, end="", flush=True)

    with ThreadPoolExecutor(len(lanes)) as pool:
        futures = [pool.submit(run, lane) for lane in lanes]
    for future in futures:
        future.result()


@nox.session
@_discard_after
def gpu_wheels(session: nox.Session) -> None:
    """Build the three wheels into .whl/ for scripts/gpu_tests.sh on a CUDA machine without network."""
    session.install("build", HATCHLING)
    shutil.rmtree(WHEELS, ignore_errors=True)
    for package in PACKAGES.values():
        command = ("python", "-m", "build", "--wheel", "--no-isolation")
        session.run(*command, "--outdir", str(WHEELS), str(package))
    session.log(f"wheels in {WHEELS}; on the CUDA machine run: scripts/gpu_tests.sh")


@nox.session(python=False)
def gpu_tests(session: nox.Session) -> None:
    """On a CUDA machine: the wheels of .whl/ installed into a private folder, then every test that does not
    need the interpreter, CUDA tests included, against the machine's own python, torch and triton."""
    session.run("bash", str(ROOT / "scripts" / "gpu_tests.sh"), *session.posargs, external=True)


@nox.session
@_discard_after
def docs(session: nox.Session) -> None:
    """Build the documentation site with mkdocs --strict into site/."""
    session.install("mkdocs==1.6.1", "mkdocs-material==9.8.2")
    quiet = {"NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about MkDocs 2
    session.run("mkdocs", "build", "--strict", "--site-dir", str(ROOT / "site"), env=quiet)


@nox.session
@_discard_after
def demo(session: nox.Session) -> None:
    """Train a small MinGRU language model with mingru-core alone; arguments after -- go to the script."""
    session.install(f"torch=={DEFAULT_TORCH}", "numpy", *EDITABLE_BUILD_TOOLS)
    session.install("--no-build-isolation", "--no-deps", "-e", str(CORE))
    script = ROOT / "examples" / "train_mingru.py"
    session.run("python", str(script), *(session.posargs or ["--steps", "100"]))


def _pytest(session: nox.Session, label: str, *args: str, env: dict[str, str | None]) -> None:
    """Run pytest with a JUnit report under .nox/_reports; fail when it collected no test."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    report = REPORTS / f"{re.sub(r'[^A-Za-z0-9.]+', '-', session.name).strip('-')}-{label}.xml"
    report.unlink(missing_ok=True)
    command = ["pytest", "-p", "no:cacheprovider", f"--junitxml={report}", *args, *session.posargs]
    # Exit code 5 means "no tests collected"; the report tells that case apart and it is handled below.
    session.run(*command, env=env, success_codes=[0, 5])
    suites = list(ElementTree.parse(report).getroot().iter("testsuite"))
    total, failed, errors, skipped = (
        sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")
    )
    if total == 0:
        session.error(
            f"pytest ({label}) collected no tests with arguments {command[1:]}: "
            "check the paths and the -m/-k filters"
        )
    passed = total - failed - errors - skipped
    session.log(f"pytest ({label}): {passed} passed, {failed + errors} failed, {skipped} skipped")
