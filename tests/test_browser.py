"""The live admin and the API browser in a real browser: Debian's headless Chromium, driven
by selenium, against a served Modelship, with no network but the site. The list follows a
start without a reload (its screenshot is kept under var/test-artifacts/), a deployment's
page follows its engine's log with a pause and operates it with buttons, and /api/docs/
renders its operations from assets the site serves itself."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import User
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from deployments.api.tokens import issue_token
from deployments.models import Deployment
from tests.conftest import REPO, chat, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.usefixtures("engines")
ARTIFACTS = Path(os.environ.get("MSHIP_TEST_ARTIFACTS", REPO / "var" / "test-artifacts"))
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
LOG_LINE = "POST /v1/chat/completions"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if not (CHROMIUM and DRIVER):
        pytest.fail("no chromium and chromedriver (Debian packages); `make test` installs them")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root, in a container
        "--disable-dev-shm-usage",
        "--window-size=1600,800",
        # No network but the site: no name resolves, and any other address goes to a proxy
        # that is not there.
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--proxy-server=127.0.0.1:9",
        "--proxy-bypass-list=127.0.0.1",
    ):
        options.add_argument(argument)
    # Where every test of the module leaves its screenshots, whichever of them runs first.
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: WebDriver, what: Callable[[WebDriver], Any], timeout: float = 30) -> Any:
    try:
        # A live page redraws what it shows: an element found may be replaced before it is
        # read, and is looked for again at the next poll.
        return WebDriverWait(
            driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]
        ).until(what)
    except TimeoutException:
        # What the page showed instead, for whoever reads the failure.
        driver.save_screenshot(str(ARTIFACTS / "browser-failure.png"))
        body = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(f"the page never showed it; it shows:\n{body[:3000]}") from None


def text_of(driver: WebDriver, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def sign_in(driver: WebDriver, url: str, next_page: str) -> None:
    User.objects.create_superuser("ops", "o@example.com", "pw-123456")
    driver.delete_all_cookies()
    driver.get(f"{url}/admin/login/?next={next_page}")
    driver.find_element(By.NAME, "username").send_keys("ops")
    driver.find_element(By.NAME, "password").send_keys("pw-123456")
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()


def test_it_follows_a_start_on_the_list_and_operates_and_tails_from_a_page(
    live: dict[str, str], browser: WebDriver, make_deployment: Callable[..., Deployment]
) -> None:
    url = live["MSHIP_URL"]
    talker = make_deployment("talker")
    napper = make_deployment("napper", mode="on_demand", idle_timeout_s=300)
    sign_in(browser, url, "/admin/deployments/deployment/")
    browser.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    browser.refresh()  # without the navigation sidebar: the whole list in the screenshot
    until(browser, lambda d: text_of(d, "#live-status") == "live")
    browser.execute_script("window.notReloaded = true")
    badge = f'[data-live="state"][data-id="{talker.pk}"]'
    assert text_of(browser, badge) == "planned"
    assert text_of(browser, f'[data-live="state"][data-id="{napper.pk}"]') == "planned · idle"

    # Started by someone else (the CLI, a script): the list shows it as it happens.
    token = issue_token(User.objects.get(username="ops"))
    started = httpx.post(
        f"{url}/api/deployments/{talker.pk}/start/", headers={"Authorization": f"Token {token}"}
    )
    assert started.status_code == 202, started.text
    until(browser, lambda d: text_of(d, badge).split(" · ")[0] in ("starting", "ready"))
    until(browser, lambda d: text_of(d, badge) == "ready")
    until(
        browser, lambda d: text_of(d, f'[data-live="holding_gib"][data-id="{talker.pk}"]') == "1.00"
    )
    until(browser, lambda d: "Memory: 1.0 of 8.0 GiB held" in text_of(d, "#host-budget"))
    engine = Deployment.objects.get(pk=talker.pk).engine_url
    cell = browser.find_element(By.CSS_SELECTOR, f'[data-live="engine"][data-id="{talker.pk}"]')
    assert engine.endswith(cell.text) and cell.get_attribute("title") == engine
    assert browser.execute_script("return window.notReloaded") is True
    assert browser.save_screenshot(str(ARTIFACTS / "live-admin.png"))

    # Its page follows the engine's log; paused, new lines wait until resumed.
    browser.get(f"{url}/admin/deployments/deployment/{talker.pk}/change/")
    until(browser, lambda d: text_of(d, "#log-status") == "following")
    before = text_of(browser, "#live-log").count(LOG_LINE)
    chat(engine)
    until(browser, lambda d: text_of(d, "#live-log").count(LOG_LINE) == before + 1)
    browser.find_element(By.ID, "log-pause").click()
    chat(engine)
    until(browser, lambda d: text_of(d, "#log-status") == "paused, 1 new line(s)")
    assert text_of(browser, "#live-log").count(LOG_LINE) == before + 1
    browser.find_element(By.ID, "log-pause").click()
    assert text_of(browser, "#live-log").count(LOG_LINE) == before + 2
    assert browser.find_element(By.ID, "log-pause").text == "Pause"
    assert browser.save_screenshot(str(ARTIFACTS / "live-admin-deployment.png"))

    # Its buttons follow its state: only what does something now is enabled, and no switch
    # to the mode it is in is offered.
    def enabled(d: WebDriver) -> set[str]:
        buttons = d.find_elements(By.CSS_SELECTOR, 'button[name="op"]')
        return {str(b.get_attribute("value")) for b in buttons if b.is_enabled()}

    offered = {b.get_attribute("value") for b in browser.find_elements(By.NAME, "op")}
    assert "always_on" not in offered and "on_demand" in offered
    assert enabled(browser) == {"stop", "on_demand"}
    # Its Stop button asks first; dismissed, nothing happens.
    stop = 'button[name="op"][value="stop"]'
    browser.find_element(By.CSS_SELECTOR, stop).click()
    assert "Stop talker?" in browser.switch_to.alert.text
    browser.switch_to.alert.dismiss()
    assert Deployment.objects.get(pk=talker.pk).state == "ready"
    # Confirmed: the operation's message, then the state and the buttons as it changes.
    browser.find_element(By.CSS_SELECTOR, stop).click()
    browser.switch_to.alert.accept()
    until(browser, lambda d: "talker: stop queued" in text_of(d, "ul.messagelist").lower())
    panel_badge = f'#live-panel [data-live="state"][data-id="{talker.pk}"]'
    until(browser, lambda d: text_of(d, panel_badge) == "stopped")
    until(browser, lambda d: enabled(d) == {"start", "on_demand"})
    until(
        browser,
        lambda d: "not running" in text_of(d, "#log-status") or "gone" in text_of(d, "#log-status"),
    )

    # A new deployment's form shows the chosen loader's options, or the JSON box for vLLM's.
    browser.get(f"{url}/admin/deployments/deployment/add/")
    shown = lambda css: browser.find_element(By.CSS_SELECTOR, css).is_displayed()  # noqa: E731
    Select(browser.find_element(By.ID, "id_loader")).select_by_value("llama_server")
    assert shown("fieldset.ms-options-llama_server") and shown("#id_option__llama_server__n_ctx")
    assert not shown("fieldset.ms-options-simulated") and not shown(".form-row.field-config")
    Select(browser.find_element(By.ID, "id_loader")).select_by_value("vllm")
    assert shown(".form-row.field-config") and not shown("fieldset.ms-options-llama_server")


def test_it_shows_the_api_docs_with_no_network(live: dict[str, str], browser: WebDriver) -> None:
    url = live["MSHIP_URL"]
    sign_in(browser, url, "/api/docs/")
    until(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= 20)
    assert "deployments" in text_of(browser, "#swagger-ui")
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert fetched and all(name.startswith(url) for name in fetched), fetched
    assert browser.save_screenshot(str(ARTIFACTS / "api-docs.png"))


def api_post(url: str, path: str) -> httpx.Response:
    token = issue_token(User.objects.get(username="ops"))
    return httpx.post(f"{url}{path}", headers={"Authorization": f"Token {token}"}, timeout=10)


def segments(driver: WebDriver, bar: str) -> set[str]:
    """The deployments a memory bar shows, by the title above it (read in one go: the page
    redraws its bars as messages come)."""
    names = driver.execute_script(
        "const found = [];"
        "for (const row of document.querySelectorAll('#dash-bars .ms-bar-row')) {"
        "  if (!row.querySelector('.ms-bar-title').textContent.startsWith(arguments[0])) continue;"
        "  for (const seg of row.querySelectorAll('.ms-seg')) found.push(seg.dataset.name);"
        "}"
        "return found;",
        bar,
    )
    return {str(name) for name in names}


@pytest.mark.parametrize("live_env", [{"MSHIP_GPU_INVENTORY": "24,24"}])
def test_it_opens_on_a_dashboard_of_the_gpus_that_follows_an_on_demand_start(
    live: dict[str, str], browser: WebDriver, make_deployment: Callable[..., Deployment]
) -> None:
    url = live["MSHIP_URL"]
    talker = make_deployment("talker", memory_gib=4)
    make_deployment(
        "napper",
        mode="on_demand",
        idle_timeout_s=300,
        memory_gib=6,
        config={"startup_delay_s": 3},
    )
    # Its command prints a line longer than any cut, then exits.
    long_line = "starting with " + " ".join(f"--flag-{n}=value" for n in range(40)) + " END"
    broken = make_deployment("broken", command=["/bin/sh", "-c", f"echo '{long_line}'; exit 3"])
    sign_in(browser, url, "/admin/")
    until(browser, lambda d: text_of(d, "#live-status") == "live")
    browser.execute_script("window.notReloaded = true")
    # The host at a glance: one bar per GPU, nothing held yet.
    assert segments(browser, "GPU 0") == set() and segments(browser, "GPU 1") == set()
    assert "No failure recorded" in text_of(browser, "#dash-failures")

    # A start someone else asks for shows on its GPU; a failed one under the last failures,
    # its whole reason a click away.
    assert api_post(url, f"/api/deployments/{talker.pk}/start/").status_code == 202
    assert api_post(url, f"/api/deployments/{broken.pk}/start/").status_code == 202
    until(browser, lambda d: "talker" in segments(d, "GPU 0") | segments(d, "GPU 1"))
    until(browser, lambda d: "broken" in text_of(d, "#dash-failures"))
    browser.find_element(By.CSS_SELECTOR, "#dash-failures summary").click()
    until(browser, lambda d: "END" in text_of(d, "#dash-failures pre"))

    # A request for the on-demand one: the page shows it starting, then on a GPU, ready.
    key = (Path(live["MSHIP_VAR_DIR"]) / "api_key").read_text().strip()
    pool = ThreadPoolExecutor(1)
    asked = pool.submit(
        httpx.post,
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "napper", "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    until(browser, lambda d: "napper" in text_of(d, "#dash-starting"))
    until(browser, lambda d: "napper" in segments(d, "GPU 0") | segments(d, "GPU 1"))
    assert asked.result(timeout=60).status_code == 200
    pool.shutdown()
    napper_row = '#dash-deployments tr[data-name="napper"]'
    until(browser, lambda d: "ready" in text_of(d, napper_row))
    until(browser, lambda d: "Nothing is starting" in text_of(d, "#dash-starting"))
    assert browser.execute_script("return window.notReloaded") is True
    assert "1 failed" in text_of(browser, "#dash-summary")
    assert browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))

    # The list fits 1,280 px with nothing to scroll sideways, the failure's whole reason on
    # hover of its state.
    browser.set_window_size(1280, 900)
    browser.get(f"{url}/admin/deployments/deployment/")
    until(browser, lambda d: text_of(d, "#live-status") == "live")
    widths = browser.execute_script(
        "const r = document.querySelector('#changelist .results');"
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth,"
        " r.scrollWidth, r.clientWidth]"
    )
    assert widths[0] <= widths[1] and widths[2] <= widths[3], widths
    badge = browser.find_element(By.CSS_SELECTOR, f'[data-live="state"][data-id="{broken.pk}"]')
    assert badge.text == "failed" and long_line in str(badge.get_attribute("title"))
    assert browser.save_screenshot(str(ARTIFACTS / "deployment-list.png"))
    browser.set_window_size(1600, 800)


def test_it_keeps_the_engine_log_at_its_end_while_the_reader_is_there(
    live: dict[str, str], browser: WebDriver, make_deployment: Callable[..., Deployment]
) -> None:
    url = live["MSHIP_URL"]
    talker = make_deployment("talker")
    sign_in(browser, url, "/admin/")
    assert api_post(url, f"/api/deployments/{talker.pk}/start/").status_code == 202
    wait_until(lambda: Deployment.objects.get(pk=talker.pk).state == "ready", 60)
    engine = Deployment.objects.get(pk=talker.pk).engine_url
    for n in range(60):  # more lines than the panel shows
        chat(engine, f"line {n}")
    browser.get(f"{url}/admin/deployments/deployment/{talker.pk}/change/")
    at_end = (
        "const p = document.getElementById('live-log');"
        "return p.scrollHeight > p.clientHeight"
        " && p.scrollTop + p.clientHeight >= p.scrollHeight - 4"
    )
    until(browser, lambda d: text_of(d, "#log-status") == "following")
    assert browser.execute_script(at_end)  # it opens on the last lines
    before = text_of(browser, "#live-log").count(LOG_LINE)
    for n in range(5):
        chat(engine, f"more {n}")
    until(browser, lambda d: text_of(d, "#live-log").count(LOG_LINE) == before + 5)
    assert browser.execute_script(at_end)  # and stays there as lines come
    # Scrolled up to read, it stays where the reader is.
    browser.execute_script("document.getElementById('live-log').scrollTop = 0")
    chat(engine, "while reading")
    until(browser, lambda d: text_of(d, "#live-log").count(LOG_LINE) == before + 6)
    assert browser.execute_script("return document.getElementById('live-log').scrollTop") == 0
    browser.get("about:blank")  # the log's stream closed: the site stops without waiting on it
