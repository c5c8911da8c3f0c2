"""`pallasgen playground --out DIR`: a static site that runs the build path in the
browser (Pyodide in a Web Worker).

What the page shows comes from `pallasgen.playground.session`, run in Pyodide: the
fast tests run it here and hold it to the CLI's own output; the site's tests check
what the command writes; the browser tests (headless Chromium from the system's
packages, driven by selenium through /usr/bin/chromedriver) serve the site on
localhost and use the page as a person would.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from urllib.parse import urlencode

import pytest
from click.testing import CliRunner

from pallasgen.cli import main
from pallasgen.playground import session
from pallasgen.playground.site import PAGE_FILES, SiteError, build_site
from pallasgen.workspace.cache import cache_dir
from pallasgen.workspace.tuning import tuning_path

pytestmark = pytest.mark.jax_free  # no jax: `-m jax_free` runs the build path alone (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.pallas"))
UNKNOWN_NAME_SPEC = """kernel add_vectors {
    in  x: f32[N]
    out z: f32[N]
    z = x + w
}
"""
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Chromium's start on a machine with a closed network: no sandbox (root), no background fetches.
CHROMIUM_FLAGS = (
    "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
    " --disable-background-networking --disable-component-update --disable-sync"
).split()
# No host but localhost resolves: the page must work with the network cut off.
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
# Pyodide's first load is 5-20 s; a build of a spec under a few seconds.
BROWSER_WAIT_S = 120


def read(spec: Path) -> tuple[str, str | None]:
    tuning = tuning_path(spec)
    return spec.read_text(encoding="utf-8"), tuning.read_text(encoding="utf-8") if tuning.is_file() else None


def cli_build(tmp_path: Path, monkeypatch, name: str, source: str):
    """`pallasgen build` in a fresh project holding specs/NAME.pallas."""
    (tmp_path / "pyproject.toml").write_text('[tool.pallasgen]\nspecs = "specs"\nout = "generated"\n')
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / f"{name}.pallas").write_text(source, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(main, ["build", "--no-cache"])


# What the worker runs, run here.


@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
def test_the_page_generates_each_bundled_spec_byte_identical_to_its_generated_module(spec):
    built = session.build(spec.stem, *read(spec))
    assert built == {"code": (ROOT / "generated" / f"{spec.stem}.py").read_text(encoding="utf-8"), "diagnostics": ""}


def test_a_spec_error_reads_exactly_as_the_cli_prints_it(tmp_path, monkeypatch):
    printed = cli_build(tmp_path, monkeypatch, "add_vectors", UNKNOWN_NAME_SPEC)
    assert printed.exit_code == 2
    built = session.build("add_vectors", UNKNOWN_NAME_SPEC)
    assert built["code"] == ""
    assert built["diagnostics"] + "\n" == printed.output
    assert "specs/add_vectors.pallas:4:13: error: " in built["diagnostics"]
    assert built["diagnostics"].endswith("\n        z = x + w\n                ^")


def test_an_edited_tuned_example_warns_of_its_stale_tuning_as_the_cli_does(tmp_path, monkeypatch):
    source, tuning = read(ROOT / "specs" / "add_vectors.pallas")
    edited = source.replace("z = x + y", "z = x * y")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "add_vectors.tuning.json").write_text(tuning, encoding="utf-8")
    printed = cli_build(tmp_path, monkeypatch, "add_vectors", edited)
    assert printed.exit_code == 0
    built = session.build("add_vectors", edited, tuning)
    assert built["diagnostics"] + "\n" == printed.stderr
    assert built["diagnostics"].startswith("warning: specs/add_vectors.tuning.json: 'add_vectors' changed since")
    assert built["code"] == (tmp_path / "generated" / "add_vectors.py").read_text(encoding="utf-8")


def test_the_tiling_is_the_svg_of_pallasgen_show(tmp_path, monkeypatch):
    spec = ROOT / "specs" / "matmul.pallas"
    kernels = [k for k in re.findall(r"^kernel (\w+)", spec.read_text(), re.M)]
    chosen = kernels[1]
    monkeypatch.chdir(ROOT)
    shown = CliRunner().invoke(main, ["show", f"specs/matmul.pallas:{chosen}", "--out", str(tmp_path / "k.svg")])
    assert shown.exit_code == 0, shown.output
    tiling = session.tiling("matmul", spec.read_text(encoding="utf-8"), chosen)
    assert tiling["kernels"] == kernels
    assert tiling["kernel"] == chosen
    assert tiling["svg"] == (tmp_path / "k.svg").read_text(encoding="utf-8")


def test_a_spec_with_errors_has_no_tiling():
    assert session.tiling("add_vectors", UNKNOWN_NAME_SPEC) == {"kernels": [], "kernel": None, "svg": ""}


def test_what_the_worker_runs_never_imports_jax():
    script = (
        "import sys; from pathlib import Path; from pallasgen.playground import session\n"
        f"spec = Path({str(ROOT / 'specs' / 'matmul.pallas')!r}).read_text()\n"
        "assert session.build('matmul', spec)['code']; assert session.tiling('matmul', spec)['svg']\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout == "[]\n"


def test_what_the_worker_runs_imports_without_multiprocessing():
    """Pyodide's Python has no `_multiprocessing`; the build path imports its process pool only to use it."""
    script = "import sys; sys.modules['_multiprocessing'] = None; import pallasgen.playground.session"
    subprocess.run([sys.executable, "-c", script], check=True)


# The command.


def test_without_npm_the_command_says_so_and_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    env = {"PATH": str(tmp_path / "empty"), "PALLASGEN_CACHE_DIR": str(tmp_path / "cache")}
    result = CliRunner().invoke(main, ["playground", "--out", str(tmp_path / "site")], env=env)
    assert result.exit_code == 2
    assert result.output.startswith("pallasgen: error: cannot build the playground: npm is not installed")
    assert "Traceback" not in result.output


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site, built once per session; skips where it cannot be built (no npm, no network)."""
    out = tmp_path_factory.mktemp("playground")
    try:
        build_site(out, ROOT / "specs", cache_dir() / "playground")
    except SiteError as error:
        pytest.skip(f"the playground cannot be built here: {error}")
    return out


def test_the_site_holds_the_page_pyodide_and_the_wheels(site):
    assert {p.name for p in site.iterdir()} == {*PAGE_FILES, "site.json", "pyodide", "wheels"}
    assert {p.name for p in (site / "pyodide").iterdir()} >= {"pyodide.js", "pyodide.asm.wasm", "python_stdlib.zip"}
    listed = json.loads((site / "site.json").read_text())["wheels"]
    assert sorted(f"wheels/{p.name}" for p in (site / "wheels").iterdir()) == listed
    distributions = {Path(w).name.split("-")[0].lower() for w in listed}
    assert distributions >= {"pallasgen", "lark", "jinja2", "markupsafe", "black", "click"}
    assert all(w.endswith("-py3-none-any.whl") for w in listed)


def test_the_wheels_hold_no_compiled_code(site):
    for wheel in (site / "wheels").iterdir():
        names = zipfile.ZipFile(wheel).namelist()
        assert not [n for n in names if n.endswith((".so", ".pyd"))], wheel.name


def test_the_page_and_worker_load_nothing_from_another_host(site):
    for name in PAGE_FILES:
        assert not re.search(r"(https?:)?//[\w.-]+\.\w", (site / name).read_text()), name


def test_the_examples_are_the_bundled_specs_with_their_tuning_files(site):
    examples = json.loads((site / "site.json").read_text())["examples"]
    assert list(examples) == [s.stem for s in SPECS]
    for spec in SPECS:
        source, tuning = read(spec)
        assert examples[spec.stem] == {"spec": source, "tuning": tuning}


# In a browser.


@pytest.fixture(scope="session")
def served(site):
    """The site on a localhost port, for the session."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/index.html"
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """Headless Chromium from the system's packages, which reaches no host but localhost;
    skips where it is absent."""
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip(f"{CHROMIUM} or {CHROMEDRIVER} is absent (Debian: apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, *OFFLINE, f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    yield driver
    driver.quit()


def open_page(browser, url: str) -> None:
    """A fresh load of `url` (going to a URL that differs only in its fragment would not reload)."""
    browser.get("about:blank")
    browser.get(url)


def text_of(browser, element_id: str) -> str:
    return browser.execute_script(f"return document.getElementById({element_id!r}).textContent")


def wait_for(browser, condition, what: str) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(browser, BROWSER_WAIT_S, poll_frequency=0.2).until(lambda _: condition())
    except TimeoutException:
        pytest.fail(f"{what}: not within {BROWSER_WAIT_S} s; status {text_of(browser, 'status')!r}")


def test_in_a_browser_each_bundled_example_generates_its_generated_module(browser, served):
    """In Pyodide, as the page runs it: every bundled spec, add_vectors first, gives its
    committed module byte for byte, with no diagnostics and a tiling picture."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_page(browser, served)
    examples = Select(browser.find_element(By.ID, "examples"))
    wait_for(browser, lambda: examples.options, "the examples list")
    assert [option.get_attribute("value") for option in examples.options] == [s.stem for s in SPECS]
    for name in ["add_vectors", *(s.stem for s in SPECS if s.stem != "add_vectors")]:
        examples.select_by_value(name)
        expected = (ROOT / "generated" / f"{name}.py").read_text(encoding="utf-8")
        wait_for(browser, lambda: text_of(browser, "code") == expected, f"generated/{name}.py in pre#code")
        assert text_of(browser, "diagnostics") == ""
        assert "<svg" in browser.execute_script("return document.getElementById('tiling').innerHTML")


def test_in_a_browser_an_unknown_name_shows_the_cli_diagnostic_with_its_caret(browser, served, tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By

    expected = session.build("spec", UNKNOWN_NAME_SPEC)["diagnostics"]
    open_page(browser, served + "#" + urlencode({"example": "add_vectors"}))
    spec = browser.find_element(By.ID, "spec")
    wait_for(browser, lambda: text_of(browser, "status").startswith("Built"), "the first build")
    spec.clear()
    spec.send_keys(UNKNOWN_NAME_SPEC)
    wait_for(browser, lambda: text_of(browser, "diagnostics") == expected, "the diagnostic in pre#diagnostics")
    assert text_of(browser, "code") == ""
    assert expected + "\n" == cli_build(tmp_path, monkeypatch, "spec", UNKNOWN_NAME_SPEC).output


def test_in_a_browser_a_link_opens_with_the_spec_in_its_fragment(browser, served):
    from selenium.webdriver.common.by import By

    linked = (ROOT / "specs" / "add_vectors.pallas").read_text().replace("add_vectors", "add_linked")
    open_page(browser, served + "#" + urlencode({"example": "add_vectors", "spec": linked}))
    assert browser.find_element(By.ID, "spec").get_property("value") == linked
    expected = session.build("spec", linked)["code"]  # an edited spec is the user's own file
    assert "def add_linked(" in expected
    wait_for(browser, lambda: text_of(browser, "code") == expected, "the linked spec's module in pre#code")
    link = browser.find_element(By.ID, "link").get_attribute("href")
    assert link.endswith("#" + urlencode({"example": "add_vectors", "spec": linked}))


def test_in_a_browser_a_link_followed_on_the_open_page_rebuilds_with_its_spec(browser, served):
    from selenium.webdriver.common.by import By

    open_page(browser, served)
    wait_for(browser, lambda: text_of(browser, "status").startswith("Built"), "the first build")
    linked = (ROOT / "specs" / "add_vectors.pallas").read_text().replace("add_vectors", "add_followed")
    browser.get(served + "#" + urlencode({"example": "add_vectors", "spec": linked}))
    expected = session.build("spec", linked)["code"]
    wait_for(browser, lambda: text_of(browser, "code") == expected, "the followed link's module in pre#code")
    assert browser.find_element(By.ID, "spec").get_property("value") == linked


def test_in_a_browser_a_spec_typed_over_an_example_is_built_as_the_users_own_file(browser, served):
    """add_vectors pasted over the first example (activations): built as specs/spec.pallas,
    with no tuning file (so no warning about activations' tuned kernels)."""
    from selenium.webdriver.common.by import By

    first = SPECS[0].stem
    open_page(browser, served)
    wait_for(browser, lambda: text_of(browser, "status").startswith("Built"), "the first build")
    assert browser.find_element(By.ID, "examples").get_property("value") == first
    pasted = (ROOT / "specs" / "add_vectors.pallas").read_text(encoding="utf-8")
    browser.execute_script(
        "const s = document.getElementById('spec'); s.value = arguments[0];" " s.dispatchEvent(new Event('input'))",
        pasted,
    )
    expected = session.build("spec", pasted)
    assert expected["code"].startswith("# Code generated by pallasgen from specs/spec.pallas.")
    wait_for(browser, lambda: text_of(browser, "code") == expected["code"], "the pasted spec's module")
    assert text_of(browser, "diagnostics") == ""
    # Back to the example's own text: built as the example again, with its tuning file.
    browser.execute_script(
        "const s = document.getElementById('spec'); s.value = arguments[0];" " s.dispatchEvent(new Event('input'))",
        SPECS[0].read_text(encoding="utf-8"),
    )
    module = (ROOT / "generated" / f"{first}.py").read_text(encoding="utf-8")
    wait_for(browser, lambda: text_of(browser, "code") == module, "the example's module")


@pytest.mark.parametrize("name", ["constructor", "__proto__", "toString", "nope"])
def test_in_a_browser_a_link_to_an_example_the_site_lacks_opens_the_first_example(browser, served, name):
    open_page(browser, served + "#" + urlencode({"example": name}))
    module = (ROOT / "generated" / f"{SPECS[0].stem}.py").read_text(encoding="utf-8")
    wait_for(browser, lambda: text_of(browser, "code") == module, "the first example's module")


def test_in_a_browser_superseded_rebuilds_are_dropped_and_the_latest_wins(browser, served):
    open_page(browser, served)
    wait_for(browser, lambda: text_of(browser, "status").startswith("Built"), "the first build")
    before = int(browser.execute_script("return document.getElementById('status').dataset.builds"))
    source = (ROOT / "specs" / "add_vectors.pallas").read_text(encoding="utf-8")
    variants = [source.replace("add_vectors", f"add_{n}") for n in range(20)]
    browser.execute_script(
        "for (const text of arguments[0]) { document.getElementById('spec').value = text; rebuild(); }", variants
    )
    expected = session.build("spec", variants[-1])["code"]
    wait_for(browser, lambda: text_of(browser, "code") == expected, "the last variant's module")
    after = int(browser.execute_script("return document.getElementById('status').dataset.builds"))
    assert after - before <= 3, f"{after - before} builds for 20 requests: superseded ones were not dropped"
