"""The dashboard in a real headless Chromium (Debian's /usr/bin/chromium through Playwright).

A coordinator serves HTTP on port 0; a job's nodes are real NodeClients in threads. The
page loads with ``?token=``, shows the running job's nodes by role, and when one node
reports failure it shows FAILED and the node's error without being reloaded. The page
must log no console error (a Content-Security-Policy violation would be one) and never
show the token.

The training monitor runs a real two-node job through the local engine (each node
``python -m tfcoord.node`` supervising a command that reports figures and prints): its
charts grow while the job runs, its logs, CPU and memory show, and the stop button, for
the admin token only and after a confirmation, stops it. Every wait is on the page's DOM
or the coordinator's watch, never a fixed sleep.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tfcoord.client import DriverClient, JobSpec, NodeClient, make_roles
from tfcoord.coordinator.embedded import EmbeddedCoordinator
from tfcoord.driver.local import run_local

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the test extra)"
)

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = b"dashboard-token-" + b"z" * 32
ADMIN_TOKEN = b"dashboard-admin-" + b"a" * 32
#: The page polls every second; allow a few polls on a loaded machine.
UPDATE_WAIT_MS = 15_000
TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 42, in step\nValueError: loss is NaN'


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium; .ci/run does)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def served() -> Iterator[tuple[EmbeddedCoordinator, str]]:
    coord = EmbeddedCoordinator(plaintext=True).start()
    try:
        yield coord, f"http://127.0.0.1:{coord.start_http(TOKEN, admin_token=ADMIN_TOKEN)}"
    finally:
        coord.stop()


def _node(coord: EmbeddedCoordinator, token: bytes, job: str, executor_id: int, fail: threading.Event) -> str:
    """One node: register, heartbeat, run; executor 2 fails when told, the others stop when told."""
    with NodeClient(coord.address, token, job, executor_id).connect() as n:
        meta = {"tensorboard_url": "http://127.0.0.1:6006/"} if executor_id == 1 else {}
        gpus = [f"GPU-{executor_id}-0000"] if executor_id else []
        n.register("127.0.0.1", 7500 + executor_id, gpus=gpus, task_id=f"task-{executor_id}", meta=meta)
        n.start_heartbeats(0.2)
        n.await_cluster(30)
        n.report("running")
        if executor_id == 2:
            assert fail.wait(120)
            n.report("failed", error=TRACEBACK)
            return "failed"
        assert n.stop_event.wait(120), "never told to stop"
        n.report("stopped")
        return "stopped"


def _await(driver: DriverClient, job: str, done: Callable[[dict], bool], timeout_s: float = 30) -> None:
    """Follow the job by push (watch) until ``done(status)``."""
    deadline = time.monotonic() + timeout_s
    status = driver.status(job)
    while not done(status):
        assert time.monotonic() < deadline, f"job {job} is {status['state']} at the deadline"
        status = driver.watch(job, status["version"], max(0.1, deadline - time.monotonic()))


def test_dashboard_shows_running_nodes_then_the_failure_live(browser, served, background, tmp_path):
    expect = playwright_api.expect
    coord, base = served
    fail = threading.Event()
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2, 1), name="dashboard-demo"))
        for i in range(2):  # the last worker comes later
            background.start(_node, coord, d.job_token(job), job, i, fail)
        _await(d, job, lambda st: st["registered"] == 2)

        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            page.goto(f"{base}/?token={TOKEN.decode()}")
            assert "token" not in page.url  # taken into sessionStorage and out of the address bar

            expect(page.locator("#job-id")).to_have_text(job, timeout=UPDATE_WAIT_MS)
            expect(page.locator("#reservation")).to_contain_text("Registered 2/3")
            expect(page.locator("#missing")).to_have_text("worker:1 (executor 2): never registered")
            expect(page.locator('[data-node="worker:0"] .state')).to_have_text("REGISTERED")
            page.evaluate("window.__notReloaded = true")

            background.start(_node, coord, d.job_token(job), job, 2, fail)
            for name in ("ps:0", "worker:0", "worker:1"):
                expect(page.locator(f'[data-node="{name}"] .state')).to_have_text(
                    "RUNNING", timeout=UPDATE_WAIT_MS
                )
            expect(page.locator(f'tr[data-job="{job}"] .state')).to_have_text("RUNNING")
            expect(page.locator("#reservation")).to_contain_text("Registered 3/3")
            expect(page.locator('[data-role="worker"] .title')).to_contain_text("2/2")
            link = page.locator('[data-node="worker:0"] a')
            expect(link).to_have_attribute("href", "http://127.0.0.1:6006/")
            expect(link).to_have_attribute("rel", "noopener noreferrer")
            expect(page.locator('[data-node="worker:1"]')).to_contain_text("GPU-2-0000")
            expect(page.locator("#missing")).to_have_count(0)

            fail.set()
            failed = page.locator('[data-node="worker:1"] .state')
            expect(failed).to_have_text("FAILED", timeout=UPDATE_WAIT_MS)
            expect(page.locator('[data-node="worker:1"] td.err summary')).to_have_text(
                "ValueError: loss is NaN"
            )
            expect(page.locator(".jobhead .state")).to_have_text("FAILED", timeout=UPDATE_WAIT_MS)
            expect(page.locator("#job-error")).to_contain_text("ValueError: loss is NaN")
            expect(page.locator("#timeline")).to_contain_text("worker:1 FAILED")
            for name in ("ps:0", "worker:0"):  # told to stop by push, they acknowledged
                expect(page.locator(f'[data-node="{name}"] .state')).to_have_text(
                    "STOPPED", timeout=UPDATE_WAIT_MS
                )
            assert page.evaluate("window.__notReloaded") is True

            page.locator('[data-node="worker:1"] td.err summary').click()
            expect(page.locator('[data-node="worker:1"] td.err pre')).to_contain_text(
                'File "train.py", line 42'
            )
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            assert TOKEN.decode() not in page.content()
            assert errors == []
        finally:
            page.close()
        assert sorted(background.results()) == ["failed", "stopped", "stopped"]


def test_dashboard_without_a_valid_token_asks_for_one_and_shows_no_data(browser, served):
    expect = playwright_api.expect
    coord, base = served
    with DriverClient(coord.address, coord.secret) as d:
        d.submit(JobSpec(roles=make_roles(1), name="secret-project"))
    page = browser.new_page()
    try:
        page.goto(f"{base}/dashboard?token=wrong-token-{'w' * 32}")
        expect(page.locator("#login")).to_be_visible(timeout=UPDATE_WAIT_MS)
        expect(page.locator("#login-why")).to_contain_text("refused the token")
        assert "secret-project" not in page.content()
        page.fill("#token-input", TOKEN.decode())
        page.click("#login-form button")
        expect(page.locator(".jobhead")).to_contain_text("secret-project", timeout=UPDATE_WAIT_MS)
        expect(page.locator("#token-input")).to_have_value("")
    finally:
        page.close()


def test_a_malformed_job_link_shows_the_jobs_list_instead_of_a_blank_page(browser, served):
    """``#job=%E0`` is no valid percent-encoding: the page ignores it, whether it was there at
    load or typed in later, and a valid link still selects its job."""
    expect = playwright_api.expect
    coord, base = served
    with DriverClient(coord.address, coord.secret) as d:
        first = d.submit(JobSpec(roles=make_roles(1), name="first-job"))
        second = d.submit(JobSpec(roles=make_roles(1), name="second-job"))
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{base}/?token={TOKEN.decode()}#job=%E0")
        expect(page.locator(f'tr[data-job="{first}"]')).to_be_visible(timeout=UPDATE_WAIT_MS)
        expect(page.locator(f'tr[data-job="{second}"]')).to_be_visible()
        expect(page.locator("#job-id")).to_have_text(second)  # the newest live job, as with no hash
        page.evaluate("location.hash = '#job=%E0%A4'")
        page.evaluate(f"location.hash = '#job={first}'")
        expect(page.locator("#job-id")).to_have_text(first, timeout=UPDATE_WAIT_MS)
        assert errors == []
    finally:
        page.close()


#: Each node's work: report a step and a falling loss, print a line, a few times a second,
#: until stopped. The pace is the workload's own; the test waits on what the page shows.
TRAINER = """
import os, time
from tfcoord.node.reporting import report
name = os.environ["TFCOORD_ROLE"] + ":" + os.environ["TFCOORD_TASK_INDEX"]
step = 0
while True:
    step += 1
    report(step=step, loss=1.0 / step, examples_per_s=100.0 + step)
    print(f"{name} finished step {step}", flush=True)
    time.sleep(0.1)
"""


def _points(page, figure: str) -> int:
    return int(page.locator(f'figure[data-figure="{figure}"]').get_attribute("data-points") or 0)


def _post_stop(base: str, token: str, job: str) -> int:
    """The HTTP status a stop request gets with ``token`` as its bearer ("" for none)."""
    req = urllib.request.Request(f"{base}/v1/jobs/{job}/stop", method="POST", data=b"")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_dashboard_monitors_a_real_two_node_job_and_an_admin_stops_it(browser, served, background):
    expect = playwright_api.expect
    coord, base = served
    spec = JobSpec(
        roles=make_roles(2), name="monitor-demo", labels={"spark_ui_url": "http://127.0.0.1:4040/"}
    )
    with DriverClient(coord.address, coord.secret) as d:  # one client: a driver sees its own jobs
        # The job id is the driver's to choose, so the page and the watch know it up front;
        # run_local says when it has submitted (its first line).
        job, submitted = "monitor-demo-1", threading.Event()
        background.start(
            lambda: run_local(
                d,
                spec,
                [sys.executable, "-c", TRAINER],
                emit=lambda line: submitted.set(),
                out=io.BytesIO(),
                job=job,
            )
        )
        assert submitted.wait(30)
        _await(d, job, lambda st: st.running == 2, timeout_s=60)

        viewer = browser.new_page(viewport={"width": 1400, "height": 900})
        admin = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        for page in (viewer, admin):
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            # -- a viewer sees everything but cannot stop -----------------------------------
            viewer.goto(f"{base}/?token={TOKEN.decode()}#job={job}")
            expect(viewer.locator("#job-id")).to_have_text(job, timeout=UPDATE_WAIT_MS)
            expect(viewer.locator('figure[data-figure="loss"]')).to_be_visible(timeout=UPDATE_WAIT_MS)
            expect(viewer.locator("#stop-job")).to_be_hidden()
            assert _post_stop(base, TOKEN.decode(), job) == 403  # the viewing token may look, not act
            assert _post_stop(base, "", job) == 401

            # -- the admin's page: charts grow while the job runs -------------------------------
            admin.goto(f"{base}/?token={ADMIN_TOKEN.decode()}#job={job}")
            expect(admin.locator(".jobhead .state")).to_have_text("RUNNING", timeout=UPDATE_WAIT_MS)
            for figure in ("step", "loss", "examples_per_s"):
                expect(admin.locator(f'figure[data-figure="{figure}"]')).to_be_visible(timeout=UPDATE_WAIT_MS)
            chart = admin.locator('figure[data-figure="step"]')
            expect(chart.locator("polyline")).to_have_count(2)  # one line per node
            expect(chart.locator('polyline[data-node="worker:0"]')).to_have_count(1)
            expect(chart.locator('polyline[data-node="worker:1"]')).to_have_count(1)
            before = _points(admin, "step")
            admin.wait_for_function(
                "n => Number(document.querySelector('figure[data-figure=\"step\"]').dataset.points) > n",
                arg=before,
                timeout=UPDATE_WAIT_MS,
            )
            assert _points(admin, "step") > before
            # Per node: its latest figures, CPU and memory (measured by its supervisor).
            for name in ("worker:0", "worker:1"):
                row = admin.locator(f'[data-node="{name}"]')
                expect(row.locator(".figures")).to_contain_text("step=", timeout=UPDATE_WAIT_MS)
                expect(row.locator(".mem")).to_have_text(
                    re.compile(r"^\d+(\.\d)? (KiB|MiB|GiB)$"), timeout=UPDATE_WAIT_MS
                )
                expect(row.locator(".cpu")).to_have_text(re.compile(r"^\d+ %$"), timeout=UPDATE_WAIT_MS)
            expect(admin.locator("#spark-ui-link")).to_have_attribute("href", "http://127.0.0.1:4040/")
            expect(admin.locator("#spark-ui-link")).to_have_attribute("rel", "noopener noreferrer")

            # -- logs: every node's, then one node's --------------------------------------------
            logs = admin.locator("#logs")
            expect(logs).to_contain_text("[worker:0 stdout] worker:0 finished step", timeout=UPDATE_WAIT_MS)
            expect(logs).to_contain_text("[worker:1 stdout] worker:1 finished step", timeout=UPDATE_WAIT_MS)
            admin.select_option("#log-node", label="worker:1")
            expect(logs).to_contain_text("worker:1 finished step", timeout=UPDATE_WAIT_MS)
            expect(logs).not_to_contain_text("worker:0 finished step")

            # -- stop: a cancelled confirmation stops nothing; a confirmed one stops the job ----
            admin.click("#stop-job")
            expect(admin.locator("#stop-dialog")).to_be_visible()
            expect(admin.locator("#stop-job-id")).to_have_text(job)
            admin.click("#stop-cancel")
            expect(admin.locator("#stop-dialog")).to_be_hidden()
            assert d.status(job)["state"] == "RUNNING"
            admin.click("#stop-job")
            admin.click("#stop-confirm")
            expect(admin.locator(".jobhead .state")).to_have_text("STOPPED", timeout=UPDATE_WAIT_MS)
            expect(admin.locator("#stop-job")).to_be_hidden()
            expect(viewer.locator(".jobhead .state")).to_have_text("STOPPED", timeout=UPDATE_WAIT_MS)
            status = d.status(job)
            assert status["stop_reason"] == "stopped from the dashboard"
            assert TOKEN.decode() not in viewer.content() and ADMIN_TOKEN.decode() not in admin.content()
            assert errors == []
        finally:
            viewer.close()
            admin.close()
    [final] = background.results(timeout_s=90)
    assert final.state == "STOPPED"


def test_the_dashboard_shows_a_restarted_jobs_generation_and_each_cause(browser, served):
    """A node killed by a signal in a job with ``max_restarts``: the job's page says which
    generation runs and what caused the restart."""
    expect = playwright_api.expect
    coord, base = served
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(JobSpec(roles=make_roles(2), name="restarting", max_restarts=1))
        nodes = [NodeClient(coord.address, d.job_token(job), job, i).connect() for i in range(2)]
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            for i, n in enumerate(nodes):
                n.register("127.0.0.1", 7200 + i)
            for n in nodes:
                n.await_cluster(10)
                n.report("RUNNING")
            page.goto(f"{base}/?token={TOKEN.decode()}#job={job}")
            expect(page.locator("#restarts")).to_have_text(
                "generation 0 · restarts 0/1", timeout=UPDATE_WAIT_MS
            )
            nodes[1].report("FAILED", error="Killed", exit_code=-9)
            expect(page.locator("#restarts")).to_have_text(
                "generation 1 · restarts 1/1", timeout=UPDATE_WAIT_MS
            )
            expect(page.locator("#restart-causes")).to_contain_text(
                "restart to generation 1: worker:1 (executor 1, host 127.0.0.1) was killed by SIGKILL"
            )
        finally:
            page.close()
            for n in nodes:
                n.close()


def _log_position(page: object) -> dict:
    return page.evaluate(  # type: ignore[attr-defined]
        "() => { const p = document.getElementById('logs');"
        " return { top: p.scrollTop, atEnd: p.scrollTop + p.clientHeight >= p.scrollHeight - 4,"
        " scrollable: p.scrollHeight > p.clientHeight + 100 }; }"
    )


def test_the_log_pane_opens_at_the_newest_line_follows_and_dead_links_are_marked(browser, served):
    """More lines than one batch and one screen: the pane opens at the newest, follows new lines,
    stays where the user scrolled up to, and follows again at the bottom; once the job ended the
    TensorBoard (its node ended) and Spark UI (its application ended with the job) links are marked."""
    expect = playwright_api.expect
    coord, base = served
    spec = JobSpec(roles=make_roles(1), name="log-pane", labels={"spark_ui_url": "http://127.0.0.1:4040/"})
    with DriverClient(coord.address, coord.secret) as d:
        job = d.submit(spec)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        with NodeClient(coord.address, d.job_token(job), job, 0).connect() as n:
            try:
                n.register("127.0.0.1", 7300, meta={"tensorboard_url": "http://127.0.0.1:6006/"})
                n.await_cluster(10)
                n.report("RUNNING")
                for start in range(0, 1200, 200):  # 1,200 lines: three of the page's batches
                    n.send_logs("stdout", [f"training line {i}" for i in range(start, start + 200)])
                page.goto(f"{base}/?token={TOKEN.decode()}#job={job}")
                logs = page.locator("#logs")
                expect(logs).to_contain_text("training line 1199", timeout=UPDATE_WAIT_MS)
                page.wait_for_function(
                    "() => { const p = document.getElementById('logs');"
                    " return p.scrollTop + p.clientHeight >= p.scrollHeight - 4; }",
                    timeout=UPDATE_WAIT_MS,
                )
                pos = _log_position(page)
                assert pos["scrollable"] and pos["atEnd"] and pos["top"] > 0
                expect(page.locator("#tensorboard-link")).not_to_have_class(re.compile("dead"))
                expect(page.locator("#spark-ui-link")).not_to_have_class(re.compile("dead"))

                n.send_logs("stdout", ["followed line A"])  # at the bottom: the pane follows
                expect(logs).to_contain_text("followed line A", timeout=UPDATE_WAIT_MS)
                page.wait_for_function(
                    "() => { const p = document.getElementById('logs');"
                    " return p.scrollTop + p.clientHeight >= p.scrollHeight - 4; }",
                    timeout=UPDATE_WAIT_MS,
                )

                page.locator("#logs").evaluate("p => { p.scrollTop = 100; }")  # the user reads back
                page.wait_for_function("() => document.getElementById('logs').scrollTop === 100")
                n.send_logs("stdout", ["unfollowed line B"])
                expect(logs).to_contain_text("unfollowed line B", timeout=UPDATE_WAIT_MS)
                assert _log_position(page)["top"] == 100  # left where the user is reading

                page.locator("#logs").evaluate("p => { p.scrollTop = p.scrollHeight; }")  # back down
                page.wait_for_function(
                    "() => { const p = document.getElementById('logs');"
                    " return p.scrollTop + p.clientHeight >= p.scrollHeight - 4; }"
                )
                n.send_logs("stdout", ["followed again C"])
                expect(logs).to_contain_text("followed again C", timeout=UPDATE_WAIT_MS)
                page.wait_for_function(
                    "() => { const p = document.getElementById('logs');"
                    " return p.scrollTop + p.clientHeight >= p.scrollHeight - 4; }",
                    timeout=UPDATE_WAIT_MS,
                )

                n.report("SUCCEEDED")
                expect(page.locator(".jobhead .state")).to_have_text("SUCCEEDED", timeout=UPDATE_WAIT_MS)
                for link in ("#tensorboard-link", "#spark-ui-link", '[data-node="worker:0"] a'):
                    expect(page.locator(link)).to_have_class(re.compile("dead"), timeout=UPDATE_WAIT_MS)
                    expect(page.locator(link)).to_have_attribute("data-dead", "true")
                expect(page.locator("#tensorboard-link")).to_have_attribute(
                    "title", "TensorBoard ended with worker:0 (SUCCEEDED)"
                )
                assert errors == []
            finally:
                page.close()


def test_serve_logs_how_to_open_its_dashboard_and_the_line_opens_it(browser, tmp_path):
    """``tfcoord serve``'s log names the dashboard's URL with the token read from its file (the
    token itself stays out of the log); the line, pasted into a shell, opens the dashboard."""
    from tests.integration.served import Served

    served = Served(tmp_path, http=True)
    try:
        line = next(ln for ln in served.log.splitlines() if "dashboard: " in ln)
        token = served.http_token_file.read_text().strip()
        assert token not in served.log
        command = line.split("dashboard: ", 1)[1].split("  (", 1)[0]
        assert command == f"http://127.0.0.1:{served.http_port}/?token=$(cat {served.http_token_file})"
        url = subprocess.run(["bash", "-c", f'echo "{command}"'], capture_output=True, text=True, check=True)
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        try:
            page.goto(url.stdout.strip())
            playwright_api.expect(page.locator("#jobs-panel")).to_be_visible(timeout=UPDATE_WAIT_MS)
            playwright_api.expect(page.locator("#login")).to_be_hidden()
            assert "token" not in page.url
        finally:
            page.close()
    finally:
        served.stop()
