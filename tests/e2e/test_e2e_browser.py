"""End to end, in a real browser: the example project's server (``manage.py runserver``) and a
real Celery worker as subprocesses, driven through Debian's headless Chromium with Selenium.

A staff user saves a product 20 times through the admin form, sees its key pending with 20
triggers, presses "Run now" and sees one run with 19 merged. A user with view permission only
sees no actions, and an action posted without change permission is refused (403) and changes
nothing.

The example site gets a database of its own (a fresh PostgreSQL database on the suite's
server, or a SQLite file, as the run's ``DEBOUNCE_TEST_DB``), a Redis broker database, and on
PostgreSQL runs also a Redis cache, so its debounce state lives in Redis (the admin then reads
live counts from Redis); on SQLite runs the state lives in the database. Its waits are 600 s,
so nothing runs before "Run now".

Chromium and chromedriver come from Debian (``/usr/bin/chromium``, ``/usr/bin/chromedriver``;
``scripts/test`` installs them when missing). This test never skips: without a browser that
starts, it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis
from django.conf import settings
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.support.helpers import ROOT, wait_for
from tests.support.servers import free_port

pytestmark = pytest.mark.worker

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1400, 1000)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size={},{}".format(*WINDOW),
]
SAVES = 20
PASSWORD = "e2e-password-1"


@dataclass
class Site:
    """The running example project."""

    url: str
    env: dict[str, str]
    log_dir: Path
    product_pk: int
    other_pk: int

    def manage(self, *args: str) -> str:
        """``manage.py ARGS`` against the site's database and stores; returns stdout."""
        proc = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"manage.py {' '.join(args)} failed:\n{proc.stderr}"
        return proc.stdout

    def status(self) -> dict[str, dict]:
        """``debounce_status --json``, by key, as an operator would read it."""
        out = self.manage("debounce_status", "--json")
        return {row["key"]: row for row in map(json.loads, out.splitlines())}


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115  (closed when the process group is stopped)
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _alive(proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    if proc.poll() is not None:
        raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")


SETUP = """
from django.contrib.auth.models import Permission, User
from example_project.catalogue.models import Category, Product
User.objects.create_superuser("staff", "staff@example.com", {password!r})
viewer = User.objects.create_user("viewer", "viewer@example.com", {password!r}, is_staff=True)
viewer.user_permissions.add(*Permission.objects.filter(codename__in=[
    "view_debouncekey", "view_debouncerun", "view_product", "view_category"]))
category = Category.objects.create(name="Lamps")
# bulk_create sends no signals: the products start with no trigger at all.
Product.objects.bulk_create([
    Product(name="Desk lamp", price="10.00", category=category),
    Product(name="Floor lamp", price="20.00", category=category),
])
print("PKS", *Product.objects.order_by("name").values_list("pk", flat=True))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    log_dir = tmp_path_factory.mktemp("e2e")
    redis_base = settings.REDIS_URL.rsplit("/", 1)[0]
    broker_url, cache_url = f"{redis_base}/6", f"{redis_base}/7"
    for url in (broker_url, cache_url):
        redis.Redis.from_url(url).flushdb()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DEBOUNCE_TEST_", "CELERY_", "REDIS_", "DATABASE_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        PYTHONPATH=str(ROOT),
        CELERY_BROKER_URL=broker_url,
        CATALOGUE_SEARCH_WAIT="600",
        CATALOGUE_STATS_WAIT="600",
        DJANGO_DEBUG="1",
    )
    pg_name = None
    if settings.DB_VENDOR == "postgresql":
        import psycopg

        pg = urlparse(os.environ["DEBOUNCE_TEST_POSTGRES_URL"])
        pg_server = f"postgresql://{pg.username or 'postgres'}@{pg.hostname}:{pg.port}"
        pg_name = f"e2e_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{pg_name}"')
        env["DATABASE_URL"] = f"{pg_server}/{pg_name}"
        env["REDIS_URL"] = cache_url  # the debounce state lives in Redis
    else:
        env["DATABASE_URL"] = f"sqlite:///{log_dir / 'site.sqlite3'}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        base = Site("", env, log_dir, 0, 0)
        base.manage("migrate", "--noinput", "-v", "0")
        out = base.manage("shell", "-c", SETUP.format(password=PASSWORD))
        pks = next(line.split()[1:] for line in out.splitlines() if line.startswith("PKS "))
        worker_log, server_log = log_dir / "worker.log", log_dir / "server.log"
        worker = _start(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "example_project",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "2",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--hostname",
                f"e2e-{os.getpid()}@localhost",
            ],
            env,
            worker_log,
        )
        procs.append(worker)
        port = free_port()
        server = _start(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            env,
            server_log,
        )
        procs.append(server)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            _alive(worker, worker_log, "the example project's worker")
            _alive(server, server_log, "the example project's runserver")
            return b"ready." in worker_log.read_bytes() and _answers(f"{url}/admin/login/")

        wait_for(ready, timeout=90, interval=0.2, message="the example site and its worker")
        yield Site(url, env, log_dir, int(pks[0]), int(pks[1]))
    finally:
        for proc in reversed(procs):
            _stop(proc)
        if pg_name is not None:
            with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """Debian's Chromium, headless, with a fresh profile. Fails (never skips) when it cannot
    start."""
    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} is missing: scripts/test installs chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(
        service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")),
        options=options,
    )
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: WebDriver, name: str) -> None:
    """Save a screenshot when ``DEBOUNCE_E2E_SCREENSHOTS`` names a directory (for people)."""
    folder = os.environ.get("DEBOUNCE_E2E_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def breadcrumbs_style(driver: WebDriver) -> dict[str, str]:
    """The computed style of the page's breadcrumbs bar (the element in the breadcrumbs
    ``nav``), as the eye sees it."""
    return driver.execute_script(
        """
        const bar = document.querySelector('nav[aria-label="Breadcrumbs"] > .breadcrumbs');
        if (!bar) return null;
        const style = getComputedStyle(bar);
        return {background: style.backgroundColor, color: style.color,
                padding: style.padding, height: String(bar.getBoundingClientRect().height),
                linkSize: getComputedStyle(bar.querySelector('a')).fontSize};
        """
    )


def assert_in_view(driver: WebDriver, element) -> None:
    """``element`` lies wholly within the viewport and within the scrolled box around it (no
    scrolling needed to read it)."""
    box = driver.execute_script(
        """
        const r = arguments[0].getBoundingClientRect();
        let clip = document.documentElement.clientWidth;
        for (let p = arguments[0].parentElement; p; p = p.parentElement) {
            if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX)) {
                clip = Math.min(clip, p.getBoundingClientRect().right);
            }
        }
        return {left: r.left, right: r.right, clip: clip};
        """,
        element,
    )
    assert 0 <= box["left"] and box["right"] <= box["clip"], (element.text, box)


def until(driver: WebDriver, condition, timeout: float = 30):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def log_in(driver: WebDriver, site: Site, username: str) -> None:
    driver.get(f"{site.url}/admin/login/")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    until(driver, expected_conditions.presence_of_element_located((By.ID, "user-tools")))


def save_product(driver: WebDriver, site: Site, pk: int, times: int) -> None:
    """Save the product through its admin form ``times`` times ("Save and continue editing")."""
    driver.get(f"{site.url}/admin/catalogue/product/{pk}/change/")
    for i in range(times):
        price = driver.find_element(By.NAME, "price")
        price.clear()
        price.send_keys(f"{10 + i}.50")
        form = driver.find_element(By.ID, "product_form")
        driver.find_element(By.NAME, "_continue").click()
        until(driver, expected_conditions.staleness_of(form))
        until(
            driver,
            expected_conditions.text_to_be_present_in_element(
                (By.CSS_SELECTOR, "ul.messagelist"), "was changed successfully"
            ),
        )


def key_row(driver: WebDriver, site: Site, key: str):
    """The changelist row of ``key`` (searched by key), as {field name: cell}."""
    driver.get(f"{site.url}/admin/django_debounce/debouncekey/?q={key}")
    rows = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    for row in rows:
        cells = {
            cls.removeprefix("field-"): cell
            for cell in row.find_elements(By.CSS_SELECTOR, "td, th")
            for cls in (cell.get_attribute("class") or "").split()
            if cls.startswith("field-")
        }
        if cells.get("key_text") is not None and cells["key_text"].text == key:
            return row, cells
    raise AssertionError(f"no row for {key!r} among {[r.text for r in rows]}")


def key_page_pk(cells) -> int:
    href = cells["key_text"].find_element(By.TAG_NAME, "a").get_attribute("href")
    match = re.search(r"/debouncekey/(\d+)/change/", href or "")
    assert match, href
    return int(match.group(1))


def readonly(driver: WebDriver, field: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, f".field-{field} .readonly").text.strip()


def test_staff_saves_twenty_times_then_run_now_runs_once_with_19_merged(site, browser):
    key = f"catalogue.product:{site.product_pk}"
    log_in(browser, site, "staff")
    save_product(browser, site, site.product_pk, SAVES)

    _row, cells = key_row(browser, site, key)
    assert cells["state"].text == "pending"
    assert cells["live_pending"].text == str(SAVES)
    # the total is the row's: on the Redis store the merged saves are in the key's counter
    # until the run's claim folds them (then it is 20, below)
    assert cells["triggers"].text == str(site.status()[key]["triggers"])
    assert cells["fires"].text.startswith("in "), cells["fires"].text  # e.g. "in 9 min 48 s"
    assert site.status()[key]["pending"] == SAVES
    shot(browser, "1-keys-pending")

    row, cells = key_row(browser, site, key)
    page = f"{site.url}/admin/django_debounce/debouncekey/{key_page_pk(cells)}/change/"
    row.find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("run_now")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    until(
        browser,
        expected_conditions.text_to_be_present_in_element(
            (By.CSS_SELECTOR, "ul.messagelist"), "1 key(s) with pending triggers will run now."
        ),
    )

    def ran_once() -> bool:
        browser.get(page)
        runs = browser.find_elements(By.CSS_SELECTOR, "table.debounce-recent-runs tr.debounce-run")
        return len(runs) == 1 and "success" in runs[0].text

    wait_for(ran_once, timeout=60, interval=0.5, message="the run after Run now")
    shot(browser, "2-key-after-run-now")
    assert (readonly(browser, "runs"), readonly(browser, "merged")) == ("1", "19")
    assert readonly(browser, "live_pending") == "0"
    assert readonly(browser, "triggers") == str(SAVES)
    cells = browser.find_elements(By.CSS_SELECTOR, "table.debounce-recent-runs tr.debounce-run td")
    # run, flight, triggers, merged, started, delay, duration, outcome, error
    assert [c.text for c in cells[:4]] == ["1", "1", str(SAVES), "19"]

    # The derived data saw the final save, once.
    browser.get(f"{site.url}/admin/catalogue/searchdocument/")
    assert browser.find_element(By.CSS_SELECTOR, "td.field-triggers").text == str(SAVES)

    # The summary page, linked from the keys list, counts the run.
    browser.get(f"{site.url}/admin/django_debounce/debouncekey/")
    browser.find_element(By.CSS_SELECTOR, "a.debounce-summary-link").click()
    task = browser.find_element(
        By.CSS_SELECTOR, 'tr.debounce-task[data-task="catalogue.rebuild_search_document"]'
    )
    assert task.find_element(By.CSS_SELECTOR, "td.runs").text == "1"
    assert task.find_element(By.CSS_SELECTOR, "td.triggers").text == str(SAVES)
    assert browser.find_elements(By.CSS_SELECTOR, "svg.debounce-chart")
    # Its breadcrumbs look like those of Django's own pages (Django 6.1 styles a list only).
    summary_crumbs = breadcrumbs_style(browser)
    shot(browser, "3-summary")
    browser.get(f"{site.url}/admin/django_debounce/debouncekey/")
    assert summary_crumbs == breadcrumbs_style(browser)

    # The runs list at 1280 px: the key without its task name, and the outcome on screen.
    browser.set_window_size(1280, 900)
    try:
        browser.get(f"{site.url}/admin/django_debounce/debouncerun/")
        run = browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr")
        assert run.find_element(By.CSS_SELECTOR, "td.field-key").text == key
        outcome = run.find_element(By.CSS_SELECTOR, "td.field-outcome")
        assert outcome.text == "success"
        shot(browser, "5-runs-1280")
        for element in (outcome, browser.find_element(By.CSS_SELECTOR, "th.column-outcome")):
            assert_in_view(browser, element)
    finally:
        browser.set_window_size(*WINDOW)


def test_view_only_user_sees_no_actions_and_a_posted_action_is_refused(site, browser):
    key = f"catalogue.product:{site.other_pk}"
    site.manage(
        "shell",
        "-c",
        "from example_project.catalogue.models import Product\n"
        f"for _ in range(3): Product.objects.get(pk={site.other_pk}).save()",
    )
    assert site.status()[key]["pending"] == 3

    log_in(browser, site, "viewer")
    _row, cells = key_row(browser, site, key)
    assert cells["live_pending"].text == "3"
    pk = key_page_pk(cells)
    assert not browser.find_elements(By.NAME, "action")
    assert not browser.find_elements(By.CSS_SELECTOR, "input.action-select")
    shot(browser, "4-keys-view-only")
    # The key page is readable, with no form to change it.
    browser.get(f"{site.url}/admin/django_debounce/debouncekey/{pk}/change/")
    assert readonly(browser, "live_pending") == "3"
    assert not browser.find_elements(By.CSS_SELECTOR, "input[type=submit][name=_save]")

    # Post the action anyway, as a crafted form with the viewer's own CSRF token.
    browser.get(f"{site.url}/admin/django_debounce/debouncekey/")
    browser.execute_script(
        """
        const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken='))
            .split('=')[1];
        const form = document.createElement('form');
        form.method = 'post';
        form.action = window.location.pathname;
        for (const [name, value] of [['csrfmiddlewaretoken', token], ['action', 'cancel_pending'],
                                     ['_selected_action', arguments[0]], ['index', '0']]) {
            const input = document.createElement('input');
            input.type = 'hidden'; input.name = name; input.value = value;
            form.appendChild(input);
        }
        document.body.appendChild(form);
        form.submit();
        """,
        str(pk),
    )
    until(browser, lambda d: "403" in d.find_element(By.TAG_NAME, "body").text)
    assert "Forbidden" in browser.find_element(By.TAG_NAME, "body").text
    assert site.status()[key]["pending"] == 3  # nothing changed
