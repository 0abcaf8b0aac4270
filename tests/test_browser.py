"""The live admin and the API browser in a real browser: Debian's headless Chromium, driven
by selenium, against a served Modelship, with no network but the site. The list follows a
start without a reload (its screenshot is kept under var/test-artifacts/), a deployment's
page follows its engine's log with a pause and operates it with buttons, and /api/docs/
renders its operations from assets the site serves itself."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import User
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from deployments.api.tokens import issue_token
from deployments.models import Deployment
from tests.conftest import REPO, chat

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
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(what)
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
    assert text_of(browser, f'[data-live="activity"][data-id="{napper.pk}"]').startswith("sleeping")

    # Started by someone else (the CLI, a script): the list shows it as it happens.
    token = issue_token(User.objects.get(username="ops"))
    started = httpx.post(
        f"{url}/api/deployments/{talker.pk}/start/", headers={"Authorization": f"Token {token}"}
    )
    assert started.status_code == 202, started.text
    until(browser, lambda d: text_of(d, badge) in ("starting", "ready"))
    until(browser, lambda d: text_of(d, badge) == "ready")
    until(
        browser, lambda d: text_of(d, f'[data-live="holding_gib"][data-id="{talker.pk}"]') == "1.00"
    )
    until(browser, lambda d: "Memory: 1.0 of 8.0 GiB held" in text_of(d, "#host-budget"))
    engine = Deployment.objects.get(pk=talker.pk).engine_url
    assert text_of(browser, f'[data-live="engine"][data-id="{talker.pk}"]') == engine
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
