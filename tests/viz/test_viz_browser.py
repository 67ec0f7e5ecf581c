"""The HTML explorer in a real browser: Debian's chromium, headless, driven by Selenium.

Skips unless chromium, chromedriver (Debian: ``apt-get install chromium chromium-driver``) and the
``selenium`` package are installed. Opens the file, checks the grid, hovers tokens and checks the
highlighted weights follow the data, switches views and heads, and saves a screenshot (set
``AIAYN_SCREENSHOT_DIR`` to keep it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from aiayn.cli.main import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)", allow_module_level=True
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="needs the selenium package (pip install selenium)")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
)


@pytest.fixture()
def browser(tmp_path):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _weights(driver, selector: str) -> list[float]:
    return [float(el.get_attribute("data-w")) for el in driver.find_elements(By.CSS_SELECTOR, selector)]


def test_explorer_renders_and_reacts_to_hover(tmp_path, browser):
    assert main(["viz", "attention", "--preset", "tiny-encoder-decoder", "--text", "Grüße 世界", "--target", "Hallo",
                 "--html", "--out", str(tmp_path)]) == 0
    page = tmp_path / "attention.html"
    data = json.loads(re.search(r'type="application/json">(.*?)</script>', page.read_text(encoding="utf-8"), re.S).group(1))
    browser.get(page.as_uri())
    WebDriverWait(browser, 20).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")

    # The grid: encoder self-attention, 9 x 9 cells (8 characters + <eos>) coloured by weight, 2 x 4 thumbnails.
    enc = data["views"][0]
    n = len(enc["keys"])
    cells = browser.find_elements(By.CSS_SELECTOR, "#matrix td.cell")
    assert len(cells) == n * n == 9 * 9
    assert all(c.value_of_css_property("background-color").startswith("rgb") for c in cells[:5])
    assert len(browser.find_elements(By.CSS_SELECTOR, "#thumbs canvas")) == 2 * 4
    assert [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#kcol .tok .t")][:3] == ["G", "r", "ü"]

    # Hover query token 0: the keys light up with row 0 of layer 0, head 0.
    hover = ActionChains(browser)
    queries = browser.find_elements(By.CSS_SELECTOR, "#qcol .tok")
    hover.move_to_element(queries[0]).perform()
    first = _weights(browser, "#kcol .tok")
    assert first == pytest.approx(enc["weights"][0][0][0], abs=1e-3)
    assert sum(first) == pytest.approx(1.0, abs=1e-2)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#matrix td.cell.hl")) == n
    hover.move_to_element(queries[-1]).perform()
    last = _weights(browser, "#kcol .tok")
    assert last == pytest.approx(enc["weights"][0][0][-1], abs=1e-3)
    assert last != first  # the highlight follows the hovered token
    assert "attends most to" in browser.find_element(By.ID, "readout").text

    # Hover key token 2: the queries light up with column 2 (what attends to it).
    hover.move_to_element(browser.find_elements(By.CSS_SELECTOR, "#kcol .tok")[2]).perform()
    column = _weights(browser, "#qcol .tok")
    assert column == pytest.approx([row[2] for row in enc["weights"][0][0]], abs=1e-3)

    # Cross-attention, layer 1, head 3: a 6 x 9 grid with that head's weights.
    Select(browser.find_element(By.ID, "view")).select_by_index(2)
    Select(browser.find_element(By.ID, "layer")).select_by_value("1")
    Select(browser.find_element(By.ID, "head")).select_by_value("3")
    cross = data["views"][2]
    cells = browser.find_elements(By.CSS_SELECTOR, "#matrix td.cell")
    assert len(cells) == len(cross["queries"]) * len(cross["keys"]) == 6 * 9
    assert float(cells[0].get_attribute("data-w")) == pytest.approx(cross["weights"][1][3][0][0], abs=1e-3)
    hover.move_to_element(browser.find_elements(By.CSS_SELECTOR, "#qcol .tok")[3]).perform()
    assert _weights(browser, "#kcol .tok") == pytest.approx(cross["weights"][1][3][3], abs=1e-3)

    shot_dir = Path(os.environ.get("AIAYN_SCREENSHOT_DIR", tmp_path))
    shot_dir.mkdir(parents=True, exist_ok=True)
    shot = shot_dir / "explorer.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


@pytest.mark.reliability
def test_hostile_text_renders_as_text(tmp_path, browser):
    """``<!--<script>`` in the user's text used to blank the page; every string must show exactly as written."""
    import numpy as np

    from aiayn.viz.attention import AttentionView
    from aiayn.viz.explorer import write_explorer

    hostile = ["<!--<script>", "</script><script>document.title='pwned'</script>", "&amp;", "-->", "<b>x</b>", "]]>"]
    weights = np.random.default_rng(0).dirichlet(np.ones(len(hostile)), size=(1, 2, len(hostile))).astype(np.float32)
    page = write_explorer([AttentionView("encoder", weights, hostile, hostile[::-1])], tmp_path / "e.html",
                          title="<!--<script> title", subtitle="subtitle </script><!--<script> & more")
    browser.get(page.as_uri())
    WebDriverWait(browser, 20).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    assert browser.find_element(By.ID, "title").text == "<!--<script> title"
    assert browser.find_element(By.ID, "subtitle").text == "subtitle </script><!--<script> & more"
    assert [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#qcol .tok .t")] == hostile
    assert [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#kcol .tok .t")] == hostile[::-1]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#matrix td.cell")) == len(hostile) ** 2
    assert browser.title != "pwned" and not browser.find_elements(By.TAG_NAME, "b")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
