// Runs pallasgen's build path in Pyodide, off the page's thread. Everything it loads
// comes from this site: the Pyodide runtime under pyodide/, the wheels under wheels/.
importScripts("pyodide/pyodide.js");

const here = (path) => new URL(path, self.location).href;
let ready = null;

async function start() {
  const site = await (await fetch(here("site.json"))).json();
  self.postMessage({ type: "status", text: "Loading Pyodide…" });
  const pyodide = await loadPyodide({ indexURL: here("pyodide/") });
  self.postMessage({ type: "status", text: `Installing ${site.wheels.length} wheels…` });
  // micropip is not in the pyodide npm package (Pyodide would fetch it from its CDN):
  // the wheels are unpacked into site-packages directly, which is all installing a pure wheel does.
  for (const wheel of site.wheels) {
    const data = new Uint8Array(await (await fetch(here(wheel))).arrayBuffer());
    pyodide.FS.writeFile("/tmp/wheel.whl", data);
    pyodide.runPython("import site, zipfile; zipfile.ZipFile('/tmp/wheel.whl').extractall(site.getsitepackages()[0])");
  }
  self.postMessage({ type: "status", text: "Importing pallasgen…" });
  pyodide.runPython("import importlib; importlib.invalidate_caches()");
  return pyodide.pyimport("pallasgen.playground.session");
}

self.onmessage = async (event) => {
  const { id, name, source, tuning, kernel } = event.data;
  try {
    ready = ready || start();
    const session = await ready;
    const started = performance.now();
    const built = session.build(name, source, tuning).toJs({ dict_converter: Object.fromEntries });
    const shown = session.tiling(name, source, kernel).toJs({ dict_converter: Object.fromEntries });
    self.postMessage({ type: "result", id, ...built, ...shown, ms: performance.now() - started });
  } catch (error) {
    self.postMessage({ type: "failure", id, text: String(error) });
  }
};
