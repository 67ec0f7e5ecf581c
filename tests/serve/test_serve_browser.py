"""The page at ``/`` in headless Chromium (Debian's chromium, as the explorer's test) against a running
server: type a prompt, generate, watch the text stream in; translate and see the cross-attention;
classify. Skips without chromium, chromedriver and selenium."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from serve_helpers import reference_completion
from servers import served_model

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="needs the selenium package (pip install selenium)")
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1200,1000")


@pytest.fixture()
def browser(tmp_path):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def state_is(driver, *states):
    return lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in states


def set_value(driver, element_id: str, value) -> None:
    driver.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1]; e.dispatchEvent(new Event('input'));",
                          element_id, str(value))


def screenshot(driver, tmp_path, name: str) -> None:
    shot_dir = Path(os.environ.get("AIAYN_SCREENSHOT_DIR", tmp_path))
    shot_dir.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(shot_dir / name))


def only_this_server(driver, url: str) -> None:
    """No request left for another origin, and no error in the console."""
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    import json

    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requested = message["params"]["request"]["url"]
            if requested.startswith(("http:", "https:", "ws:", "wss:")):  # (chrome:// pages are the browser's own)
                assert requested.startswith(url), requested


def test_language_model_streams_into_the_page(serve, browser, tmp_path, tokenizer):
    served = served_model(tokenizer, "tiny-decoder-only", max_len=64)
    server = serve(served)
    browser.get(server.url + "/")
    WebDriverWait(browser, 20).until(state_is(browser, "ready"))
    assert browser.find_element(By.ID, "lm").is_displayed() and not browser.find_element(By.ID, "mt").is_displayed()
    assert browser.find_element(By.ID, "max_tokens").get_attribute("value") == "64"  # from /v1/models: not past the context
    browser.find_element(By.ID, "prompt").send_keys("the cat")
    set_value(browser, "temperature", 0.7)
    set_value(browser, "top_p", 0.9)
    set_value(browser, "max_tokens", 40)
    set_value(browser, "seed", 11)
    assert browser.find_element(By.ID, "temperature-value").text == "0.70"
    browser.find_element(By.ID, "generate").click()
    WebDriverWait(browser, 30).until(state_is(browser, "done", "error"))
    assert browser.find_element(By.ID, "lm-error").text == ""
    completion = browser.find_element(By.ID, "completion")
    text, reason = reference_completion(served, "the cat", 40, 11, 0.7, 0.9)
    assert completion.get_attribute("textContent") == text
    assert int(completion.get_attribute("data-chunks")) > 1  # it arrived piece by piece
    assert browser.find_element(By.ID, "status").text == f"done ({reason})"
    screenshot(browser, tmp_path, "serve-lm.png")
    only_this_server(browser, server.url)


def test_translation_shows_the_cross_attention(serve, browser, tmp_path, tokenizer):
    server = serve(served_model(tokenizer, "tiny-encoder-decoder", max_len=64))
    browser.get(server.url + "/")
    WebDriverWait(browser, 20).until(state_is(browser, "ready"))
    browser.find_element(By.ID, "source").send_keys("a cat sat")
    set_value(browser, "beam_size", 2)
    browser.find_element(By.ID, "translate").click()
    WebDriverWait(browser, 30).until(state_is(browser, "done", "error"))
    assert browser.find_element(By.ID, "mt-error").text == ""
    expected = httpx.post(server.url + "/v1/translations", json={"text": "a cat sat", "beam_size": 2}).json()["choices"][0]["text"]
    assert browser.find_element(By.ID, "translation").get_attribute("textContent") == expected
    browser.switch_to.frame(browser.find_element(By.ID, "explorer"))
    WebDriverWait(browser, 20).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    assert "cross" in Select(browser.find_element(By.ID, "view")).first_selected_option.text
    cells = browser.find_elements(By.CSS_SELECTOR, "#matrix td.cell")
    assert len(cells) == (len(tokenizer.encode(expected)) + 1) * (len("a cat sat") + 1)  # (BOS + target) x (source + EOS)
    browser.switch_to.default_content()
    screenshot(browser, tmp_path, "serve-translation.png")
    only_this_server(browser, server.url)


def test_classifier_probabilities(serve, browser, tokenizer):
    server = serve(served_model(tokenizer, "tiny-encoder-only", n_classes=3))
    browser.get(server.url + "/")
    WebDriverWait(browser, 20).until(state_is(browser, "ready"))
    browser.find_element(By.ID, "text").send_keys("the dog ran")
    browser.find_element(By.ID, "classify").click()
    WebDriverWait(browser, 30).until(state_is(browser, "done", "error"))
    shown = [float(p.text) for p in browser.find_elements(By.CSS_SELECTOR, "#probs .bar .p")]
    expected = httpx.post(server.url + "/v1/classifications", json={"input": "the dog ran"}).json()["data"][0]["probs"]
    assert shown == pytest.approx(list(expected.values()), abs=1e-4) and len(shown) == 3
    names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#probs .bar .name")]
    assert names == list(expected) == ["0", "1", "2"]  # a checkpoint without class names: the indices, as in Python
    assert browser.find_element(By.ID, "fill").is_displayed()  # a masked-LM head and a mask token: fill-mask is listed
    # an encoder serves embeddings: the page shows the cosine similarity of two sentences, as the endpoint gives
    assert browser.find_element(By.ID, "similar").is_displayed()
    browser.find_element(By.ID, "other").send_keys("a cat sat")
    browser.find_element(By.ID, "compare").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "similarity").text or d.find_element(By.ID, "enc-error").text)
    assert browser.find_element(By.ID, "enc-error").text == ""
    import torch

    vectors = httpx.post(server.url + "/v1/embeddings", json={"input": ["the dog ran", "a cat sat"]}).json()["data"]
    a, b = (torch.tensor(v["embedding"], dtype=torch.float64) for v in vectors)
    cosine = float(a @ b / (a.norm() * b.norm()))
    assert browser.find_element(By.ID, "similarity").text == f"cosine similarity {cosine:.4f}"
