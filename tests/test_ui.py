"""The MLflow UI as its users browse it: a real tiny sweep recorded on an `mlflow server`
(127.0.0.1, a free port), and one on its local store served by the `mlflow ui` it printed,
their printed links opened in headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by selenium): the runs link lands on the classic runs table listing the variants with
their figures as columns, the sweep's link on its run with the summary table in its description.
Screenshots go to the test's folder (printed); with PHASESWEEP_SCREENSHOTS=docs/screenshots
they are also copied there (how the README's images were made). A test run never writes
into the repository otherwise."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, SHRINK

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
NAMES = ["llama_prefill_onnxruntime_cpu", "llama_decode_onnxruntime_cpu"]
SERVER_START_S = 300  # the server's first start creates its tables; on two busy cores it takes minutes
PAGE_S = 120  # the UI's bundle is large; on a loaded machine a page takes tens of seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=5).status == 200
    except OSError:
        return False


@contextmanager
def mlflow_serving(folder: Path, store: str, command: str = "server", *extra: str) -> Iterator[str]:
    """`mlflow server` (or `mlflow ui`) on a sqlite store, on a free port of 127.0.0.1; its address.
    Its process group is killed at the end."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = open(folder / f"{command}.log", "w")  # closed at the end
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", command, "--backend-store-uri", store, *extra,
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],  # fmt: skip
        cwd=folder,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its uvicorn workers join its group: killed together
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # no job runners: a quicker start
    )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not answers(f"{uri}/health"):
            assert proc.poll() is None, (folder / f"{command}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"no /health in {SERVER_START_S}s: " + (folder / f"{command}.log").read_text()[-3000:]
            )
            time.sleep(0.5)  # a poll interval: the loop waits on /health, not on the clock
        yield uri
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on a sqlite store in a folder of its own."""
    folder = tmp_path_factory.mktemp("mlflow_server")
    with mlflow_serving(folder, f"sqlite:///{folder / 'mlflow.db'}", "server", "--default-artifact-root", str(folder / "art")) as uri:
        yield uri


def tiny_sweep(cwd: Path, cache_override: str, *tracking: str) -> dict:
    """A real tiny sweep run in `cwd`; the links it printed: {"run": ..., "runs": ..., "medians": ...}."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "sweep.py"), "-m", "model=llama", "phase=prefill,decode", *SHRINK, cache_override, *tracking],
        cwd=cwd,
        env={**os.environ, "PWD": str(cwd)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "View experiment at" not in out  # MLflow's own link lands on the GenAI overview: suppressed
    assert re.search(r"^progress: 2/2 done, elapsed \d+:\d\d$", out, re.M), out[-3000:]
    links = {}
    for kind, pattern in (("run", r"this sweep's run:\s+(\S+)"), ("runs", r"all runs \(table\):\s+(\S+)")):
        found = re.findall(pattern, out)
        assert len(found) == 2 and found[0] == found[1], out[-3000:]  # at the start and at the end, the same
        links[kind] = found[0]
    assert f"{links['runs'].split('?')[0]}/" in links["run"]
    # each variant's median as the sweep printed it ("measured  NAME  0.343 ms median, ...")
    links["medians"] = {n: float(m) for n, m in re.findall(r"measured\s+(\S+)\s+([\d.]+) ms median", out)}
    assert set(links["medians"]) == set(NAMES), out[-3000:]
    return links


@pytest.fixture(scope="module")
def sweep_links(server, tmp_path_factory, cache_override):
    """The tiny sweep recorded on the server; the links it printed."""
    links = tiny_sweep(tmp_path_factory.mktemp("ui_sweep"), cache_override, "tracking=server", f"tracking.uri={server}")
    assert links["runs"].startswith(f"{server}/#/experiments/")
    return links


@pytest.fixture(scope="module")
def local_links(tmp_path_factory, cache_override):
    """The tiny sweep recorded on its local store (./mlflow.db), then served by the `mlflow ui` it
    printed, on a free port: its links with that port."""
    cwd = tmp_path_factory.mktemp("ui_local")
    links = tiny_sweep(cwd, cache_override)
    assert links["runs"].startswith("http://127.0.0.1:5000/#/experiments/")
    with mlflow_serving(cwd, f"sqlite:///{cwd / 'mlflow.db'}", "ui") as uri:
        yield {k: v.replace("http://127.0.0.1:5000", uri) if isinstance(v, str) else v for k, v in links.items()}


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("headless Chromium is needed: apt-get install -y chromium chromium-driver (.ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1500,950"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(PAGE_S)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Where the screenshots go: the test's folder, and PHASESWEEP_SCREENSHOTS if set."""
    folder = tmp_path_factory.mktemp("screenshots")
    print(f"\nscreenshots: {folder}")
    yield folder
    target = os.environ.get("PHASESWEEP_SCREENSHOTS")
    if target:
        dest = (ROOT / target).resolve()
        dest.mkdir(parents=True, exist_ok=True)
        for png in folder.glob("*.png"):
            shutil.copyfile(png, dest / png.name)


def body_text(driver) -> str:
    from selenium.webdriver.common.by import By

    try:
        return driver.find_element(By.TAG_NAME, "body").text
    except Exception:  # the page is being replaced
        return ""


def wait_for(driver, check, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, PAGE_S, poll_frequency=0.5).until(lambda d: check(d))
    except TimeoutException:
        raise AssertionError(f"{what}; the page showed:\n{body_text(driver)[:3000]}") from None


@pytest.mark.parametrize("store", ["server", "local"])
def test_the_runs_link_opens_the_classic_runs_table_with_the_figures(store, request, browser, shots):
    """The printed link, in a fresh browser: the classic (model training) view, not the GenAI
    one; every variant listed flat, fastest first; the figures as columns without picking them."""
    links = request.getfixturevalue("sweep_links" if store == "server" else "local_links")
    browser.get(links["runs"])
    wait_for(browser, lambda d: all(n in body_text(d) for n in NAMES), f"the variants {NAMES} are not listed")
    wait_for(browser, lambda d: "tokens_per_s" in body_text(d), "the runs table shows no metric columns")
    text = body_text(browser)
    assert "/runs" in browser.current_url and "overview" not in browser.current_url  # not the GenAI overview
    assert "Model registry" in text and "Observability" not in text  # the classic side bar, not the GenAI one
    assert "matching runs" in text and "Sort: latency_ms_median" in text  # the runs table, sorted by a metric
    for column in ("latency_ms_median", "tokens_per_s", "parity_max_abs_diff", "status"):
        assert column in text, column
    fastest_first = sorted(NAMES, key=links["medians"].get)  # as measured (tiny shapes: either may win)
    assert text.index(fastest_first[0]) < text.index(fastest_first[1]), links["medians"]
    browser.save_screenshot(str(shots / ("mlflow_runs.png" if store == "server" else "mlflow_runs_local.png")))


@pytest.mark.parametrize("store", ["server", "local"])
def test_the_sweep_link_shows_the_summary_table_and_the_plots(store, request, browser, shots):
    from selenium.webdriver.common.by import By

    links = request.getfixturevalue("sweep_links" if store == "server" else "local_links")
    browser.get(links["run"])
    wait_for(
        browser, lambda d: "Description" in body_text(d) and "sweep_" in body_text(d), "the sweep's run did not open"
    )
    more = browser.find_elements(By.XPATH, "//*[normalize-space(text())='Show more']")
    if more:  # the description is folded after a few lines
        browser.execute_script("arguments[0].click();", more[0])

    def summary_table(d):
        for table in d.find_elements(By.TAG_NAME, "table"):
            text = table.text
            if "median_ms" in text and all(n in text for n in NAMES):
                return table
        return None

    table = wait_for(browser, summary_table, "no summary table with the variants in the run's description")
    assert "parity_max_diff" in table.text and "status" in table.text

    def plots_shown(d):  # the plots below the table, each loaded from the run's artifacts
        images = [i for i in d.find_elements(By.TAG_NAME, "img") if "get-artifact?path=" in (i.get_attribute("src") or "")]
        loaded = [i for i in images if d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", i)]
        return loaded if loaded and len(loaded) == len(images) else None

    shown = wait_for(browser, plots_shown, "no plot shown in the run's description")
    assert any("latency.png" in i.get_attribute("src") for i in shown)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", table)
    browser.save_screenshot(str(shots / ("mlflow_sweep_run.png" if store == "server" else "mlflow_sweep_run_local.png")))
