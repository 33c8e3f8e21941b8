"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver,
driven by selenium) against demo_app on gunicorn with 4 workers and a real
redis-server.

Without the token the page shows only its form and the stream answers 401;
a wrong token is refused; with the right one a tile per breaker appears. A
trip made by the gunicorn workers (other processes) turns the pay tile to
the open colour within 2 s; clicking Reset closes it on every worker. A
screenshot is saved under test-artifacts/ (or $BREAKER_TEST_ARTIFACTS).

`./dev test` installs chromium and chromium-driver when they are missing; in
CI a missing browser is a failure, elsewhere a skip that says how to get it.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.demo_stack import WORKERS, Stack, start_stack
from tests.support.redis_server import wait_until

pytestmark = [pytest.mark.real, pytest.mark.multiprocess]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "dashboard-token"
OPEN_RGB = "rgb(198, 40, 40)"  # --open in dashboard.css
CLOSED_RGB = "rgb(46, 125, 50)"  # --closed
ARTIFACTS = Path(
    os.environ.get("BREAKER_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts"
)


def _need_browser() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if not missing:
        return
    message = f"{', '.join(missing)} missing: `./dev test` installs Debian's chromium and chromium-driver"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    _need_browser()
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,860",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    # An explicit driver path: selenium never looks for (or downloads) a driver.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def tile(driver, name: str):
    found = driver.find_elements(By.CSS_SELECTOR, f'.tile[data-name="{name}"]')
    return found[0] if found else None


def tile_state(driver, name: str) -> str | None:
    found = tile(driver, name)
    return found.get_attribute("data-state") if found is not None else None


def badge_colour(driver, name: str) -> str:
    badge = tile(driver, name).find_element(By.CSS_SELECTOR, ".state")
    return badge.value_of_css_property("background-color").replace("rgba", "rgb").replace(", 1)", ")")


def log_in(driver, token: str) -> None:
    WebDriverWait(driver, 10).until(lambda d: d.find_element(By.ID, "login").is_displayed())
    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()


def every_worker(s: Stack, status: int) -> set[str]:
    """Bursts of POST /pay until each worker has answered; every answer must have ``status``."""
    pids: set[str] = set()

    def all_seen() -> bool:
        for response in s.burst([("/pay", "POST")] * 8):
            assert response.status_code == status, (response.status_code, response.text)
            pids.add(response.headers["X-Worker-Pid"])
        return len(pids) >= WORKERS

    wait_until(all_seen, timeout=30, interval=0.01, what=f"every worker to answer {status}")
    return pids


class Traffic:
    """Requests to /cart and /products while the test runs, as the app's users would send."""

    def __init__(self, s: Stack) -> None:
        self.s = s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.answers: list[tuple[str, int]] = []

    def run(self) -> None:
        while not self.stop.wait(0.05):
            for path in ("/cart", "/products"):
                self.answers.append((path, self.s.send(path).status_code))

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(10)


def figure(driver, name: str, label: str) -> str:
    """The value next to ``label`` in a tile (calls/s, rejected/s, ...)."""
    for term in tile(driver, name).find_elements(By.CSS_SELECTOR, "dt"):
        if term.text == label:
            return term.find_element(By.XPATH, "following-sibling::dd[1]").text
    raise AssertionError(f"no {label!r} in the {name} tile")


def rate(shown: str) -> float:
    """A per-second figure as the tile shows it; 0 before the page has two samples (a dash)."""
    try:
        return float(shown)
    except ValueError:
        return 0.0


def rejected_drawn(driver, name: str) -> bool:
    """Whether the tile's sparkline draws a rejected/s above zero (the box is 40 high, 0 at y=38)."""
    points = tile(driver, name).find_element(By.CSS_SELECTOR, "polyline.rejected").get_attribute("points")
    return any(float(point.split(",")[1]) < 38 for point in (points or "").split())


@pytest.mark.parametrize(
    "worker_args",
    # gthread: the page holds a stream (a thread); sync: it asks for one frame a second
    [["-k", "gthread", "--threads", "4"], []],
    ids=["gthread", "sync"],
)
def test_dashboard_shows_a_trip_within_2_s_and_reset_closes_every_worker(
    redis_server, upstream_url, browser, worker_args
):
    s, gunicorn = start_stack(
        redis_server,
        upstream_url,
        worker_args,
        BREAKER_ADMIN_TOKEN=TOKEN,
        BREAKER_DASHBOARD="1",
        DEMO_PAY_OPEN_SECONDS="60",  # still open when Reset is clicked: the click closes it, not the timer
    )
    page = s.app_url + "/_breakers/"
    traffic = Traffic(s)
    try:
        s.reset_upstream()
        s.send("/cart")  # cart is known in Redis from here on: a second tile
        every_worker(s, 200)
        wait_until(lambda: s.subscribed_workers() >= WORKERS, timeout=15, what="every worker to subscribe")

        # -- without the token: the form, no data; the stream and the page answer 401 ----------
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            for path in ("/_breakers/stream", "/_breakers/", "/_breakers"):
                answer = requests.get(s.app_url + path, headers=headers, timeout=10)
                assert answer.status_code == 401, (path, headers)
                assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        browser.get(page)
        WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "login").is_displayed())
        assert browser.find_elements(By.CSS_SELECTOR, ".tile") == []
        assert "pay" not in browser.find_element(By.TAG_NAME, "main").text

        log_in(browser, "wrong")
        WebDriverWait(browser, 10).until(lambda d: "refused" in d.find_element(By.ID, "login-error").text)
        assert browser.find_elements(By.CSS_SELECTOR, ".tile") == []

        # -- with the token: a tile per breaker, closed and green ------------------------------
        log_in(browser, TOKEN)
        WebDriverWait(browser, 10).until(lambda d: tile_state(d, "pay") == "closed")
        assert tile_state(browser, "cart") == "closed"
        assert not browser.find_element(By.ID, "login").is_displayed()
        assert badge_colour(browser, "pay") == CLOSED_RGB
        assert TOKEN not in browser.current_url
        traffic.start()

        # -- the gunicorn workers trip it: open colour within 2 s ------------------------------
        s.control(path="/pay", fail_rate=1.0)
        for _ in range(5):
            assert s.pay().status_code == 502
        assert s.state()[0] == "open"
        WebDriverWait(browser, 2).until(lambda d: tile_state(d, "pay") == "open")
        assert badge_colour(browser, "pay") == OPEN_RGB
        pay_tile = tile(browser, "pay")
        WebDriverWait(browser, 5).until(
            lambda d: "next probe in" in pay_tile.find_element(By.CSS_SELECTOR, ".countdown").text
        )
        assert "closed → open" in pay_tile.find_element(By.CSS_SELECTOR, ".transitions").text
        every_worker(s, 503)
        # the next frame measures the refusals: a line on the sparkline (kept for 5 minutes)
        WebDriverWait(browser, 5).until(lambda d: rejected_drawn(d, "pay"))
        WebDriverWait(browser, 5).until(lambda d: rate(figure(d, "cart", "calls/s")) > 0)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / f"dashboard-{'sync' if not worker_args else 'gthread'}.png"
        assert browser.save_screenshot(str(shot))
        print(f"dashboard screenshot: {shot}")

        # -- Reset on the page closes it on every worker -----------------------------------------
        s.control(path="/pay", fail_rate=0.0)
        pay_tile.find_element(By.CSS_SELECTOR, 'button[data-action="reset"]').click()
        WebDriverWait(browser, 5).until(lambda d: tile_state(d, "pay") == "closed")
        WebDriverWait(browser, 5).until(lambda d: "reset: done" in tile(d, "pay").text)
        assert s.state()[0] == "closed"
        every_worker(s, 200)  # every answer 200: no worker kept refusing from memory

        # -- forgetting the token takes the data off the page ------------------------------------
        browser.find_element(By.ID, "forget").click()
        WebDriverWait(browser, 5).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".tile") == [])
        traffic.finish()
        assert traffic.answers and {status for _, status in traffic.answers} == {200}
        assert s.statuses[500] == 0, s.statuses
    finally:
        traffic.finish()
        gunicorn.stop()
        gunicorn.remove_log()
