"""The profile as a user sees it: TensorBoard (with the profile plugin of
the test extra) and the report's HTML page, in headless Chromium.

Needs Debian's `chromium` and `chromium-driver` packages (apt-get install
chromium chromium-driver); without them every test here skips, saying so.
With KERAS_IPU_SCREENSHOTS=DIR the tests save their screenshots there
(the README's pictures come from such a run).
"""

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="headless Chromium is not installed: apt-get install chromium chromium-driver "
           "(Debian) to run the browser tests")
SHOTS = os.environ.get("KERAS_IPU_SCREENSHOTS")
HERE = os.path.dirname(__file__)


def _shot(browser, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        browser.save_screenshot(os.path.join(SHOTS, name))


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (test extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile_dir = tempfile.mkdtemp(prefix="chromium_")
    # The flags Chromium needs on a machine without network and as root.
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile_dir}", "--window-size=1500,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """Keras fits (profiled_fit.py: runs `cnn`, one IPU, and `pipelined`, two)
    with TensorBoard(profile_batch=...) and autoReport profile reports, run
    in a subprocess (the ipu backend)."""
    root = tmp_path_factory.mktemp("profiled")
    env = dict(os.environ, KERAS_BACKEND="ipu",
               POPLAR_ENGINE_OPTIONS=json.dumps({"autoReport.all": "true",
                                                 "autoReport.directory": str(root / "reports")}))
    subprocess.run([sys.executable, os.path.join(HERE, "profiled_fit.py"), str(root / "logs")],
                   check=True, env=env, timeout=300, capture_output=True)
    return root


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tensorboard(logdir):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir / "logs"),
         "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300  # a loaded 2-core machine starts it slowly
        while True:
            try:
                urllib.request.urlopen(url + "/data/plugins_listing", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise AssertionError(f"TensorBoard did not start (exit {proc.poll()})")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(browser, condition, seconds=180):
    end = time.time() + seconds
    while time.time() < end:
        result = condition()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError("the page did not show what was expected in time")


# Page text including the trace viewer's shadow DOM (Polymer elements).
_DEEP_TEXT = """
function walk(n, out) {
  if (n.shadowRoot) walk(n.shadowRoot, out);
  for (const c of n.children || []) {
    if (c.tagName !== 'SCRIPT' && c.tagName !== 'STYLE') walk(c, out);
  }
  for (const t of n.childNodes || []) {
    if (t.nodeType === 3 && t.textContent.trim()) out.push(t.textContent.trim());
  }
  return out;
}
return walk(document.body, []).join(' | ');
"""


def _text(browser):
    return browser.execute_script(_DEEP_TEXT) or ""


# Elements matching a CSS selector, shadow DOMs included.
_DEEP_QUERY = """
const want = arguments[0], out = [];
function walk(n) {
  if (n.shadowRoot) walk(n.shadowRoot);
  for (const c of n.children || []) { if (c.matches(want)) out.push(c); walk(c); }
}
walk(document.body);
return out;
"""


def _profile_tool(browser, url, tool, run=None):
    from selenium.webdriver.common.by import By

    browser.switch_to.default_content()
    browser.get(url + "/#profile")
    frame = _wait(browser, lambda: browser.find_elements(By.TAG_NAME, "iframe"))[0]
    browser.switch_to.frame(frame)
    if run is not None:
        runs = _wait(browser, lambda: [s for s in browser.find_elements(By.CSS_SELECTOR,
                                                                         "mat-select")
                                       if "/train" in s.text])
        # The runs read "<run>/<session>" (a profile session per trace).
        if not runs[0].text.startswith(run + "/"):
            runs[0].click()
            _wait(browser, lambda: [o for o in browser.find_elements(
                By.CSS_SELECTOR, "mat-option") if o.text.strip().startswith(run + "/")])[0].click()
    selects = _wait(browser, lambda: [s for s in browser.find_elements(By.CSS_SELECTOR,
                                                                        "mat-select")
                                      if "Page" in s.text or "Viewer" in s.text])
    selects[0].click()
    option = _wait(browser, lambda: [o for o in browser.find_elements(
        By.CSS_SELECTOR, "mat-option") if o.text.strip() == tool])
    option[0].click()


def test_profile_plugin_trace_viewer_shows_the_ipu_lanes(browser, tensorboard):
    """The pipelined run: a plane per IPU, each step on the IPU it runs on."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    _profile_tool(browser, tensorboard, "Trace Viewer", run="pipelined/train")
    # The trace viewer is a page of its own inside the plugin's.
    inner = _wait(browser, lambda: browser.find_elements(By.TAG_NAME, "iframe"))[0]
    browser.switch_to.frame(inner)
    text = _wait(browser, lambda: "Program steps" in _text(browser) and _text(browser))
    assert "/device:CUSTOM:IPU:0 (predicted)" in text
    # A pipelined run's steps are drawn by its schedule (each micro-batch's
    # passes on its IPU's row), not as loop bodies one after another.
    lanes = ("IPU 0 memory (predicted bytes)", "Program runs", "Host transfers",
             "Program steps")
    positions = [text.index(lane) for lane in lanes]
    assert positions == sorted(positions)  # top-down: runs, transfers, steps
    assert "Loop bodies" not in text
    assert "/host:CPU" in text and "profiled batches" in text
    assert "/device:CUSTOM:IPU:1 (predicted)" in text and "IPU 1 memory" in text
    # The predicted runs last microseconds beside the simulator's
    # milliseconds: find them, as a user would, to zoom onto them. The
    # first micro-batch's forward pass is drawn (found)...
    (find,) = browser.execute_script(_DEEP_QUERY, "input[placeholder^='Find']")[-1:]
    browser.execute_script("arguments[0].focus()", find)
    first_pass = "micro-batch 0 forward"
    find.send_keys(first_pass)
    time.sleep(2)  # the plugin searches as one types
    _wait(browser, lambda: re.search(r"\b\d+ of [1-9]", _text(browser)))  # found
    # ... and the first program run on IPU 0 is framed: every micro-batch's
    # passes on both IPUs' rows, where the schedule puts them. Its name is
    # also in the host's "simulator runs ..." slices: the next-hit arrow
    # (Enter in the box only counts the hits) selects one hit after the
    # other until the details name the IPU's; the viewer's `f` frames it.
    find.send_keys(Keys.BACKSPACE * len(first_pass) + "train_step_loop")
    time.sleep(2)
    (arrow,) = [b for b in browser.execute_script(_DEEP_QUERY, "tr-ui-b-toolbar-button, button")
                if b.text.strip() == "\u2192"][-1:]
    for _ in range(8):
        browser.execute_script("arguments[0].click()", arrow)
        text = _wait(browser, lambda: re.search(r"\b[1-9]\d* of [1-9]", _text(browser))
                     and _text(browser))  # selected
        # The details: "Title | <search icon> | <name>".
        if re.search(r"Title \|(?: [^|]{1,2} \|)? train_step_loop", text):
            break
    else:
        raise AssertionError("no program run of IPU 0 among the hits: " + text[-2000:])
    browser.execute_script("arguments[0].blur()", find)  # `f` must reach the viewer
    ActionChains(browser).send_keys("f").perform()
    time.sleep(3)  # the viewer zooms onto it, animated
    browser.switch_to.default_content()
    _shot(browser, "tensorboard_trace_viewer.png")


def test_scalars_show_the_predictions(browser, tensorboard):
    from selenium.webdriver.common.keys import Keys

    browser.switch_to.default_content()
    browser.get(tensorboard + "/#timeseries")
    _wait(browser, lambda: "epoch_loss" in _text(browser))
    (tags,) = [i for i in browser.execute_script(_DEEP_QUERY, "input")
               if (i.get_attribute("placeholder") or "").startswith("Filter tags")]
    tags.send_keys("ipu/")
    text = _wait(browser, lambda: "ipu/predicted_step_time_us" in _text(browser)
                 and _text(browser))
    for tag in ("ipu/predicted_cycles_per_step", "ipu/memory_fullest_tile_bytes",
                "ipu/predicted_samples_per_second"):
        assert tag in text
    assert "cnn/train" in text and "pipelined/train" in text
    tags.send_keys(Keys.ESCAPE)  # the tag list it offers covers the charts
    _shot(browser, "tensorboard_scalars.png")


def test_profile_plugin_overview_and_memory_profile(browser, tensorboard):
    from selenium.webdriver.common.by import By

    _profile_tool(browser, tensorboard, "Overview Page")
    text = _wait(browser, lambda: "Host Compute Time" in _text(browser) and _text(browser))
    assert "No step marker observed" not in text
    browser.switch_to.default_content()
    _shot(browser, "tensorboard_overview.png")

    _profile_tool(browser, tensorboard, "Memory Profile")
    text = _wait(browser, lambda: "IPU 0 (predicted)" in _text(browser) and _text(browser))
    assert "peak" in text.lower()
    browser.switch_to.default_content()
    _shot(browser, "tensorboard_memory_profile.png")


def test_graphs_tab_shows_the_compiled_program(browser, tensorboard):
    from selenium.webdriver.common.by import By

    browser.switch_to.default_content()
    browser.get(tensorboard + "/#graphs")
    text = _wait(browser, lambda: "device loop" in _text(browser) and _text(browser))
    assert "Graph visualization failed" not in text and "graph is empty" not in text
    assert "inputs" in text
    _shot(browser, "tensorboard_graphs.png")


def test_report_page_hover_shows_the_numbers(browser, logdir):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    reports = logdir / "reports"
    out = logdir / "pictures"
    subprocess.run([sys.executable, "-m", "keras_ipu.report", str(reports), "--out", str(out)],
                   check=True, timeout=300, capture_output=True)
    assert glob.glob(str(out / "*.png"))
    browser.switch_to.default_content()
    browser.get((out / "index.html").as_uri())
    tiles = _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR,
                                                         'canvas[data-view="tiles"]'))
    tip = browser.find_element(By.ID, "tip")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", tiles[0])
    width = tiles[0].size["width"]
    ActionChains(browser).move_to_element_with_offset(tiles[0], -width // 2 + 90, 0).perform()
    text = _wait(browser, lambda: tip.text)
    assert text.startswith("tile ") and " of 624.0 KiB" in text
    assert "tensors on this tile" in text and "weights" in text
    _shot(browser, "report_tile_hover.png")

    (timeline,) = browser.find_elements(By.CSS_SELECTOR, 'canvas[data-view="timeline"]')[:1]
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", timeline)
    # The loop bodies' lane (the 4th of 5, below 6 px of margin and above
    # 30 px of axis): one op of the training step, with its Keras layer.
    height = timeline.size["height"]
    lane_y = 6 + 3.5 * (height - 30) / 5 - height / 2
    ActionChains(browser).move_to_element_with_offset(timeline, 0, int(lane_y)).perform()
    text = _wait(browser, lambda: tip.text)
    assert "cycles" in text and " in " in text and "device loop" not in text.split("\n")[0]
    _shot(browser, "report_timeline_hover.png")

    # The pipelined program: one memory view per IPU.
    ipus = {c.get_attribute("data-ipu") for c in browser.find_elements(
        By.CSS_SELECTOR, 'canvas[data-view="tiles"]')}
    assert {"0", "1"} <= ipus
